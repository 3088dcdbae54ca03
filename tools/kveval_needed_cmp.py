# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_needed_cmp: two tools/kveval_needed.py files of the same segment (a row and a variant)
compared on the first one's 16 worst steps: the attention mass each lost, the share of strong
links (> 0.05, between the 4 sinks and the 32-token window) each held, the loss on those steps,
and for the 8 positions carrying most of the first row's lost attention, how many of the links
that need them each held.

    python3 tools/kveval_needed_cmp.py results/q18d-needed/prose-seg0.npz OTHER/prose-seg0.npz
"""
import sys

import numpy as np


def main(argv) -> int:
    if len(argv) != 2:
        print("usage: kveval_needed_cmp.py ROW.npz VARIANT.npz", file=sys.stderr)
        return 1
    a, b = np.load(argv[0]), np.load(argv[1])
    if not np.array_equal(a["ids"], b["ids"]):
        print("kveval_needed_cmp: the two files hold different segments", file=sys.stderr)
        return 1
    att = a["att"].astype(np.float32)
    ha, hb = a["held"], b["held"]
    scored, _, _, total = att.shape
    cand = total - scored - 1 - 32
    da, db = a["row_nll"] - a["ref_nll"], b["row_nll"] - b["ref_nll"]
    w = np.argsort(-da)[:16]
    for name, h, d in ((str(a["row"]), ha, da), (str(b["row"]), hb, db)):
        hv = att[w][:, :, :, 4:cand] > 0.05
        print("%s: worst-16 lost mass %.4f, strong links held %.1f %%, loss on those steps %.2f "
              "nats; all steps lost mass %.4f"
              % (name, (att[w] * ~h[w]).sum(-1).mean(),
                 100 * (hv & h[w][:, :, :, 4:cand]).sum() / hv.sum(), d[w].sum(),
                 (att * ~h).sum(-1).mean()))
    e = (att[w] * ~ha[w]).sum((0, 1, 2))
    for j in np.argsort(-e)[:8]:
        hv = att[w][:, :, :, j] > 0.05
        print("pos %d: links > 0.05 %d, held by row %d, variant %d; (layer, head) pairs holding "
              "it at the first step: row %d, variant %d"
              % (j, hv.sum(), (hv & ha[w][:, :, :, j]).sum(), (hv & hb[w][:, :, :, j]).sum(),
                 ha[0, :, :, j].sum(), hb[0, :, :, j].sum()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
