# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_demote_sim: at equal memory, is it better to drop the prefix tokens eviction removes or
to keep them at 1-2 bits ("demote") with a smaller high-precision kept set? An offline simulation
in the model, not the daemon (docs/quality.md, "Dropping or demoting the evicted tokens at 1/8").

Per segment of kveval's segmentation (--tokens, --segments, --scored): the model prefills the
prefix in full precision once; each (layer, KV head) ranks the prefix tokens with the proxy
scorer of tools/kveval_needed_sim.py (the last W prefix queries' attention, mean over the group and
the queries, max-pooled with --kernel; 4 sinks and the W newest protected). Per variant the
cache's prefix K / V rows are replaced: the top f_hi tokens by a TurboQuant-like
quantize-dequantize at --hi-bits (K,V; "fp" leaves them as they are), the next f_lo at the low
bits (K/V), and the rest masked out. Tokens appended after the prefill stay full precision and
nothing is compressed during the scored steps. NLL per scored position is compared with the same
path unmasked and unquantized (the "fp" reference).

The quantizer (turbo_qdq) is a stand-in for kvctl's kTurbo (docs/algorithms.md §20): random
signs (numpy seed, not kvctl's splitmix64 signs), orthonormal Walsh-Hadamard, Lloyd-Max codebook
of one coordinate of a uniform point on S^(d-1), least-squares scale rounded to fp16. Payload:
b + 16/d bits per element (d = head_dim; 0.25 b/e of scale at d = 64).

Variants (--variants, ';'-separated), each 'hi=F[,lo=G@B][,fp]': F the high-precision share of
the prefix (a number, or 'base' = --keep / prefix, or 'eq' = solved for equal memory with 'base'
at --hi-bits), G the demoted share (a number, 'rest' = every other prefix token, or 'eq'), B its
bits (K and V, or K/V as '2/1'); ',fp' leaves the high set unquantized. The reference 'fp' (no
mask, no quantization) always runs. Written: <out>/<label>.json (NLL per variant and segment); a
later run of the same variants and label adds its segments to it.

    nice -n 10 python3 tools/kveval_demote_sim.py --text prose --label prose --seg 0,1,2,3 \
        --variants 'hi=base;hi=eq,lo=rest@1' --out results/q18e-demote
    python3 tools/kveval_demote_sim.py --report results/q18e-demote/prose.json ...
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kveval_needed_sim as sim  # noqa: E402

SIGN_SEED = 0x7475726271756174 & 0xFFFFFFFF
HEAD_DIM = 64  # SmolLM2-135M's (576 / 9): the variants' memory needs it before the model loads.


# ---- the quantizer ----------------------------------------------------------------------------

def bits_per_element(bits: float, d: int) -> float:
    """Codes plus one fp16 scale per d-element row."""
    return bits + 16.0 / d


@functools.lru_cache(maxsize=None)
def hadamard(d: int) -> np.ndarray:
    """Orthonormal (and symmetric) Sylvester Walsh-Hadamard matrix of size d (a power of 2)."""
    h = np.ones((1, 1))
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    if h.shape[0] != d:
        raise ValueError("hadamard: d %d is not a power of 2" % d)
    return h / np.sqrt(d)


@functools.lru_cache(maxsize=None)
def signs(d: int) -> np.ndarray:
    return np.where(np.random.default_rng(SIGN_SEED).random(d) < 0.5, -1.0, 1.0)


@functools.lru_cache(maxsize=None)
def lloyd_max(d: int, bits: int, grid: int = 1 << 16, iters: int = 300):
    """(centroids, bounds) of the Lloyd-Max quantizer of f_d(x) ~ (1 - x^2)^((d - 3) / 2) on
    [-1, 1], antisymmetric; bounds are the 2^bits - 1 midpoints."""
    x = np.linspace(-1, 1, grid + 1)[1:-1]
    f = np.exp((d - 3) / 2.0 * np.log1p(-x * x))
    f /= f.sum()
    cdf = np.cumsum(f)
    n = 1 << bits
    c = np.interp((np.arange(n) + 0.5) / n, cdf, x)
    for _ in range(iters):
        t = (c[1:] + c[:-1]) / 2
        cell = np.searchsorted(t, x)
        c = np.bincount(cell, f * x, n) / np.maximum(np.bincount(cell, f, n), 1e-300)
    c = (c - c[::-1]) / 2
    return c, (c[1:] + c[:-1]) / 2


def turbo_qdq(x: np.ndarray, bits: int, unbiased: bool = False) -> np.ndarray:
    """Quantize-dequantize rows x[..., d]: y = H (s * x), codes of y / |x| on the codebook, the
    scale a in fp16, x_hat = s * H (a c[code]). a is the least-squares (y . c) / (c . c) (kTurbo's
    K rows), or with `unbiased` |x|^2 / (y . c) (its V rows: x . x_hat = |x|^2). Zero rows stay
    zero."""
    d = x.shape[-1]
    h, s = hadamard(d), signs(d)
    cent, bounds = lloyd_max(d, bits)
    y = (x.astype(np.float64) * s) @ h
    n = np.linalg.norm(x.astype(np.float64), axis=-1, keepdims=True)
    c = cent[np.searchsorted(bounds, y / np.where(n > 0, n, 1.0), side="left")]
    yc = (y * c).sum(-1, keepdims=True)
    if unbiased:
        a = np.where(yc > 0, n * n / np.where(yc > 0, yc, 1.0), 0.0)
    else:
        a = np.maximum(0.0, yc / (c * c).sum(-1, keepdims=True))
    a = a.astype(np.float16).astype(np.float64)
    return ((a * c) @ h * s).astype(x.dtype)


# ---- memory and the tiers ---------------------------------------------------------------------

def memory_vs_fp16(f_hi: float, f_lo: float, hi_bits, lo_bits, d: int) -> float:
    """Payload per prefix token relative to fp16 K and V: f_hi at hi_bits (K, V; None = fp16),
    f_lo at lo_bits (K, V)."""
    hi = 16.0 if hi_bits is None else sum(bits_per_element(b, d) for b in hi_bits) / 2
    lo = sum(bits_per_element(b, d) for b in lo_bits) / 2 if f_lo else 0.0
    return (f_hi * hi + f_lo * lo) / 16.0


def solve_equal(base: float, hi_bits, lo_bits, d: int, f_hi=None, f_lo=None) -> float:
    """The missing share (f_hi when f_hi is None, else f_lo) such that f_hi at hi_bits plus f_lo
    at lo_bits costs what `base` at hi_bits does. f_lo 'rest' is passed as f_lo = 1 - f_hi."""
    hi = memory_vs_fp16(1.0, 0.0, hi_bits, lo_bits, d)
    lo = memory_vs_fp16(0.0, 1.0, hi_bits, lo_bits, d)
    if f_hi is None:   # f_hi hi + (1 - f_hi) lo = base hi
        return (base * hi - lo) / (hi - lo)
    return (base - f_hi) * hi / lo


def rank(obs: np.ndarray, w: int, kernel: int, sinks: int = 4) -> np.ndarray:
    """[L, H, prefix] rank of each prefix token (0 = kept first): sinks, then the w newest, then
    the candidates by the pooled window score of kveval_needed_sim.simulated_keep (stable)."""
    L, H, _, prefix = obs.shape
    pooled = sim.pooled_window_score(obs, w, kernel)
    key = np.concatenate([pooled, np.full((L, H, w), 2.0)], -1)
    key[:, :, :sinks] = 3.0
    order = np.argsort(-key, -1, kind="stable")
    r = np.empty_like(order)
    np.put_along_axis(r, order, np.arange(prefix)[None, None], -1)
    return r


def tiers(r: np.ndarray, n_hi: int, n_lo: int):
    """(hi, lo) bool masks of the n_hi best-ranked tokens and the next n_lo."""
    return r < n_hi, (r >= n_hi) & (r < n_hi + n_lo)


def demote_rows(k, v, hi, lo, q):
    """New prefix K / V [L, H, prefix, d]: hi rows from q['hi_k'] / q['hi_v'] (quantized copies,
    or the rows themselves), lo rows from q['lo_k'] / q['lo_v'], others unchanged (masked out by
    the caller). Returns (k, v, kept) with kept = hi | lo."""
    h, lw = hi[..., None], lo[..., None]
    k2 = np.where(h, q["hi_k"], np.where(lw, q["lo_k"], k))
    v2 = np.where(h, q["hi_v"], np.where(lw, q["lo_v"], v))
    return k2, v2, hi | lo


# ---- variants ---------------------------------------------------------------------------------

def parse_variant(spec: str, base: float, hi_bits, d: int) -> dict:
    """'hi=F[,lo=G@B][,fp]' -> {name, f_hi, f_lo, lo_bits, hi_bits, mem} (shares of the prefix)."""
    parts = dict(p.split("=", 1) if "=" in p else (p, "") for p in spec.split(","))
    if set(parts) - {"hi", "lo", "fp"} or "hi" not in parts:
        raise ValueError("variant %r: expected hi=F[,lo=G@B][,fp]" % spec)
    hb = None if "fp" in parts else tuple(hi_bits)
    g, lo_bits = (parts["lo"].split("@") + [None])[:2] if "lo" in parts else ("0", None)
    if lo_bits:
        lo_bits = tuple(int(b) for b in lo_bits.split("/"))
        lo_bits = lo_bits * 2 if len(lo_bits) == 1 else lo_bits
    f = parts["hi"]
    if f == "eq":
        if g != "rest":
            raise ValueError("variant %r: hi=eq needs lo=rest@B" % spec)
        f_hi = solve_equal(base, hi_bits, lo_bits, d)
    else:
        f_hi = base if f == "base" else float(f)
    if g == "rest":
        f_lo = 1.0 - f_hi
    elif g == "eq":
        f_lo = solve_equal(base, hi_bits, lo_bits, d, f_hi=f_hi)
    else:
        f_lo = float(g)
    if not (0 < f_hi <= 1 and 0 <= f_lo <= 1 - f_hi + 1e-9) or (f_lo and lo_bits is None):
        raise ValueError("variant %r: shares %.3f + %.3f do not fit" % (spec, f_hi, f_lo))
    return {"name": spec, "f_hi": f_hi, "f_lo": min(f_lo, 1 - f_hi), "lo_bits": lo_bits,
            "hi_bits": hb, "mem": memory_vs_fp16(f_hi, f_lo, hb, lo_bits, d)}


# ---- the model --------------------------------------------------------------------------------

def _layers(cache):
    return [(ly.keys, ly.values) for ly in cache.layers]


def run_segment(torch, model, ids, scored: int, variants, w: int, kernel: int, keep: int):
    """{variant name: NLL list} for one segment (plus 'fp', the reference)."""
    from transformers import DynamicCache
    cfg = model.config
    prefix = ids.shape[1] - scored - 1
    obs = sim.obs_attention(torch, model, ids, prefix, w)
    r = rank(obs, w, kernel)
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        model(ids[:, :prefix], past_key_values=cache, use_cache=True,
              position_ids=torch.arange(prefix)[None], logits_to_keep=1)
    k0 = np.stack([k[0].numpy() for k, _ in _layers(cache)])   # [L, H, prefix, d]
    v0 = np.stack([v[0].numpy() for _, v in _layers(cache)])
    qcache = {}

    def qdq(which, bits):
        if (which, bits) not in qcache:
            qcache[which, bits] = turbo_qdq(k0 if which == "k" else v0, bits)
        return qcache[which, bits]

    out = {}
    for v in [{"name": "fp", "f_hi": 1.0, "f_lo": 0.0, "hi_bits": None, "lo_bits": None}] + \
            list(variants):
        n_hi = max(int(round(v["f_hi"] * prefix)), w + 4)
        n_lo = int(round(v["f_lo"] * prefix))
        hi, lo = tiers(r, n_hi, n_lo)
        q = {"hi_k": k0 if v["hi_bits"] is None else qdq("k", v["hi_bits"][0]),
             "hi_v": v0 if v["hi_bits"] is None else qdq("v", v["hi_bits"][1]),
             "lo_k": qdq("k", v["lo_bits"][0]) if n_lo else k0,
             "lo_v": qdq("v", v["lo_bits"][1]) if n_lo else v0}
        k2, v2, kept = demote_rows(k0, v0, hi, lo, q)
        t0 = time.perf_counter()
        out[v["name"]] = step_nll(torch, model, cache, ids, prefix, scored, k2, v2, kept)
        print("  %-22s hi %4d lo %4d of %d: %.1f s" % (v["name"], n_hi, n_lo, prefix,
                                                       time.perf_counter() - t0), flush=True)
    return out


def step_nll(torch, model, cache, ids, prefix: int, scored: int, k, v, kept):
    """Reset the cache's prefix to (k, v), mask the prefix to `kept`, step the scored positions."""
    cfg = model.config
    for li, ly in enumerate(cache.layers):
        ly.keys = torch.from_numpy(np.ascontiguousarray(k[li][None]))
        ly.values = torch.from_numpy(np.ascontiguousarray(v[li][None]))
    base = torch.where(torch.from_numpy(kept), 0.0, float("-inf"))   # [L, H, prefix]
    nll = []
    model.set_attn_implementation(sim.IMPL)
    with torch.no_grad():
        for i in range(scored):
            t = prefix + i
            for li in range(cfg.num_hidden_layers):
                sim._BIAS[li] = torch.cat([base[li], torch.zeros(base.shape[1], i + 1)],
                                          -1)[None, :, None, :]
            logits = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True,
                           position_ids=torch.full((1, 1), t)).logits[0, -1]
            nll.append(-float(torch.log_softmax(logits.float(), -1)[int(ids[0, t + 1])]))
    model.set_attn_implementation("sdpa")
    return nll


