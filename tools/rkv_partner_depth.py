#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""How far back R-KV's newest near-duplicate sits on SmolLM2's own keys.

policies/redundancy.h finds each row's newest partner (the largest j != i with cosine > 0.5) by a
scan from the newest key backwards (8 keys in the first step, 32 in the later ones), and falls
back to the full pass when more than 90 % of a head's rows have no partner among the newest 8, or
when the scan has used half the full pass's dot products with rows still pending. This runs the model once over
a text segment (transformers' DynamicCache, post-RoPE keys, fp32: not the daemon's dequantized
keys) and prints, over every (layer, KV head): the mean number of keys a row's scan visits (T for
a row without a partner), the share of rows without any partner, the share that scan past the
first step, how many heads would fall back, and the dot products the scan takes against the full
pass's T(T-1)/2.

    python3 tools/rkv_partner_depth.py [--text prose|code|gpl3|PATH] [--tokens 2048] [--start 4096]

With --simulate-from T0 it also replays a decode with evictions on a few heads (one per fifth of
the layers, KV head 0): the first T0 tokens are cut to --fraction of them, then every --period
tokens the new ones join and the most redundant non-protected keys (the largest column sums of
S; 4 sinks and the newest 32 kept) go until --fraction of the tokens seen remain, as if R-KV's
importance played no part. At each compression it counts the dot products of the newest-first
scan on the kept and new keys (a row's keys down to its newest partner; no steps, no fallback)
against an incremental scan that carries each row's partner from the compression before: an old
row scans the new keys newest first, and only when none is its partner, it goes on below its
carried partner when that one was evicted; new rows scan as now. A design estimate (fp32 keys, no
importance), not the daemon's code.
"""

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))

STEP = 32  # policies/redundancy.cc, kScanKeys
FIRST_STEP = 8  # and kFirstScanKeys


def scan_cost(visited, t):
    """Dot products of policies/redundancy.cc's kAuto on one head, and whether it falls back:
    steps of STEP keys (FIRST_STEP the first) newest first over the pending rows; the full pass
    (T(T-1)/2 more) when more than 90 % of the rows are pending after the first step, or when the scan has used half
    the full pass's dot products with rows pending."""
    full = t * (t - 1) // 2
    work, hi, pending = 0, t, visited
    while hi > 0 and len(pending):
        width = min(FIRST_STEP if hi == t else STEP, hi)
        work += len(pending) * width
        pending = pending[pending > t - hi + width]
        if len(pending) and ((hi == t and len(pending) * 10 > 9 * t) or work > full // 2):
            return work + full, True
        hi -= width
    return work, False


def head_stats(keys, threshold):
    """keys: [T, D] float array of one head. Visited keys per row, and whether it has a partner."""
    unit = keys / (np.linalg.norm(keys, axis=1, keepdims=True) + 1e-8)
    s = unit @ unit.T
    np.fill_diagonal(s, 0)  # A row is never its own partner (threshold >= 0 here).
    above = s > threshold
    t = s.shape[0]
    has = above.any(axis=1)
    newest = t - 1 - np.argmax(above[:, ::-1], axis=1)
    return np.where(has, t - newest, t), has


def newest_partners(above, rows):
    """Position in rows of each row's newest partner among rows (-1: none)."""
    sub = above[np.ix_(rows, rows)]
    pos = len(rows) - 1 - np.argmax(sub[:, ::-1], axis=1)
    return np.where(sub.any(axis=1), pos, -1)


def simulate_compressions(keys, threshold, start, period, fraction):
    """(fresh, incremental) dot products summed over the compressions of one head; see the
    module docstring."""
    t = keys.shape[0]
    unit = keys / (np.linalg.norm(keys, axis=1, keepdims=True) + 1e-8)
    s = unit @ unit.T
    np.fill_diagonal(s, 0)
    above = s > threshold

    def evict(rows, budget):
        if len(rows) <= budget:
            return rows
        redundancy = s[np.ix_(rows, rows)].sum(axis=0)
        candidates = np.arange(4, len(rows) - 32)
        order = candidates[np.argsort(-redundancy[candidates], kind="stable")]
        return np.delete(rows, order[:len(rows) - budget])

    kept = evict(np.arange(start), int(fraction * start))
    carried = {}  # token -> its newest partner's token at the last compression (-1: none)
    partner = newest_partners(above, kept)
    carried.update(zip(kept, np.where(partner >= 0, kept[partner], -1)))
    fresh = incremental = 0
    for first in range(start, t, period):
        old = len(kept)
        rows = np.concatenate([kept, np.arange(first, min(first + period, t))])
        partner = newest_partners(above, rows)
        visited = np.where(partner >= 0, len(rows) - partner, len(rows))
        fresh += int(visited.sum())
        # Old rows: the new keys newest first, stopping at a partner among them.
        incremental += int(np.minimum(visited[:old], len(rows) - old).sum())
        present = set(rows[:old].tolist())
        for j in range(old):
            if partner[j] >= old:
                continue
            was = carried.get(rows[j], -1)
            if was >= 0 and was not in present:  # Its partner went: scan on below its place.
                below = int(np.searchsorted(rows[:old], was))
                incremental += below - max(int(partner[j]), 0)
        incremental += int(visited[old:].sum())  # New rows scan as now.
        carried.update(zip(rows, np.where(partner >= 0, rows[partner], -1)))
        kept = evict(rows, int(fraction * min(first + period, t)))  # Of the tokens seen.
    return fresh, incremental


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", default="prose")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--start", type=int, default=4096, help="first token of the segment")
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--simulate-from", type=int, default=0,
                    help="replay compressions from this many tokens on (0: off)")
    ap.add_argument("--period", type=int, default=32, help="tokens between compressions")
    ap.add_argument("--fraction", type=float, default=0.47, help="kept share of the tokens seen")
    args = ap.parse_args()

    import torch
    import kveval
    from kvctl.model import load_smollm2

    torch.set_num_threads(1)
    model, tok = load_smollm2()
    ids = tok(kveval.read_text(args.text, args.text), return_tensors="pt").input_ids
    ids = ids[:, args.start:args.start + args.tokens]
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    visited, none, past_first, fallbacks, heads, costs = [], [], [], 0, 0, []
    for layer in cache.layers:
        for k in layer.keys[0].float().numpy():
            v, has = head_stats(k, args.threshold)
            visited.append(v.mean())
            none.append(1 - has.mean())
            past_first.append((v > STEP).mean())
            work, fell_back = scan_cost(v, len(v))
            costs.append(work / (len(v) * (len(v) - 1) / 2))
            fallbacks += fell_back
            heads += 1
    t = ids.shape[1]
    print("text %s, T %d, %d heads, threshold %.2f" % (args.text, t, heads, args.threshold))
    print("keys a row's scan visits: mean %.1f (%.2f %% of T), worst head %.1f"
          % (np.mean(visited), 100 * np.mean(visited) / t, np.max(visited)))
    print("rows without a partner: %.2f %% (worst head %.1f %%)"
          % (100 * np.mean(none), 100 * np.max(none)))
    print("rows scanning past the first %d keys: %.2f %% (worst head %.1f %%)"
          % (STEP, 100 * np.mean(past_first), 100 * np.max(past_first)))
    print("heads that fall back to the full pass: %d of %d" % (fallbacks, heads))
    print("dot products of the scan (the linear column sums apart) per head, relative to the "
          "full pass's T(T-1)/2: mean %.3f, worst head %.3f" % (np.mean(costs), np.max(costs)))
    if args.simulate_from:
        layers = len(cache.layers)
        total_fresh = total_incremental = 0
        for index in sorted({round(f * (layers - 1) / 5) for f in range(6)}):
            keys = cache.layers[index].keys[0, 0].float().numpy()
            fresh, incremental = simulate_compressions(keys, args.threshold, args.simulate_from,
                                                       args.period, args.fraction)
            print("compressions from %d to %d tokens, layer %d head 0: fresh scan %.3g dot "
                  "products, incremental %.3g (%.3f)"
                  % (args.simulate_from, t, index, fresh, incremental, incremental / fresh))
            total_fresh += fresh
            total_incremental += incremental
        print("incremental / fresh over those heads: %.3f" % (total_incremental / total_fresh))


if __name__ == "__main__":
    main()
