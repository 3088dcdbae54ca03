#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""What a prefill's APPENDs cost the engine that waits for them: wall time of every APPEND of a
--tokens prefill, sent in the pieces the HF adapter sends (APPEND_CONTINUES on all but the last;
through the session's staging slot in pieces that fit it, or with --inline on the socket in
pieces of at most 64 MiB with queries), and the daemon's CPU for them, with
server.prepare_split_tokens at each --split value, alternated over --rounds daemons each. Random
rows in SmolLM2-135M's geometry (30 layers, 3 KV heads, 9 query heads, head_dim 64, float32 as
the adapter sends them): the encoders' and the importance scorers' cost does not depend on the
values much, but R-KV's redundancy does: random keys have no near-duplicates, so its scan gives up
for the full pass, which a model's keys rarely need, and the figures overstate that part
(docs/algorithms.md §12.4 (5)). The default settings are the 1/8 recipe (configs/README.md).
Prints one JSON object: per split value the medians of the total wall, the last APPEND's wall
(the one that evicts over the whole prefill) and the daemon's CPU, and each value's wall against
the first value's.

  python3 tools/prefill_append_cost.py --tokens 8192 --split 0 --split 512 --rounds 3
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

LAYERS, KV_HEADS, Q_HEADS, HEAD_DIM = 30, 3, 9, 64
MAX_APPEND_BYTES = 64 << 20  # python/kvctl/hf_cache.py's piece size.
RECIPE = {
    "quant.method": "turbo", "quant.k_bits": "4", "quant.v_bits": "3", "quant.flush_tokens": "64",
    "budget.mode": "evict-only", "budget.fp16_fraction": "0.125", "evict.policy": "rkv",
    "evict.obs_window": "32", "evict.lambda": "0.6", "evict.compression_period": "64",
    "evict.full_heads": "17:1,18:2,20:2,23:0,23:2,20:1,24:2,24:0,21:2", "pool.bytes": "1GiB",
}


def one_prefill(kvctl_bin, settings, k, v, q, inline):
    """Wall seconds of all APPENDs and of the last, and the daemon's CPU seconds for them."""
    from kvctl.client import Client
    from kvctl.hf_cli import process_cpu_seconds
    from kvctl.process import ManagedDaemon
    tokens = k.shape[1]
    per_token = k[:, :1].nbytes * 2 + q[:, :1].nbytes
    step = max(1, MAX_APPEND_BYTES // per_token)
    with tempfile.TemporaryDirectory() as workdir:
        daemon = ManagedDaemon(kvctl_bin, workdir, "prefill", settings).start()
        try:
            client = Client(daemon.endpoint, timeout_ms=600000)
            client.hello(LAYERS, KV_HEADS, HEAD_DIM, dtype="float32", q_heads=Q_HEADS)
            client.open(1)
            slot_tokens = 0 if inline else client.session.staging_tokens(per_token)
            staging = slot_tokens > 0
            if staging:
                step = min(step, slot_tokens)
            cpu0, wall0, last = process_cpu_seconds(daemon.proc.pid), time.perf_counter(), 0.0
            for a in range(0, tokens, step):
                e = min(tokens, a + step)
                t = time.perf_counter()
                client.append(1, k[:, a:e], v[:, a:e], q=q[:, a:e], first_position=a,
                              continues=e < tokens, use_staging=staging)
                last = time.perf_counter() - t
            wall = time.perf_counter() - wall0
            cpu = process_cpu_seconds(daemon.proc.pid) - cpu0
        finally:
            daemon.stop()
    return wall, last, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--split", type=int, action="append",
                    help="server.prepare_split_tokens of a run (repeatable; default 0 and 512)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a daemon setting over the recipe (repeatable)")
    ap.add_argument("--inline", action="store_true",
                    help="send the pieces on the socket, as the adapter did before session 49")
    ap.add_argument("--kvctl-bin", default=os.path.join(os.path.dirname(HERE), "build", "bin",
                                                         "kvctl"))
    args = ap.parse_args()
    splits = args.split or [0, 512]
    import numpy as np
    rng = np.random.default_rng(1)
    shape = (LAYERS, args.tokens)
    k = rng.standard_normal(shape + (KV_HEADS, HEAD_DIM), dtype=np.float32)
    v = rng.standard_normal(shape + (KV_HEADS, HEAD_DIM), dtype=np.float32)
    q = rng.standard_normal(shape + (Q_HEADS, HEAD_DIM), dtype=np.float32)
    settings = dict(RECIPE)
    for item in args.set:
        key, _, value = item.partition("=")
        settings[key] = value
    runs = {s: [] for s in splits}
    for _ in range(args.rounds):
        for s in splits:
            settings["server.prepare_split_tokens"] = str(s)
            runs[s].append(one_prefill(args.kvctl_bin, settings, k, v, q, args.inline))
    out = {"tokens": args.tokens, "rounds": args.rounds, "inline": args.inline,
           "settings": settings,
           "load_end": os.getloadavg()[0], "splits": {}}
    base = statistics.median(w for w, _, _ in runs[splits[0]])
    for s in splits:
        walls = [w for w, _, _ in runs[s]]
        out["splits"][str(s)] = {
            "wall_s": [round(w, 3) for w in walls],
            "last_append_s": [round(x, 3) for _, x, _ in runs[s]],
            "daemon_cpu_s": [round(c, 3) for _, _, c in runs[s]],
            "wall_median_s": round(statistics.median(walls), 3),
            "wall_vs_first": round(statistics.median(walls) / base, 3),
        }
    del out["settings"]["server.prepare_split_tokens"]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
