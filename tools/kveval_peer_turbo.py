# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_peer_turbo: a maintained PyPI TurboQuant (`turboquant` 0.2.0, TurboQuantCache, a drop-in
DynamicCache) on SmolLM2-135M, through kveval's pseudo-decode (tools/kveval.py, docs/quality.md),
as the peer rows `peer_turbo2/3/4` next to kvctl's `turbo2/3/4`.

    python3 tools/kveval_peer_turbo.py --tokens 2048 --out /tmp/peer    # b = 2, 3, 4
    python3 tools/kveval_peer_turbo.py --bits 3 --tokens 512 --segments 1 --gen-tokens 32
    tools/kveval --rows kivi2,peer_turbo2 ...     # or as peer rows in kveval's own table

The reference is DynamicCache (what kveval's `uncompressed` row reproduces exactly); dPPL, KL and
top-1 are against it, greedy agreement against its generation. Memory is what the package stores:
b-bit codes are counted at b bits, as if packed (the package holds one uint8 per code: that figure
is in each row's note), plus its fp32 norm per token and head (32 / head_dim b/e), plus its fp16
residual window of the last 128 tokens at 16 bits. kveval runs the same rows itself (`--rows
peer_turbo2,...`, kind "turboquant" in Evaluator.run_peer); `run_row(evaluator, row)` does it
for another harness. Exit 0 ok; 1 bad input; 77 the package or model is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TQDM_DISABLE", "1")
TOOLS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TOOLS)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, TOOLS)
import kveval  # noqa: E402
from kveval_rows import EvalError, MissingStack, Row, peer_turbo_rows  # noqa: E402

PACKAGE = "turboquant"
PACKAGE_VERSION = "0.2.0"
RESIDUAL = 128  # TurboQuantCache's default residual_len: the last 128 tokens stay fp16.


def make_cache_factory(row: Row):
    import numpy as np
    # turboquant 0.2.0 builds its codebook with np.trapz, which numpy 2.4 (ours) no longer has;
    # np.trapezoid is the same function under its new name.
    if not hasattr(np, "trapz"):
        np.trapz = np.trapezoid
    try:
        from turboquant import TurboQuantCache
    except ImportError as e:
        raise MissingStack("missing Python package %s==%s (python/requirements-model.txt): %s"
                           % (PACKAGE, PACKAGE_VERSION, e)) from None

    def make():
        return TurboQuantCache(bits=row.nbits)
    return make


def turbo_bits(nbits: int, seen: int, head_dim: int) -> float:
    """b/e of TurboQuantCache after `seen` tokens: the last RESIDUAL in fp16, the rest as b-bit
    codes counted packed plus an fp32 norm per token and head."""
    residual = min(RESIDUAL, seen)
    return ((seen - residual) * (nbits + 32.0 / head_dim) + residual * 16.0) / seen


def run_row(ev, row: Row) -> dict:
    """One peer_turbo row in kveval's Evaluator `ev` (its segments, then greedy): kveval's own
    peer path (Evaluator.run_peer knows kind "turboquant")."""
    ev.run_peer(row)
    return ev.results[-1]