# ---- the report -------------------------------------------------------------------------------

def dppl(nll, ref) -> float:
    return 100.0 * np.expm1(np.mean(np.asarray(nll) - np.asarray(ref)))


def report(paths, pair: str) -> str:
    """Markdown rows: variant, memory vs fp16, dPPL per segment, pooled, paired against `pair`."""
    return report_table(paths, pair, [("f_hi", lambda v: "%.3f" % v["f_hi"]),
                                      ("f_lo", lambda v: "%.3f" % v["f_lo"]),
                                      ("mem vs fp16", lambda v: "%.4f" % v["mem"])])


def report_table(paths, pair: str, columns) -> str:
    """One table per result JSON: variant, the `columns` ((header, f(variant) -> text)), dPPL %
    per segment and pooled against the 'fp' reference, and paired against `pair` (paired_vs)."""
    lines = []
    for path in paths:
        with open(path) as f:
            res = json.load(f)
        segs = sorted(res["segments"], key=int)
        lines.append("%s (%s), segments %s; paired: variant NLL against %s's, 95 %% block "
                     "bootstrap" % (res["label"], os.path.basename(path), ",".join(segs), pair))
        lines.append("| variant | " + "".join("%s | " % h for h, _ in columns) + " | ".join(
            "seg %s" % s for s in segs) + " | pooled | vs %s |" % pair)
        lines.append("|---" * (3 + len(columns) + len(segs)) + "|")
        ref = [res["segments"][s]["fp"] for s in segs]
        for v in res["variants"]:
            nll = [res["segments"][s][v["name"]] for s in segs]
            lines.append("| %s | %s%s | %+.2f | %s |" % (
                v["name"], "".join("%s | " % f(v) for _, f in columns),
                " | ".join("%+.2f" % dppl(a, b) for a, b in zip(nll, ref)),
                dppl(sum(nll, []), sum(ref, [])), paired_vs(res, segs, v["name"], pair)))
        lines.append("")
    return "\n".join(lines)


