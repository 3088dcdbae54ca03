# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""python3 -m kvctl.hf: generate with SmolLM2-135M through a kvctl daemon (generate_demo), or time
decode steps per attention mode (bench_decode). The cache itself is kvctl.hf_cache.KvctlCache.

Thread safety: one call at a time (each loads the model and owns its caches).
"""

import time
from typing import Sequence

import torch

from .hf_cache import KvctlCache
from .protocol import KvctlError


def generate_demo(endpoint: str, prompt: str, max_new_tokens: int, threads: int = 2) -> str:
    """Generates a greedy continuation of `prompt` with SmolLM2-135M through the daemon at
    `endpoint`; returns a report: the text, bits/element, memory against fp16, STATS."""
    from .client import parse_info
    from .model import load_smollm2

    torch.set_num_threads(threads)
    model, tok = load_smollm2()
    chat = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                   add_generation_prompt=True)
    ids = tok(chat, return_tensors="pt").input_ids
    t0 = time.perf_counter()
    with KvctlCache(model, endpoint, timeout_ms=60000) as cache:
        with torch.no_grad():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                 max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.eos_token_id, temperature=None, top_p=None,
                                 top_k=None)
        wall = time.perf_counter() - t0
        text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        snapshot = "\n".join(cache.stats_text(section=s).rstrip()
                             for s in ("server", "pool", "sequences", "policy", "quality"))
        seqs = parse_info(snapshot)["sequences"]
        q = cache.seqs[0].session.quant
        counters = dict(cache.counters)
    new = out.shape[1] - ids.shape[1]
    mem = int(seqs["kv_payload_bytes"]) / max(1, int(seqs["kv_fp16_equivalent_bytes"]))
    return "\n".join([
        "prompt: %s" % prompt,
        "continuation (%d tokens, greedy, %.1f s, %.0f ms/token incl. prefill):" % (
            new, wall, 1000 * wall / max(1, new)),
        text.strip(),
        "",
        "kvctl: quantizer %s k%d v%d, %d tokens in the daemon, %d quantized" % (
            q.method_name, q.k_bits, q.v_bits, int(seqs["tokens"]),
            int(seqs["tokens_quantized"])),
        "bits/element: %.3f (K and V, metadata, sinks and fp16 tail counted)" % float(
            seqs["bits_per_element"]),
        "memory vs fp16: %.3f (%d payload bytes vs %d for an fp16 cache; %.2fx smaller)" % (
            mem, int(seqs["kv_payload_bytes"]), int(seqs["kv_fp16_equivalent_bytes"]),
            1 / mem if mem else 0),
        "client: %d APPENDs (%.2f s), %d FETCHes (%.2f s)" % (
            counters["appends"], counters["append_s"], counters["fetches"],
            counters["fetch_s"]),
        "",
        "STATS snapshot:",
        snapshot,
    ])


def bench_decode(endpoint: str, prefill: int = 1024, steps: int = 128, threads: int = 1,
                 attentions: Sequence[str] = ("dense", "fused"), repeats: int = 2) -> str:
    """ms per decode step of SmolLM2-135M through the daemon at `endpoint`, per attention mode:
    a random-token prefill, then `steps` one-token forwards (teacher-forced), each mode run
    `repeats` times alternately (the best run is reported). Returns one line per mode."""
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
                t0 = time.perf_counter()
                for i in range(prefill, prefill + steps):
                    model(ids[:, i:i + 1], past_key_values=cache)
                ms = 1000 * (time.perf_counter() - t0) / steps
                c = cache.counters
                fetch_ms = 1000 * (c["fetch_s"] + c["block_fetch_s"]) / steps
            if attention not in best or ms < best[attention][0]:
                best[attention] = (ms, fetch_ms)
    return "\n".join("%s: %.1f ms/step (FETCH %.1f ms/step), prefill %d, %d steps, %d thread(s)"
                     % (a, best[a][0], best[a][1], prefill, steps, threads) for a in attentions)


def main(argv=None) -> int:
    """python3 -m kvctl.hf [--endpoint E] [--prompt P] [--max-new-tokens N] [--threads T]
    [--bench-decode PREFILL STEPS]"""
    import argparse
    import sys

    from .model import ModelNotFound
    from .protocol import Timeout

    ap = argparse.ArgumentParser(prog="python3 -m kvctl.hf",
                                 description="Generate with SmolLM2-135M through kvctl.")
    ap.add_argument("--endpoint", default="ipc:///tmp/kvctl.sock")
    ap.add_argument("--prompt", default="Explain in a few paragraphs why a KV cache makes "
                    "text generation with transformers faster, and what it costs in memory.")
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bench-decode", nargs=2, type=int, metavar=("PREFILL", "STEPS"),
                    help="time decode steps, attention dense vs fused, instead of generating")
    a = ap.parse_args(argv)
    try:
        if a.bench_decode:
            print(bench_decode(a.endpoint, a.bench_decode[0], a.bench_decode[1], a.threads))
        else:
            print(generate_demo(a.endpoint, a.prompt, a.max_new_tokens, a.threads))
    except ModelNotFound as e:
        print("kvctl.hf: %s" % e, file=sys.stderr)
        return 1
    except Timeout as e:
        print("kvctl.hf: no daemon answers at %s (%s); start build/bin/kvctl first"
              % (a.endpoint, e), file=sys.stderr)
        return 2
    except KvctlError as e:
        print("kvctl.hf: %s" % e, file=sys.stderr)
        return 2
    return 0
