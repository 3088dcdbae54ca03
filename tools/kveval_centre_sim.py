# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_centre_sim: does subtracting each (layer, KV head)'s mean key and value before
TurboQuant, and adding it back after, buy quality at the same bits? And which scale should K and V
rows store? An offline simulation in the model, not the daemon (docs/quality.md, "Centring K and V
before TurboQuant", "An unbiased scale for TurboQuant's V").

A per-stream mean costs one fp16 row per (layer, head), nothing per token, and gives the
quantizer a row of smaller norm: on SmolLM2's prefix keys the mean holds about half of the
energy, so the relative squared error of the codes halves. Whether attention gains is what this
measures. Per segment of kveval's segmentation (--tokens, --segments, --scored), the model
prefills the prefix in full precision once; per variant every prefix K / V row is replaced by the
stand-in TurboQuant quantize-dequantize of tools/kveval_demote_sim.py (turbo_qdq), after the
centring the variant asks for; the scored positions are then stepped one by one over that cache
(appended tokens full precision, nothing evicted). NLL per position against the unquantized path.

Variants (--variants, ';'-separated) 'K/V[:c|:ck][:uk][:uv][:sS]': K and V bits (2-4); ':c' centres
K and V on their mean over prefix tokens [4, prefix) (rounded to fp16, added back after), ':ck'
only K; ':uk' / ':uv' give K / V rows the unbiased scale |x|^2 / (y . c) instead of the least-squares
one (docs/algorithms.md §20.3; the daemon's kTurbo is '...:uv'); ':sS' keeps the first S tokens
exact (sinks). Also printed per segment: the centred share of the
energy and the relative squared error of the codes with and without centring.

    nice -n 10 python3 tools/kveval_centre_sim.py --text prose --label prose --seg 0,1,2,3 \\
        --variants '4/3:s4;4/3:c:s4;2/2:s4;2/2:c:s4' --out results/q28-centre
    python3 tools/kveval_centre_sim.py --report results/q28-centre/prose.json --pair 4/3:s4
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kveval_demote_sim as ds  # noqa: E402

MEAN_FROM = 4  # The first tokens (the attention sink among them) are left out of the mean.


def parse_variant(spec: str) -> dict:
    """'4/3:c:s4' -> {'name', 'k_bits', 'v_bits', 'centre_k', 'centre_v', 'unbiased_k',
    'unbiased_v', 'sinks'}."""
    parts = spec.split(":")
    try:
        k_bits, v_bits = (int(x) for x in parts[0].split("/"))
    except ValueError:
        raise ValueError("variant %r: expected K/V bits first, e.g. 4/3" % spec) from None
    if not (2 <= k_bits <= 4 and 2 <= v_bits <= 4):
        raise ValueError("variant %r: bits must be 2-4" % spec)
    v = {"name": spec, "k_bits": k_bits, "v_bits": v_bits, "centre_k": False, "centre_v": False,
         "unbiased_k": False, "unbiased_v": False, "sinks": 0}
    for p in parts[1:]:
        if p == "c":
            v["centre_k"] = v["centre_v"] = True
        elif p == "ck":
            v["centre_k"] = True
        elif p in ("uk", "uv"):
            v["unbiased_" + p[1]] = True
        elif p.startswith("s") and p[1:].isdigit():
            v["sinks"] = int(p[1:])
        else:
            raise ValueError("variant %r: unknown part %r (c, ck, uk, uv or sS)" % (spec, p))
    return v


def stream_mean(x: np.ndarray) -> np.ndarray:
    """[L, H, 1, d] mean of x [L, H, T, d] over tokens MEAN_FROM.., rounded to fp16."""
    return x[:, :, MEAN_FROM:].mean(2, keepdims=True).astype(np.float16).astype(x.dtype)


def centred_qdq(x: np.ndarray, bits: int, centre: bool, sinks: int,
                unbiased: bool = False) -> np.ndarray:
    """turbo_qdq of x - mean (plus the mean back) or of x; the first `sinks` tokens exact."""
    m = stream_mean(x) if centre else np.zeros_like(x[:, :, :1])
    out = ds.turbo_qdq(x - m, bits, unbiased) + m
    out[:, :, :sinks] = x[:, :, :sinks]
    return out


def rel_error(x: np.ndarray, y: np.ndarray) -> float:
    return float(((y - x) ** 2).sum() / (x ** 2).sum())


def run_segment(torch, model, ids, scored: int, variants):
    from transformers import DynamicCache
    prefix = ids.shape[1] - scored - 1
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        model(ids[:, :prefix], past_key_values=cache, use_cache=True,
              position_ids=torch.arange(prefix)[None], logits_to_keep=1)
    k0 = np.stack([ly.keys[0].numpy() for ly in cache.layers])   # [L, H, prefix, d]
    v0 = np.stack([ly.values[0].numpy() for ly in cache.layers])
    for name, x in (("K", k0), ("V", v0)):
        tail = x[:, :, MEAN_FROM:]
        share = ((tail - stream_mean(x)) ** 2).sum((2, 3)) / (tail ** 2).sum((2, 3))
        errs = ", ".join("%d bits %.4f -> %.4f" % (
            b, rel_error(x, centred_qdq(x, b, False, 0)), rel_error(x, centred_qdq(x, b, True, 0)))
            for b in (2, 3, 4))
        print("  %s: centred energy share median %.3f (min %.3f, max %.3f); rel. error %s" % (
            name, np.median(share), share.min(), share.max(), errs), flush=True)
    kept = np.ones(k0.shape[:3], bool)
    out = {"fp": ds.step_nll(torch, model, cache, ids, prefix, scored, k0, v0, kept)}
    for v in variants:
        t0 = time.perf_counter()
        k = centred_qdq(k0, v["k_bits"], v["centre_k"], v["sinks"], v["unbiased_k"])
        vv = centred_qdq(v0, v["v_bits"], v["centre_v"], v["sinks"], v["unbiased_v"])
        out[v["name"]] = ds.step_nll(torch, model, cache, ids, prefix, scored, k, vv, kept)
        print("  %-12s %.1f s" % (v["name"], time.perf_counter() - t0), flush=True)
    return out


def report(paths, pair: str) -> str:
    """Markdown rows: variant, dPPL per segment, pooled, paired against `pair` (block bootstrap)."""
    return ds.report_table(paths, pair, [])


def main(argv=None) -> int:
    p = ds.segment_parser(__doc__.split("\n")[0], "4/3:s4")
    p.add_argument("--variants", default="4/3:s4;4/3:c:s4")
    a = ds.parse_or_report(p, argv, report)
    if a is None:
        return 0
    try:
        variants = [parse_variant(s) for s in a.variants.split(";")]
    except ValueError as e:
        p.error(str(e))
    return ds.run_segments(
        a, variants, lambda torch, model, ids: run_segment(torch, model, ids, a.scored, variants),
        lambda paths: report(paths, a.pair))


if __name__ == "__main__":
    sys.exit(main())
