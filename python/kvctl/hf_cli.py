# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""python3 -m kvctl.hf: generate with SmolLM2-135M through a kvctl daemon and compare with an
uncompressed cache (run_demo, the README's demo), or time decode steps per attention mode
(bench_decode). The cache itself is kvctl.hf_cache.KvctlCache.

The demo, in stages (one progress line each, seconds counted from $KVCTL_DEMO_T0 when set, as
tools/run.sh does, else from this process's start):
- the greedy continuation with the KV cache in the daemon, printed as it is generated;
- the same prompt and greedy settings with transformers' DynamicCache (float32, nothing
  compressed): the baseline;
- one teacher-forced forward of prompt + kvctl's continuation with the full cache: at each
  position of kvctl's continuation, the uncompressed model's next-token distribution against the
  one kvctl's cache gave (mean KL in nats, and how often both pick the same top-1 token);
- a summary: tokens, quantized tokens, bits/element, the sequence's reserved pool bytes and its
  payload against an fp16 cache of every token, baseline agreement, timings.

Thread safety: one call at a time (each owns the model's attention setting and its caches).
"""

import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Union

import torch

from .hf_cache import KvctlCache
from .protocol import KvctlError

_PROCESS_T0 = time.time()
DEFAULT_PROMPT = ("Explain in a few paragraphs why a KV cache makes text generation with "
                  "transformers faster, and what it costs in memory.")
STATS_SECTIONS = ("server", "pool", "sequences", "policy", "quality")


def log(message: str) -> None:
    """One progress line: seconds since $KVCTL_DEMO_T0 (tools/run.sh's start) or this process."""
    try:
        t0 = float(os.environ.get("KVCTL_DEMO_T0", ""))
    except ValueError:
        t0 = _PROCESS_T0
    print("[%6.1fs] kvctl.hf: %s" % (time.time() - t0, message), flush=True)


def _stats_fields(text: str, section: str) -> Dict[str, str]:
    """`field:value` lines of one `# Section` of the raw STATS text, values as text."""
    out: Dict[str, str] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("#"):
            current = line[1:].strip().lower()
        elif current == section and ":" in line:
            key, _, value = line.partition(":")
            out[key] = value.strip()
    return out


def sequence_stats(text: str, client_name: str, sequence_id: int) -> Dict[str, str]:
    """The `seq_<session>_<sequence>` line of the STATS text for this client name and sequence
    id, as {field: text}; {} when it is not there (more than limits.stats_max_lines lines)."""
    for key, value in _stats_fields(text, "sequences").items():
        if not key.startswith("seq_") or not key.endswith("_%d" % sequence_id):
            continue
        fields = dict(kv.split("=", 1) for kv in value.split(",") if "=" in kv)
        if fields.get("client") == client_name:
            return fields
    return {}


class _FirstToken:
    """A generate() streamer: prints the new text as it comes and notes when the first
    generated token arrived (generate's first put() is the prompt)."""

    def __init__(self, tok, echo: bool):
        from transformers import TextStreamer
        self.inner = TextStreamer(tok, skip_prompt=True, skip_special_tokens=True) if echo \
            else None
        self.puts = 0
        self.first_token_at: Optional[float] = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if self.inner is not None:
            self.inner.put(value)

    def end(self) -> None:
        if self.inner is not None:
            self.inner.end()


def _generate(model, tok, ids, max_new_tokens: int, cache, streamer=None):
    """Greedy generation; (sequences [1, P+N], logits [N, vocab] float32, seconds)."""
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                             max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.eos_token_id, temperature=None, top_p=None,
                             top_k=None, output_logits=True, return_dict_in_generate=True,
                             streamer=streamer)
    seconds = time.perf_counter() - t0
    return out.sequences, torch.cat(out.logits).float(), seconds


def compare(model, prompt_len: int, kv_sequence, kv_logits, base_sequence) -> Dict[str, object]:
    """kvctl's continuation against the baseline: the first position where the two greedy
    continuations differ (None when equal over the shorter), and along kvctl's continuation
    the uncompressed model's (one teacher-forced forward, full cache) next-token distribution
    against kvctl's: mean KL(full || kvctl) in nats, the fraction of positions whose top-1 token
    agree, and the perplexity of kvctl's tokens under the full model."""
    kv_new = kv_sequence[0, prompt_len:]
    base_new = base_sequence[0, prompt_len:]
    n = min(len(kv_new), len(base_new))
    differ = (kv_new[:n] != base_new[:n]).nonzero()
    first_divergence = int(differ[0, 0]) if len(differ) else None
    with torch.no_grad():
        full = model(kv_sequence, use_cache=False).logits[0, prompt_len - 1:-1].float()
    steps = min(full.shape[0], kv_logits.shape[0])
    full, mine = full[:steps], kv_logits[:steps]
    log_full = torch.log_softmax(full, dim=-1)
    log_mine = torch.log_softmax(mine, dim=-1)
    kl = (log_full.exp() * (log_full - log_mine)).sum(-1)
    nll = -log_full.gather(1, kv_new[:steps, None]).squeeze(1)
    return {
        "new_tokens": int(len(kv_new)),
        "baseline_new_tokens": int(len(base_new)),
        "first_divergence": first_divergence,
        "mean_kl": float(kl.mean()) if steps else 0.0,
        "top1_agreement": float((full.argmax(-1) == mine.argmax(-1)).float().mean())
        if steps else 1.0,
        "ppl_under_full": math.exp(float(nll.mean())) if steps else 1.0,
    }


def prompt_ids(tok, prompt: str) -> torch.Tensor:
    """The prompt as one chat turn of the user, with the assistant's turn opened: [1, P]."""
    chat = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True)
    return tok(chat, return_tensors="pt").input_ids


def baseline_generate(model, tok, ids, max_new_tokens: int):
    """The uncompressed run: (sequences, logits, seconds) with transformers' DynamicCache."""
    from transformers import DynamicCache
    return _generate(model, tok, ids, max_new_tokens, DynamicCache(config=model.config))


def run_demo(model, tok, endpoint: str, prompt: str = DEFAULT_PROMPT,
             max_new_tokens: int = 320, send_queries: bool = False,
             baseline: Union[bool, torch.Tensor] = True, echo: bool = True,
             progress: Callable[[str], None] = log) -> Dict[str, object]:
    """The demo on a loaded model: returns its figures (see format_summary) and the raw STATS
    text under "stats_text". send_queries: APPEND the query rows too (eviction policies that
    score with Q: h2o, snapkv, rkv). baseline: True runs it, False skips it and the quality
    figures, a tensor is a baseline_generate() sequence already made (one baseline for several
    daemons)."""
    ids = prompt_ids(tok, prompt)
    prompt_len = ids.shape[1]
    attn = model.config._attn_implementation
    client_name = "kvctl.hf-%d" % os.getpid()
    r: Dict[str, object] = {"prompt": prompt, "prompt_tokens": prompt_len}
    progress("generating through kvctl at %s: %d prompt tokens, up to %d new (greedy)%s"
             % (endpoint, prompt_len, max_new_tokens, ", queries sent" if send_queries else ""))
    streamer = _FirstToken(tok, echo)
    try:
        with KvctlCache(model, endpoint, timeout_ms=60000, send_q=send_queries,
                        client_name=client_name) as cache:
            t0, cpu0 = time.perf_counter(), time.process_time()
            seq, logits, seconds = _generate(model, tok, ids, max_new_tokens, cache, streamer)
            r["kv_cpu_seconds"] = time.process_time() - cpu0
            cache.sync()
            text = cache.stats_text()
            r["stats_text"] = "\n".join(cache.stats_text(section=s).rstrip()
                                        for s in STATS_SECTIONS)
            quant = cache.seqs[0].session.quant
            r["sequence"] = sequence_stats(text, client_name, cache.sequence_id)
            r["totals"] = _stats_fields(text, "sequences")
            r["policy"] = _stats_fields(text, "policy")
            r["counters"] = dict(cache.counters)
            geometry = (cache.n_layers, cache.kv_heads, cache.head_dim)
    finally:
        model.set_attn_implementation(attn)
    first = streamer.first_token_at
    r.update(kv_seconds=seconds, first_token_s=(first - t0) if first else None,
             method=quant.method_name, k_bits=quant.k_bits, v_bits=quant.v_bits,
             block_tokens=quant.block_tokens, sink_tokens=quant.sink_tokens,
             flush_tokens=quant.flush_tokens, geometry=geometry)
    r["generated"] = int(seq.shape[1] - prompt_len)
    r["text"] = tok.decode(seq[0, prompt_len:], skip_special_tokens=True)
    _memory(r, int(seq.shape[1]))
    progress("kvctl: %d new tokens in %.1f s, the first after %s (%.1f s of CPU in this "
             "process)" % (r["generated"], seconds, "?" if first is None
                           else "%.1f s" % r["first_token_s"], r["kv_cpu_seconds"]))
    if baseline is not False:
        if isinstance(baseline, torch.Tensor):
            base_seq, r["baseline_seconds"] = baseline, 0.0
        else:
            progress("baseline: the same prompt and greedy settings with DynamicCache "
                     "(uncompressed)")
            base_seq, _, r["baseline_seconds"] = baseline_generate(model, tok, ids,
                                                                   max_new_tokens)
        r["baseline_text"] = tok.decode(base_seq[0, prompt_len:], skip_special_tokens=True)
        progress("quality: scoring kvctl's continuation with the uncompressed model")
        r.update(compare(model, prompt_len, seq, logits, base_seq))
    return r


def _memory(r: Dict[str, object], tokens: int) -> None:
    """The sequence's memory figures: reserved pool bytes (its pages), payload (records and fp16
    rows) and an fp16 cache of every token seen. Payload comes from the sequence's own line
    when it carries one, else from the section totals when this is the only open sequence."""
    layers, heads, dim = r["geometry"]
    seq, totals = r["sequence"], r["totals"]
    r["tokens"] = int(seq.get("tokens", tokens))
    r["fp16_bytes"] = r["tokens"] * layers * heads * dim * 2 * 2
    r["reserved_bytes"] = int(seq["bytes"]) if "bytes" in seq else None
    payload = seq.get("payload_bytes")
    if payload is None and totals.get("sequences") == "1":
        payload = totals.get("kv_payload_bytes")
    r["payload_bytes"] = int(payload) if payload is not None else None
    only = totals.get("sequences") == "1"
    r["tokens_quantized"] = int(totals["tokens_quantized"]) if only else None
    r["bits_per_element"] = float(totals["bits_per_element"]) if only else None
    r["kept_rows"] = int(seq["kept_tokens"]) if "kept_tokens" in seq else None
    r["rows"] = r["tokens"] * layers * heads


def _mb(n: Optional[int]) -> str:
    return "n/a" if n is None else "%.2f MB" % (n / 1e6)


def format_summary(r: Dict[str, object]) -> str:
    """A few lines: what kvctl held, its memory against fp16, the baseline comparison, timings."""
    fp16 = r["fp16_bytes"]
    new = r["generated"]
    quant = "%s k%d v%d, %d-token blocks, %d fp16 sinks, flush every %d" % (
        r["method"], r["k_bits"], r["v_bits"], r["block_tokens"], r["sink_tokens"],
        r["flush_tokens"])
    held = "%d tokens held (%d prompt, %d generated)" % (r["tokens"], r["prompt_tokens"],
                                                          r["tokens"] - r["prompt_tokens"])
    if r["tokens_quantized"] is not None:
        held += ", %d quantized, %.2f bits/element" % (r["tokens_quantized"],
                                                        r["bits_per_element"])
    evict = str(r["policy"].get("evict_policy", "none"))
    if r["kept_rows"] is not None and r["kept_rows"] < r["rows"]:
        kept = 100.0 * r["kept_rows"] / r["rows"]
        held += "; %s eviction kept %.0f %% of the token rows" % (evict, kept)

    def vs(n):
        return "n/a" if n is None else "%s = %.3f x fp16" % (_mb(n), n / fp16)

    lines = ["summary:",
             "  kvctl:    %s; %s" % (quant, held),
             "  memory:   fp16 cache %s; pool pages reserved %s; payload %s" % (
                 _mb(fp16), vs(r["reserved_bytes"]), vs(r["payload_bytes"]))]
    c = r["counters"]
    timing = "kvctl %.1f s (%.0f ms/token%s; APPEND %.1f s, FETCH %.1f s)" % (
        r["kv_seconds"], 1000 * r["kv_seconds"] / max(1, new),
        "" if r["first_token_s"] is None else ", first token %.1f s" % r["first_token_s"],
        c["append_s"], c["fetch_s"])
    if "first_divergence" in r:
        d = r["first_divergence"]
        same = ("identical to it over all %d tokens" % min(new, r["baseline_new_tokens"])
                if d is None else "identical for the first %d tokens, then differs" % d)
        lines.append("  baseline: DynamicCache, float32, same greedy settings: kvctl's "
                     "continuation is %s" % same)
        lines.append("  quality:  along kvctl's %d tokens the uncompressed model picks the same "
                     "top-1 token at %.1f %%, mean KL %.4f nats/token, perplexity %.3f" % (
                         new, 100 * r["top1_agreement"], r["mean_kl"], r["ppl_under_full"]))
        timing += ", baseline %.1f s" % r["baseline_seconds"]
    if "load_s" in r:
        timing = "model load %.1f s, " % r["load_s"] + timing
    lines.append("  time:     " + timing)
    return "\n".join(lines)


def explain(error: Exception, send_queries: bool) -> str:
    """The daemon's error, with the flag to add when OPEN was refused for lack of queries."""
    if not send_queries and "q_heads" in str(error):
        return ("%s (this daemon's eviction policy scores tokens with the queries: run with "
                "--send-queries)" % error)
    return str(error)


def process_cpu_seconds(pid: int) -> Optional[float]:
    """CPU time so far of every live thread of process `pid`, from Linux's per-thread schedstat
    (nanoseconds, unlike the 10 ms ticks of /proc/PID/stat); None when the process cannot be
    read (another machine, another user, no schedstat)."""
    try:
        tasks = os.listdir("/proc/%d/task" % pid)
    except OSError:
        return None
    total_ns, read = 0, 0
    for task in tasks:
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, task)) as f:
                total_ns += int(f.read().split()[0])
            read += 1
        except (OSError, ValueError, IndexError):
            continue  # A thread that ended meanwhile.
    return total_ns / 1e9 if read else None


