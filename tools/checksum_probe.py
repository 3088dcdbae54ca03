#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Bytes the page checksums read per request (docs/reliability.md "Page checksums").

  python3 tools/checksum_probe.py --kvctl-bin build/bin/kvctl

Starts a daemon at the `kvbench ipc` geometry (30 layers, 3 KV heads, head_dim 64, fp16, default
quantizer, 64 KiB pages, no scrubber) and prints, from the STATS counters sealed_bytes_total and
verified_bytes_total read around each request: the bytes FETCH verifies for 1 layer and for all
layers of a 1K- and an 8K-token sequence, and the mean bytes sealed and verified per decode APPEND
over 1024 one-token steps (flushes included). Byte counts are exact; no timing.
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
    args = parser.parse_args()
    os.environ["KVCTL_BIN"] = os.path.abspath(args.kvctl_bin)
    workdir = tempfile.mkdtemp(prefix="kvck-", dir="/tmp")
    d = Daemon(workdir, {"pool.bytes": "512MiB", "pool.page_bytes": "64KiB",
                         "server.max_message_bytes": "1GiB", "pool.scrub_interval_ms": 0,
                         "server.lease_ms": 300000}).start()

    def counters(c):
        pool = c.stats("pool")["pool"]
        return pool["sealed_bytes_total"], pool["verified_bytes_total"]

    try:
        c = kvctl.Client(d.endpoint, timeout_ms=60000)
        c.hello(LAYERS, HEADS, DIM)
        print("| request | bytes verified |\n|---|---:|")
        for seq, tokens in ((1, 1024), (2, 8192)):
            c.open(seq)
            k, v = random_kv(LAYERS, tokens, HEADS, DIM, dtype=np.float16)
            for at in range(0, tokens, 512):
                c.append(seq, k[:, at:at + 512], v[:, at:at + 512])
            for mode in ("dense", "blocks"):
                for layers, label in ((0, "layer 0"), (None, "all %d layers" % LAYERS)):
                    before = counters(c)[1]
                    if mode == "dense":
                        c.fetch(seq, layers=layers)
                    else:
                        c.fetch_blocks(seq, layers=layers)
                    print("| FETCH %s, %dK tokens, %s | %d |"
                          % (mode, tokens // 1024, label, counters(c)[1] - before))
        c.open(3)
        k, v = random_kv(LAYERS, 1024, HEADS, DIM, dtype=np.float16)
        sealed, verified = counters(c)
        for t in range(1024):
            c.append(3, k[:, t:t + 1], v[:, t:t + 1])
        sealed2, verified2 = counters(c)
        print("\ndecode APPEND, mean of 1024 one-token steps: %.0f bytes sealed, %.0f verified"
              % ((sealed2 - sealed) / 1024, (verified2 - verified) / 1024))
        c.disconnect()
    finally:
        d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
