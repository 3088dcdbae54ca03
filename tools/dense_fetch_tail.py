#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Where a dense FETCH's slow replies come from (docs/kvbench_ipc.md "Small dense FETCHes").

  python3 tools/dense_fetch_tail.py --split-rows 0 --split-rows 8192 --rounds 3

Starts a real daemon per run at the `kvbench ipc` geometry (30 layers, 3 KV heads, head_dim 64,
fp16, KVarN 2-bit), appends --tokens tokens, then times --fetches dense fp16 FETCHes of layer 0
from this process, and prints per run the client's p50 / p99 / max next to the daemon's own
fetch_latency_p50_us / p99 / max (STATS ipc: from the start of handling to the reply) and the
fetch helper's counters. A client maximum far above the daemon's says the time was lost outside
the handler (transport, scheduling). Runs alternate over the --split-rows values
(server.dense_fetch_split_rows) --rounds times.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
import kvctl  # noqa: E402
from helpers import Daemon, random_kv  # noqa: E402

LAYERS, HEADS, DIM = 30, 3, 64


def one_run(split_rows: int, tokens: int, fetches: int) -> str:
    workdir = tempfile.mkdtemp(prefix="kvtail-", dir="/tmp")
    d = Daemon(workdir, {"pool.bytes": "512MiB", "server.max_message_bytes": "1GiB",
                         "server.lease_ms": 300000, "quant.method": "kvarn", "quant.k_bits": 2,
                         "quant.v_bits": 2,
                         "server.dense_fetch_split_rows": split_rows}).start()
    try:
        c = kvctl.Client(d.endpoint, timeout_ms=60000)
        c.hello(LAYERS, HEADS, DIM)
        c.open(1)
        k, v = random_kv(LAYERS, tokens, HEADS, DIM, dtype=np.float16)
        for at in range(0, tokens, 1024):
            c.append(1, k[:, at:at + 1024], v[:, at:at + 1024])
        ms = []
        for _ in range(fetches):
            start = time.perf_counter()
            c.fetch(1, layers=0, mode="dense", dtype="float16")
            ms.append((time.perf_counter() - start) * 1e3)
        ipc = c.stats("ipc")["ipc"]
        ms = np.array(ms)
        return ("| %d | %.2f | %.2f | %.2f | %d | %d | %d | %d | %d |" % (
            split_rows, np.percentile(ms, 50), np.percentile(ms, 99), ms.max(),
            ipc["fetch_latency_p50_us"], ipc["fetch_latency_p99_us"], ipc["fetch_latency_max_us"],
            ipc["fetch_helper_parts_total"], ipc["fetch_helper_busy_total"]))
    finally:
        d.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvctl-bin", default=os.path.join(HERE, "..", "build", "bin", "kvctl"))
    parser.add_argument("--split-rows", type=int, action="append",
                        help="server.dense_fetch_split_rows of a run (repeatable; default 0, 8192)")
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--fetches", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.tokens < 1024 or args.tokens % 1024 != 0:
        parser.error("--tokens: got %d, expected a positive multiple of 1024" % args.tokens)
    if args.fetches < 1 or args.rounds < 1:
        parser.error("--fetches and --rounds: expected at least 1")
    os.environ["KVCTL_BIN"] = os.path.abspath(args.kvctl_bin)
    print("| split rows | client p50 ms | client p99 ms | client max ms | daemon p50 us "
          "| daemon p99 us | daemon max us | helper parts | helper busy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _ in range(args.rounds):
        for split_rows in args.split_rows or [0, 8192]:
            print(one_run(split_rows, args.tokens, args.fetches), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