def bench_decode(endpoint: str, prefill: int = 1024, steps: int = 128, threads: int = 1,
                 attentions: Sequence[str] = ("dense", "fused"), repeats: int = 2) -> str:
    """ms per decode step of SmolLM2-135M through the daemon at `endpoint`, per attention mode:
    a random-token prefill, then `steps` one-token forwards (teacher-forced), each mode run
    `repeats` times alternately (the best run is reported). Returns one line per mode, with the
    daemon's CPU time per step (all its threads, read from /proc through the pid STATS reports)
    as a share of the engine's step when the daemon runs on this machine."""
    from .model import load_smollm2

    torch.set_num_threads(threads)
    model, _ = load_smollm2()
    ids = torch.randint(100, 40000, (1, prefill + steps),
                        generator=torch.Generator().manual_seed(0))
    best = {}
    for _ in range(repeats):
        for attention in attentions:
            with KvctlCache(model, endpoint, attention=attention, timeout_ms=60000) as cache, \
                    torch.no_grad():
                model(ids[:, :prefill], past_key_values=cache)
                pid = int(_stats_fields(cache.stats_text(), "server").get("pid", "0"))
                cpu0 = process_cpu_seconds(pid)
                t0 = time.perf_counter()
                for i in range(prefill, prefill + steps):
                    model(ids[:, i:i + 1], past_key_values=cache)
                ms = 1000 * (time.perf_counter() - t0) / steps
                cpu1 = process_cpu_seconds(pid)
                c = cache.counters
                fetch_ms = 1000 * (c["fetch_s"] + c["block_fetch_s"]) / steps
            daemon_ms = None if cpu0 is None or cpu1 is None else 1000 * (cpu1 - cpu0) / steps
            if attention not in best or ms < best[attention][0]:
                best[attention] = (ms, fetch_ms, daemon_ms)

    def line(a: str) -> str:
        ms, fetch_ms, daemon_ms = best[a]
        cpu = ("daemon CPU %.2f ms/step = %.1f%% of the step" % (daemon_ms, 100 * daemon_ms / ms)
               if daemon_ms is not None else "daemon CPU not readable")
        return ("%s: %.1f ms/step (FETCH %.1f ms/step, %s), prefill %d, %d steps, %d thread(s)"
                % (a, ms, fetch_ms, cpu, prefill, steps, threads))
    return "\n".join(line(a) for a in attentions)


