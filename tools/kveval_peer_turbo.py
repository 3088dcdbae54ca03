# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_peer_turbo: a maintained PyPI TurboQuant (`turboquant` 0.2.0, TurboQuantCache, a drop-in
DynamicCache) on SmolLM2-135M, through kveval's pseudo-decode (tools/kveval.py, docs/quality.md),
as the peer rows `peer_turbo2/3/4` next to kvctl's `turbo2/3/4`.

    python3 tools/kveval_peer_turbo.py --tokens 2048 --out /tmp/peer    # b = 2, 3, 4
    python3 tools/kveval_peer_turbo.py --bits 3 --tokens 512 --gen-tokens 32

The reference is DynamicCache (what kveval's `uncompressed` row reproduces exactly); dPPL, KL and
top-1 are against it, greedy agreement against its generation. Memory is what the package stores:
b-bit codes are counted at b bits, as if packed (the package holds one uint8 per code: that figure
is in each row's note and `held_vs_fp16`), plus its fp32 norm per token and head (32 / head_dim
b/e), plus its fp16 residual window of the last 128 tokens at 16 bits. `run_row(evaluator, row)` runs one such row
inside kveval's Evaluator, for a harness that wants these rows in its own table (kveval_rows.py:
`peer_turbo_rows()`). Exit 0 ok; 1 bad input; 77 the package or model is missing.
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


def run_row(ev, row: Row) -> dict:
    """One peer_turbo row in kveval's Evaluator `ev` (teacher-forced, then greedy)."""
    make = make_cache_factory(row)
    ev.model.set_attn_implementation("sdpa")
    t0 = time.perf_counter()
    cache = make()
    scores = ev.teacher_forced(cache, 1)[0]
    seen = ev.args.ids.shape[1] - 1  # The last token is a target, never fed.
    residual = min(RESIDUAL, seen)
    quantized = seen - residual
    bits = (quantized * (row.nbits + 32.0 / ev.head_dim) + residual * 16.0) / seen
    held = (quantized * (8 + 32.0 / ev.head_dim) + residual * 16.0) / seen  # uint8 per code.
    gens = ev.greedy(make, 1)
    rec = {"row": row.name, "kind": row.kind, "batch": 1, "bits_per_element": bits,
           "memory_vs_fp16": bits / 16, "payload_vs_fp16": bits / 16, "tokens_quantized": quantized,
           "tokens_kept": seen, "tokens_seen": seen, "wall_s": time.perf_counter() - t0,
           "held_vs_fp16": held / 16,
           "note": ("%s %s TurboQuantCache(bits=%d), residual %d fp16 tokens; bits counted: "
                    "packed codes + fp32 norm per token and head (it holds one uint8 per code: "
                    "%.3f of fp16)" % (PACKAGE, PACKAGE_VERSION, row.nbits, residual,
                                       held / 16))}
    rec.update(scores.summary())
    rec["_gen"] = gens[0]
    ev.results.append(rec)
    print("kveval_peer_turbo: %s done in %.0f s" % (row.name, rec["wall_s"]), flush=True)
    return rec


def run_reference(ev) -> None:
    """DynamicCache rows: stores the reference log-probabilities and greedy tokens in `ev`."""
    from transformers import DynamicCache
    ev.model.set_attn_implementation("sdpa")
    t0 = time.perf_counter()
    scores = ev.teacher_forced(DynamicCache(), 1)[0]
    ev.ref_greedy = ev.greedy(DynamicCache, 1)[0]
    seen = ev.args.ids.shape[1] - 1
    rec = {"row": "uncompressed", "kind": "dynamic", "batch": 1, "bits_per_element": 16.0,
           "memory_vs_fp16": 1.0, "payload_vs_fp16": 1.0, "tokens_quantized": 0,
           "tokens_kept": seen, "tokens_seen": seen, "wall_s": time.perf_counter() - t0,
           "note": "transformers DynamicCache, the reference"}
    rec.update(scores.summary())
    rec["_gen"] = ev.ref_greedy
    ev.results.append(rec)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bits", default="2,3,4", help="comma-separated widths among 2, 3, 4")
    p.add_argument("--text", default=kveval.DEFAULT_TEXT)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--prefix", type=int, default=None, help="default half of --tokens")
    p.add_argument("--gen-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="write peer_turbo.json and peer_turbo.md here")
    args = p.parse_args(argv)
    args.prefix = args.prefix or args.tokens // 2
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
    ids = tok(text, return_tensors="pt").input_ids
    if ids.shape[1] < args.tokens:
        raise EvalError("--text: %s has %d tokens, expected at least %d (--tokens)"
                        % (args.text, ids.shape[1], args.tokens))
    args.ids = ids[:, :args.tokens]
    chat = tok.apply_chat_template([{"role": "user", "content": kveval.PROMPT}], tokenize=False,
                                   add_generation_prompt=True)
    args.prompt_ids = tok(chat, return_tensors="pt").input_ids
    ev = kveval.Evaluator(args, torch, model, tok, kvctl)
    t0 = time.perf_counter()
    run_reference(ev)
    for b in widths:
        run_row(ev, known[b])
    results = ev.finish()
    cmd = " ".join(["python3 tools/kveval_peer_turbo.py"] + (argv if argv is not None
                                                              else sys.argv[1:]))
    md = ["| row | b/e | mem vs fp16 | PPL | dPPL % | KL | top-1 | greedy | first div |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        md.append("| %s | %.3f | %.3f | %.3f | %+.2f | %.4f | %.3f | %.3f | %d |"
                  % (r["row"], r["bits_per_element"], r["memory_vs_fp16"], r["ppl"],
                     r["dppl_pct"], r["kl_mean"], r["top1_agree"], r["greedy_agree"],
                     r["greedy_first_div"]))
    print("\n".join(md))
    print("kveval_peer_turbo: %d tokens of %s, prefix %d, %d generated, %.0f s; command: %s"
          % (args.tokens, args.text, args.prefix, args.gen_tokens, time.perf_counter() - t0, cmd))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "peer_turbo.json"), "w") as f:
            json.dump({"command": cmd, "rows": results}, f, indent=1)
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
