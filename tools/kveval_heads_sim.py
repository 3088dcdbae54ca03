# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_heads_sim: would a few copying heads that keep every token rescue eviction at a tight
budget? An offline simulation in full precision, not the daemon (docs/quality.md, "Copying heads
that keep everything").

The 1/8 rows lose most where the scored text copies from tokens the prefill's eviction dropped in
the very (layer, KV head) pairs that later read them ("Which tokens the failing segments need").
If those pairs are a property of the model, a few of them could keep every token and the others
pay for it. This checks that idea before any daemon change:

1. Copy scores per (layer, KV head) on a calibration text (--calib-text, Apache-2.0 by default,
   never an evaluated text), as python -m kvctl.copy_heads computes them (python/kvctl/
   copy_heads.py): at every copy event, a position t whose token and next token also occur, in
   that order, at some earlier s and s + 1, the attention of t's queries (mean over the KV head's
   query heads) on those s + 1 (what an induction head reads), averaged over the events.
2. Per segment of the evaluated text (kveval's segmentation), each variant keeps, in every pair,
   4 sinks, the 32 newest prefix tokens and the top of the last 32 prefix queries' max-pooled
   attention (kernel 7), as tools/kveval_needed_sim.py does. `uniform` keeps --keep of the prefix
   in every pair; `copyR` lets the R pairs with the highest copy scores keep the whole prefix and
   gives the others what is left of the same total. The scored positions are then stepped with
   attention masked to each kept set (tokens appended after the prefill are all kept; no
   quantization, no compressions during the steps) and dPPL against the unmasked model is printed.

    nice -n 10 python3 tools/kveval_heads_sim.py --text /usr/share/perl/5.36/pod/perldiag.pod \\
        --label perldiag --keep 0.47 --copy-heads 0,4,9 --out results/e43-heads
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kveval  # noqa: E402
import kveval_needed_sim as sim  # noqa: E402
from kvctl import copy_heads  # noqa: E402

SINKS = 4
WINDOW = 32
KERNEL = 7


def kept_sets(obs, keep_frac: float, copy_heads: int, order: np.ndarray):
    """[L, H, prefix] bool for `copy_heads` whole pairs (by `order`) and an equal total."""
    L, H, _, prefix = obs.shape
    total = int(round(keep_frac * prefix)) * L * H
    whole = order[:copy_heads]
    rest = max(SINKS + WINDOW, (total - copy_heads * prefix) // max(1, L * H - copy_heads))
    kept = sim.simulated_keep(obs, WINDOW, KERNEL, rest, SINKS)
    for flat in whole:
        kept[flat // H, flat % H] = True
    return kept, rest


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--calib-text", default=kveval.DEFAULT_CALIB_TEXT)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--scored", type=int, default=128)
    p.add_argument("--seg", default="", help="segment indices, comma-separated (default: all)")
    p.add_argument("--keep", type=float, default=0.47, help="kept share of the prefix per pair")
    p.add_argument("--copy-heads", default="0,4,9", help="R values, comma-separated")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    if os.path.realpath(kveval.text_path(a.text)) == os.path.realpath(
            kveval.text_path(a.calib_text)):
        print("kveval_heads_sim: --calib-text must differ from --text", file=sys.stderr)
        return 1
    import torch
    from kvctl.model import load_smollm2
    torch.set_num_threads(1)
    sim.register()
    model, tok = load_smollm2()
    os.makedirs(a.out, exist_ok=True)
    calib_ids = np.array(tok(kveval.read_text("--calib-text", a.calib_text))["input_ids"])
    calib_ids = calib_ids[:min(len(calib_ids), a.tokens)]
    t0 = time.perf_counter()
    scores, n_events = copy_heads.copy_scores(model, calib_ids)
    order = np.argsort(-scores.ravel())
    H = scores.shape[1]
    print("kveval_heads_sim: copy scores from %d events of %s in %.0f s; top pairs (layer, head, "
          "score): %s" % (n_events, a.calib_text, time.perf_counter() - t0,
                          ", ".join("(%d, %d, %.3f)" % (f // H, f % H, scores.ravel()[f])
                                    for f in order[:12])), flush=True)
    args = argparse.Namespace(tokens=a.tokens, segments=a.segments, prompt_tokens=a.tokens)
    kveval.prepare_inputs(args, tok, kveval.read_text("--text", a.text))
    rs = [int(r) for r in a.copy_heads.split(",")]
    picked = [int(s) for s in a.seg.split(",")] if a.seg else range(a.segments)
    results = {"text": a.text, "calib_text": a.calib_text, "keep": a.keep, "tokens": a.tokens,
               "scored": a.scored, "copy_scores": scores.round(5).tolist(), "segments": {}}
    for si in picked:
        seg = args.segments[si]
        total = seg.shape[1]
        prefix = total - a.scored - 1
        ones = np.ones((scores.shape[0], H, total), bool)
        ref = sim.masked_nll(torch, model, seg, prefix, a.scored, lambda i: ones)
        obs = sim.obs_attention(torch, model, seg, prefix, WINDOW)
        row = {"ref_nll": ref.tolist()}
        for r in rs:
            kept, rest = kept_sets(obs, a.keep, r, order)
            full = ones.copy()
            full[:, :, :prefix] = kept
            nll = sim.masked_nll(torch, model, seg, prefix, a.scored, lambda i: full)
            d = 100 * (np.exp(nll.mean() - ref.mean()) - 1)
            row["copy%d" % r] = {"nll": nll.tolist(), "others_keep": rest,
                                 "kept_share": float(kept.mean())}
            print("kveval_heads_sim: %s segment %d, %d copying pairs whole, the others %d of %d: "
                  "kept %.3f of the prefix, dPPL %+.2f %%" % (a.label, si, r, rest, prefix,
                                                              kept.mean(), d), flush=True)
        results["segments"][str(si)] = row
        with open(os.path.join(a.out, "%s-%d.json" % (a.label, a.tokens)), "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