def paired_vs(res: dict, segs, name: str, pair: str) -> str:
    """'+d [lo, hi]': dPPL % of variant `name` against `pair` on the same positions (kveval_stats'
    95 % block bootstrap), '-' for `pair` itself or where it did not run."""
    import kveval_stats
    if name == pair or not all(pair in res["segments"][s] for s in segs):
        return "-"
    nll = [res["segments"][s][name] for s in segs]
    base = [res["segments"][s][pair] for s in segs]
    ci = kveval_stats.bootstrap_ci(nll, base, [[0.0] * len(x) for x in nll])
    return "%+.2f [%+.2f, %+.2f]" % (ci["dppl_pct"], ci["dppl_lo"], ci["dppl_hi"])


def run_segments(a, variants, run_one, report_fn) -> int:
    """The model run shared by the offline simulations: loads SmolLM2 (1 torch thread), cuts
    kveval's segments of --text (--tokens, --segments), calls run_one(torch, model, ids) for each
    of --seg (a dict: variant name -> NLL list, 'fp' the reference) and keeps the results in
    <--out>/<--label>.json (a later run of the same variants adds its segments), then prints
    report_fn([path])."""
    import torch
    import kveval
    from kvctl.model import load_smollm2
    torch.set_num_threads(1)
    sim.register()
    model, tok = load_smollm2()
    args = argparse.Namespace(tokens=a.tokens, segments=a.segments, prompt_tokens=a.tokens)
    kveval.prepare_inputs(args, tok, kveval.read_text("--text", a.text))
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "%s.json" % a.label)
    res = {"label": a.label, "args": vars(a), "variants": variants, "segments": {}}
    if os.path.isfile(path):   # Add segments to an earlier run of the same variants.
        with open(path) as f:
            old = json.load(f)
        if [v["name"] for v in old["variants"]] != [v["name"] for v in variants]:
            print("%s holds other variants; choose another --label or --out" % path,
                  file=sys.stderr)
            return 1
        res["segments"] = old["segments"]
    for si in [int(x) for x in a.seg.split(",")]:
        t0 = time.perf_counter()
        print("%s segment %d:" % (a.label, si), flush=True)
        res["segments"][str(si)] = run_one(torch, model, args.segments[si])
        with open(path, "w") as f:
            json.dump(res, f)
        print("%s segment %d: %.0f s -> %s" % (a.label, si, time.perf_counter() - t0, path),
              flush=True)
    print(report_fn([path]))
    return 0