def run_reference(ev) -> None:
    """DynamicCache as the reference row: stores its log-probabilities and greedy tokens in `ev`
    (what kveval's lossless row reproduces)."""
    from transformers import DynamicCache
    ev.model.set_attn_implementation("sdpa")
    t0 = time.perf_counter()
    scores = ev.teacher_forced(DynamicCache, 1)[0]
    ev.ref_greedy = ev.greedy(DynamicCache, 1)[0] if ev.args.gen_tokens else []
    seen = int(ev.args.segments[-1].shape[1]) - 1
    rec = {"row": "uncompressed", "kind": "dynamic", "batch": 1, "bits_per_element": 16.0,
           "reserved_bits_per_element": None, "memory_vs_fp16": 1.0, "payload_vs_fp16": 1.0,
           "tokens_quantized": 0, "tokens_kept": seen, "tokens_seen": seen,
           "quant_onset_tokens": 0, "wall_s": time.perf_counter() - t0,
           "note": "transformers DynamicCache, the reference"}
    rec.update(scores)
    rec["gen"] = ev.ref_greedy
    ev.results.append(rec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bits", default="2,3,4", help="comma-separated widths among 2, 3, 4")
    p.add_argument("--text", default=kveval.DEFAULT_TEXT, help="a file or a kveval text label")
    p.add_argument("--tokens", type=int, default=2048, help="context length of each segment")
    p.add_argument("--segments", type=int, default=2)
    p.add_argument("--scored", type=int, default=128, help="scored positions per segment")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write peer_turbo.json and peer_turbo.md here")
    args = p.parse_args(argv)
    known = {r.nbits: r for r in peer_turbo_rows()}
    try:
        widths = [int(b) for b in args.bits.split(",") if b.strip()]
    except ValueError:
        raise EvalError("--bits: got %r, expected comma-separated widths among 2, 3, 4"
                        % args.bits) from None
    if not widths or any(b not in known for b in widths):
        raise EvalError("--bits: got %r, expected comma-separated widths among 2, 3, 4"
                        % args.bits)
    text = kveval.read_text("--text", args.text)
    import torch
    import kvctl
    from kvctl.model import ModelNotFound, load_smollm2
    make_cache_factory(known[widths[0]])  # Fails early, with exit 77, without the package.
    torch.set_num_threads(args.threads)
    print("kveval_peer_turbo: loading SmolLM2-135M ...", flush=True)
    try:
        model, tok = load_smollm2()
    except ModelNotFound as e:
        raise MissingStack(str(e)) from None
    kveval.prepare_inputs(args, tok, text)
    ev = kveval.Evaluator(args, torch, model, tok, kvctl)
    t0 = time.perf_counter()
    run_reference(ev)
    for b in widths:
        run_row(ev, known[b])
    results = ev.finish()
    cmd = " ".join(["python3 tools/kveval_peer_turbo.py"] + (argv if argv is not None
                                                              else sys.argv[1:]))
    md = ["| row | b/e | mem vs fp16 | PPL | dPPL % [95 % CI] | KL | top-1 | greedy (from) "
          "| first div |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        greedy = ("-" if r["greedy_agree"] is None
                  else "%.3f (%d)" % (r["greedy_agree"], r["greedy_from"]))
        md.append("| %s | %.3f | %.3f | %.3f | %+.2f [%+.2f, %+.2f] | %.4f | %.3f | %s | %s |"
                  % (r["row"], r["bits_per_element"], r["memory_vs_fp16"], r["ppl"],
                     r["dppl_pct"], r["dppl_lo"], r["dppl_hi"], r["kl_mean"], r["top1_agree"],
                     greedy, "-" if r["greedy_first_div"] is None else r["greedy_first_div"]))
    print("\n".join(md))
    print("kveval_peer_turbo: %d segments of %d tokens of %s, %d scored each, %d generated, "
          "%.0f s; command: %s" % (len(args.segment_starts), args.tokens, args.text, args.scored,
                                   args.gen_tokens, time.perf_counter() - t0, cmd))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "peer_turbo.json"), "w") as f:
            json.dump({"command": cmd, "rows": [{k: v for k, v in r.items()
                                                  if k not in ("nll", "kl", "top1")}
                                                 for r in results]}, f, indent=1)
        with open(os.path.join(args.out, "peer_turbo.md"), "w") as f:
            f.write("\n".join(md) + "\n\n`%s`\n" % cmd)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except MissingStack as e:
        print("kveval_peer_turbo: %s" % e, file=sys.stderr)
        sys.exit(77)
    except EvalError as e:
        print("kveval_peer_turbo: %s" % e, file=sys.stderr)
        sys.exit(1)
