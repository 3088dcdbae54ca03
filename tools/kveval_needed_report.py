# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_needed_report: reads tools/kveval_needed.py's <label>-seg<i>.npz files and prints, per
segment, where the row's loss sits, how much of the full-precision attention falls on positions
the row did not hold, which positions those are (distance back, heads holding them, token text),
when they went and how an observation-window score ranked them at the prefill's eviction.

The score is a proxy of the daemon's scorer, not the scorer: the prefix's last --obs queries'
full-precision attention (softmax over every causal key, the mean over each KV head's query
heads, then over the queries), max-pooled with kernel 7, ranked among the positions before the
observation window. How well it reproduces the daemon's decision is printed (the share of the
prefill's kept positions in the proxy's top of the same size).

    python3 tools/kveval_needed_report.py results/q18d-needed/prose-seg*.npz
"""

from __future__ import annotations

import os
import sys

import numpy as np


def _tok(tok, ids, j, width=3):
    if tok is None:
        return str(int(ids[j]))
    lo, hi = max(0, j - width), min(len(ids), j + width + 1)
    return "%r [%r] %r" % (tok.decode(ids[lo:j]), tok.decode(ids[j:j + 1]),
                           tok.decode(ids[j + 1:hi]))


def proxy_percentile(obs_att, kernel=7):
    """[L, H, prefix - obs] percentile (0 = lowest, 1 = highest) of the pooled window score."""
    L, H, obs, prefix = obs_att.shape
    cand = prefix - obs
    score = obs_att.astype(np.float32).mean(2)[:, :, :cand]
    pad = kernel // 2
    padded = np.pad(score, ((0, 0), (0, 0), (pad, pad)), constant_values=-1)
    pooled = np.max(np.stack([padded[:, :, k:k + cand] for k in range(kernel)]), 0)
    order = pooled.argsort(-1).argsort(-1)
    return order / max(1, cand - 1)


def report(path, tok, top_steps=6, top_pos=4):
    z = np.load(path)
    ids, ref, row = z["ids"], z["ref_nll"], z["row_nll"]
    att, held = z["att"].astype(np.float32), z["held"]
    scored, L, H, T = att.shape
    prefix = T - scored - 1
    obs = z["obs_att"].shape[2]
    d = row - ref
    print("\n## %s (row %s, text start %d)" % (path, z["row"], int(z["start"])))
    print("dPPL %+.2f %%; loss increase sum %.2f nats; top 8 steps carry %.0f %% of it, top 16 "
          "%.0f %%" % (100 * (np.exp(d.mean()) - 1), d.sum(),
                       100 * np.sort(d)[::-1][:8].sum() / d.sum(),
                       100 * np.sort(d)[::-1][:16].sum() / d.sum()))
    ev = att * (~held)                                   # [scored, L, H, T]
    mass = ev.sum(-1)                                    # [scored, L, H]
    m = mass.mean((1, 2))
    rank = lambda x: x.argsort().argsort()  # noqa: E731
    rho = np.corrcoef(rank(m), rank(d))[0, 1]
    print("attention mass on positions not held, mean over (layer, head): %.3f (steps: median "
          "%.3f, max %.3f); Spearman with the step's loss increase %.2f"
          % (m.mean(), np.median(m), m.max(), rho))
    per_layer = mass.mean((0, 2))
    print("  per layer (mean over steps and heads): " +
          " ".join("%d:%.2f" % (li, x) for li, x in enumerate(per_layer)))
    kept0 = held[0, :, :, :prefix].mean()
    print("held at the first scored step: %.3f of the prefix per (layer, head)" % kept0)
    # Distance back of the evicted mass, over all steps.
    dist = (np.arange(prefix, prefix + scored)[:, None] - np.arange(T)[None, :])   # [scored, T]
    evm = ev.sum((1, 2))                                 # [scored, T]
    bins = [0, 32, 128, 256, 512, 1024, 2048]
    tot = evm.sum()
    print("evicted attention mass by distance back: " + ", ".join(
        "%d-%d %.0f %%" % (lo, hi, 100 * evm[(dist >= lo) & (dist < hi)].sum() / tot)
        for lo, hi in zip(bins[:-1], bins[1:])))
    pct = proxy_percentile(z["obs_att"])                 # [L, H, prefix - obs]
    cand = prefix - obs
    sink = 4
    agree = []
    for li in range(L):
        for h in range(H):
            k = held[0, li, h, sink:cand]
            n = int(k.sum())
            top = np.zeros_like(k)
            top[np.argsort(-pct[li, h, sink:cand])[:n]] = True
            agree.append((k & top).sum() / max(1, n))
    print("proxy check: %.2f of the positions held at the first step (before the window, after 4 "
          "sinks) are in the proxy's top of the same size (per (layer, head) mean)"
          % np.mean(agree))
    # Evicted (layer, head, position) weighted by attention: how the proxy ranked them.
    w = ev[:, :, :, :cand].sum(0)                        # [L, H, cand]
    gone0 = ~held[0, :, :, :cand]
    wp = (w * gone0).ravel()
    pp = pct.ravel()
    if wp.sum() > 0:
        print("evicted at the prefill, attention-weighted proxy percentile: below the keep line "
              "(<0.53) %.0f %%, 0.53-0.8 %.0f %%, above 0.8 %.0f %% (ranked high yet dropped)"
              % (100 * wp[pp < 0.53].sum() / wp.sum(),
                 100 * wp[(pp >= 0.53) & (pp < 0.8)].sum() / wp.sum(),
                 100 * wp[pp >= 0.8].sum() / wp.sum()))
    dropped_later = (held[0] & ~held[-1])[:, :, :T]
    later_mass = (ev * held[0][None]).sum() / ev.sum()
    print("share of the evicted attention mass on positions still held at the first scored step "
          "(dropped during the scored steps): %.0f %%; positions dropped during them: %.0f per "
          "(layer, head)" % (100 * later_mass, dropped_later.sum((-1)).mean()))
    worst = np.argsort(-d)[:16]
    for name, steps in (("worst 16 steps", worst), ("all steps", np.arange(scored))):
        a = att[steps][:, :, :, sink:cand]
        hv = a > 0.05
        hh = held[steps][:, :, :, sink:cand]
        print("%s: (step, layer, head, position) links with attention > 0.05 to a position "
              "between the sinks and the window: %d, held %.0f %% (their attention %.0f %% "
              "held); all positions held %.0f %%" % (name, hv.sum(), 100 * (hv & hh).sum() / max(1, hv.sum()),
                          100 * (a * hv * hh).sum() / max(1e-9, (a * hv).sum()), 100 * hh.mean()))
    hv = att[worst][:, :, :, sink:cand] > 0.05
    per_lh = hv.sum((0, 3))
    print("  worst 16 steps: the (layer, head) pairs giving most such links: " + ", ".join(
        "L%dH%d %d (held %.0f %%)" % (li, h, per_lh[li, h], 100 * (
            hv[:, li, h] & held[worst][:, li, h, sink:cand]).sum() / max(1, per_lh[li, h]))
        for li, h in zip(*np.unravel_index(np.argsort(-per_lh.ravel())[:6], per_lh.shape))))
    print("worst steps:")
    for i in np.argsort(-d)[:top_steps]:
        t = prefix + i
        print("  step %d (position %d) loss +%.2f nats (ref %.2f); evicted mass %.3f; target %r"
              % (i, t, d[i], ref[i], m[i], tok.decode(ids[t + 1:t + 2]) if tok else ids[t + 1]))
        e = ev[i].sum((0, 1))
        a = att[i].sum((0, 1))
        for j in np.argsort(-e)[:top_pos]:
            hl = held[i, :, :, j]
            heavy = att[i, :, :, j] > 0.05
            first_gone = "prefill" if not held[0, :, :, j].all() else "during steps"
            txt = _tok(tok, ids, j)
            pr = pct[:, :, j][~held[0, :, :, j]].mean() if j < cand and (~held[0, :, :, j]).any() \
                else float("nan")
            print("    pos %d (%d back): attention sum %.2f over %d (l,h), evicted share %.2f; "
                  "held by %d/%d (l,h), by %d/%d of those giving it > 0.05; gone since %s; "
                  "proxy percentile where dropped %.2f; %s"
                  % (j, t - j, a[j], L * H, e[j], hl.sum(), L * H, (hl & heavy).sum(),
                     heavy.sum(), first_gone, pr, txt))
    return {"d": d, "m": m}


def main(argv) -> int:
    try:
        from kvctl.model import load_smollm2
        _, tok = load_smollm2()
    except Exception:  # noqa: BLE001 - token text is a convenience; ids are printed instead
        tok = None
    for p in argv:
        report(p, tok)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "python"))
    sys.exit(main(sys.argv[1:]))