def segment_parser(description: str, pair: str) -> argparse.ArgumentParser:
    """The options every offline simulation shares: --report, --pair, --text, --label, --seg,
    kveval's segmentation (--tokens, --segments, --scored) and --out."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--report", nargs="+", help="print the table of these JSON files and exit")
    p.add_argument("--pair", default=pair, help="variant the others are paired against")
    p.add_argument("--text")
    p.add_argument("--label")
    p.add_argument("--seg", default="0", help="segment indices, comma-separated")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--scored", type=int, default=128)
    p.add_argument("--out")
    return p


def parse_or_report(p: argparse.ArgumentParser, argv, report_fn):
    """Parses argv; with --report prints report_fn(paths, pair) and returns None; else checks that
    a run has --text, --label and --out and returns the options."""
    a = p.parse_args(argv)
    if a.report:
        print(report_fn(a.report, a.pair))
        return None
    if not (a.text and a.label and a.out):
        p.error("--text, --label and --out are needed without --report")
    return a


def main(argv=None) -> int:
    p = segment_parser(__doc__.split("\n")[0], "hi=base")
    p.add_argument("--w", type=int, default=32, help="observation queries = protected window")
    p.add_argument("--kernel", type=int, default=7, help="max-pooling kernel of the score")
    p.add_argument("--keep", type=int, default=871,
                   help="the eviction arm's kept tokens per (layer, head) ('base'; 871 = what "
                   "evict_rkv_47_turbo_k4v3_f64_obs32_l60 held at the first scored step)")
    p.add_argument("--hi-bits", default="4,3", help="K,V bits of the high-precision set")
    p.add_argument("--variants", default="hi=base;hi=eq,lo=rest@1")
    a = parse_or_report(p, argv, report)
    if a is None:
        return 0
    d = HEAD_DIM
    prefix = a.tokens - a.scored - 1
    hi_bits = tuple(int(x) for x in a.hi_bits.split(","))
    variants = [parse_variant(s, a.keep / prefix, hi_bits, d) for s in a.variants.split(";")]
    return run_segments(
        a, variants,
        lambda torch, model, ids: run_segment(torch, model, ids, a.scored, variants, a.w,
                                              a.kernel, a.keep),
        lambda paths: report(paths, a.pair))


if __name__ == "__main__":
    sys.exit(main())
