#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Bytes the page checksums read per request (docs/reliability.md "Page checksums").

  python3 tools/checksum_probe.py --kvctl-bin build/bin/kvctl

Starts a daemon at the `kvbench ipc` geometry (30 layers, 3 KV heads, head_dim 64, fp16, default
quantizer, 64 KiB pages, no scrubber) and prints, from the STATS counters sealed_bytes_total and
verified_bytes_total read around each request: the bytes a blocks FETCH verifies for 1 layer and
for all layers of a 1K- and an 8K-token sequence (the first FETCH after the prefill, and the same
FETCH again), the mean bytes sealed and verified per decode APPEND over 1024 one-token steps
(flushes included), and the mean bytes a blocks FETCH verifies after each decode step of an
8K-token sequence. --verify-on-fetch sets pool.verify_on_fetch (default "unverified"; "all" is
the old rule: every FETCH verifies everything it refers to). Byte counts are exact; no timing.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "python", "tests"))
import kvctl  # noqa: E402
from helpers import Daemon, random_kv  # noqa: E402

LAYERS, HEADS, DIM = 30, 3, 64


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kvctl-bin", default=os.path.join(HERE, "..", "build", "bin", "kvctl"))
    parser.add_argument("--verify-on-fetch", default="unverified", choices=("unverified", "all"))
    args = parser.parse_args()
    os.environ["KVCTL_BIN"] = os.path.abspath(args.kvctl_bin)
    workdir = tempfile.mkdtemp(prefix="kvck-", dir="/tmp")
    d = Daemon(workdir, {"pool.bytes": "512MiB", "pool.page_bytes": "64KiB",
                         "server.max_message_bytes": "1GiB", "pool.scrub_interval_ms": 0,
                         "server.lease_ms": 300000,
                         "pool.verify_on_fetch": args.verify_on_fetch}).start()

    def counters(c):
        pool = c.stats("pool")["pool"]
        return pool["sealed_bytes_total"], pool["verified_bytes_total"]

    try:
        c = kvctl.Client(d.endpoint, timeout_ms=60000)
        c.hello(LAYERS, HEADS, DIM)
        print("pool.verify_on_fetch = %s\n" % args.verify_on_fetch)
        print("| request | bytes verified |\n|---|---:|")
        for seq, tokens in ((1, 1024), (2, 8192)):
            c.open(seq)
            k, v = random_kv(LAYERS, tokens, HEADS, DIM, dtype=np.float16)
            for at in range(0, tokens, 512):
                c.append(seq, k[:, at:at + 512], v[:, at:at + 512])
            for layers, label in ((0, "layer 0"), (None, "all %d layers" % LAYERS)):
                for when in ("first", "again"):
                    before = counters(c)[1]
                    c.fetch_blocks(seq, layers=layers)
                    print("| FETCH blocks, %dK tokens, %s, %s | %d |"
                          % (tokens // 1024, label, when, counters(c)[1] - before))
        c.open(3)
        k, v = random_kv(LAYERS, 1024, HEADS, DIM, dtype=np.float16)
        sealed, verified = counters(c)
        for t in range(1024):
            c.append(3, k[:, t:t + 1], v[:, t:t + 1])
        sealed2, verified2 = counters(c)
        print("\ndecode APPEND, mean of 1024 one-token steps: %.0f bytes sealed, %.0f verified"
              % ((sealed2 - sealed) / 1024, (verified2 - verified) / 1024))
        # Decode steps of the 8K sequence, each followed by a blocks FETCH (layer 0, then all).
        k, v = random_kv(LAYERS, 256, HEADS, DIM, dtype=np.float16)
        for layers, label in ((0, "layer 0"), (None, "all %d layers" % LAYERS)):
            c.fetch_blocks(2, layers=layers)
            fetched = 0
            for t in range(128):
                at = 8192 + (0 if layers == 0 else 128) + t
                c.append(2, k[:, at - 8192:at - 8191], v[:, at - 8192:at - 8191],
                         first_position=at)
                before = counters(c)[1]
                c.fetch_blocks(2, layers=layers)
                fetched += counters(c)[1] - before
            print("blocks FETCH of %s after each of 128 decode steps (8K tokens): %.0f bytes "
                  "verified per FETCH (mean, one flush included)" % (label, fetched / 128))
        c.disconnect()
    finally:
        d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