def main(argv: Optional[List[str]] = None) -> int:
    """python3 -m kvctl.hf [--endpoint E] [--prompt P] [--max-new-tokens N] [--threads T]
    [--send-queries] [--no-baseline] [--stats] [--bench-decode PREFILL STEPS]"""
    import argparse

    from .model import ModelNotFound, load_smollm2
    from .protocol import ServerError, Timeout

    ap = argparse.ArgumentParser(
        prog="python3 -m kvctl.hf",
        description="Generate with SmolLM2-135M through kvctl and compare with an uncompressed "
                    "cache.")
    ap.add_argument("--endpoint", default="ipc:///tmp/kvctl.sock")
    ap.add_argument("--prompt", default=DEFAULT_PROMPT)
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    ap.add_argument("--send-queries", action="store_true",
                    help="APPEND the query rows too: needed by eviction policies that score with "
                         "Q (evict.policy h2o, snapkv, rkv)")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the uncompressed baseline run and the quality figures")
    ap.add_argument("--stats", action="store_true", help="also print the raw STATS snapshot")
    ap.add_argument("--bench-decode", nargs=2, type=int, metavar=("PREFILL", "STEPS"),
                    help="time decode steps, attention dense vs fused, instead of generating")
    a = ap.parse_args(argv)
    try:
        if a.bench_decode:
            print(bench_decode(a.endpoint, a.bench_decode[0], a.bench_decode[1], a.threads))
            return 0
        torch.set_num_threads(a.threads)
        log("python: torch and transformers imported (%.1f s of CPU)" % time.process_time())
        log("model: loading SmolLM2-135M-Instruct (Q4_1 GGUF dequantized to float32), %d "
            "torch threads" % a.threads)
        t0, cpu0 = time.perf_counter(), time.process_time()
        model, tok = load_smollm2()
        load_s = time.perf_counter() - t0
        log("model: loaded from %s in %.1f s (%.1f s of CPU)" % (
            "the GGUF file" if getattr(model, "kvctl_loaded_from", "") == "gguf"
            else "the converted copy in the cache folder", load_s, time.process_time() - cpu0))
        r = run_demo(model, tok, a.endpoint, a.prompt, a.max_new_tokens, a.send_queries,
                     baseline=not a.no_baseline)
        r["load_s"] = load_s
    except ModelNotFound as e:
        print("kvctl.hf: %s" % e, file=sys.stderr)
        return 1
    except Timeout as e:
        print("kvctl.hf: no daemon answers at %s (%s); start build/bin/kvctl first"
              % (a.endpoint, e), file=sys.stderr)
        return 2
    except ServerError as e:
        print("kvctl.hf: %s" % explain(e, a.send_queries), file=sys.stderr)
        return 2
    except KvctlError as e:
        print("kvctl.hf: %s" % e, file=sys.stderr)
        return 2
    print()
    print(format_summary(r))
    if a.stats:
        print("\nSTATS snapshot:\n" + r["stats_text"])
    return 0
