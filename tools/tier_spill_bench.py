#!/usr/bin/env python3
"""Spill and restore throughput of a real daemon through a real Redis Cluster, against
redis-benchmark's raw SET/GET of the same value size in the same run (docs/tier.md "Spill and
restore throughput").

Starts a 3-master cluster (tools/redis_cluster.sh) and one kvctl daemon with tier.spill_idle_ms,
opens --sequences sequences of --tokens tokens each (SmolLM2-135M's KV geometry, random fp16 K/V,
the daemon's default quantizer unless --set says otherwise), waits until the tier pass has spilled
every one, then FETCHes each (which restores it). Throughput = image bytes / the daemon's own wall
time (STATS tier_spill_us_total: export + write; tier_restore_us_total: read + rebuild, which
decodes every record once to check it). Then redis-benchmark SETs and GETs values of the mean
image size on the same cluster (-c 1, one client as the daemon is).

  tools/tier_spill_bench.py --kvctl-bin build/bin/kvctl [--tokens 2048] [--sequences 8]
      [--port 7600] [--set quant.method=kivi ...]
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

from kvctl.client import Client  # noqa: E402
from kvctl.process import spawn_daemon, wait_until_serving  # noqa: E402

LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64  # SmolLM2-135M


def redis_benchmark(port: int, size: int, n: int) -> dict:
    out = subprocess.run(["redis-benchmark", "-h", "127.0.0.1", "-p", str(port), "--cluster",
                          "-t", "set,get", "-d", str(size), "-n", str(n), "-c", "1", "-q"],
                         capture_output=True, text=True, timeout=600).stdout
    rates = {}
    for name, rps in re.findall(r"(SET|GET): ([0-9.]+) requests per second", out):
        rates[name] = float(rps) * size / 1e6
    return rates


def wait_for(client: Client, field: str, want: int, timeout_s: float = 300) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        tier = client.stats("tier")["tier"]
        if tier[field] >= want:
            return tier
        if time.monotonic() > deadline:
            raise SystemExit("tier_spill_bench: %s stayed at %d, expected %d" %
                             (field, tier[field], want))
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvctl-bin", default=os.path.join(ROOT, "build", "bin", "kvctl"))
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--sequences", type=int, default=8)
    ap.add_argument("--port", type=int, default=7600, help="first port of the cluster")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more daemon settings, e.g. quant.method=kivi")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvctl-spill-bench-")
    cluster_dir = os.path.join(work, "cluster")
    script = os.path.join(ROOT, "tools", "redis_cluster.sh")
    subprocess.run(["bash", script, "start", cluster_dir, str(args.port), "3"], check=True)
    endpoint = "ipc://%s/kvctl.sock" % work
    settings = {"server.endpoint": endpoint, "server.stats_endpoint": "",
                "pool.shm_name": "/kvctl-spill-bench-%d" % os.getpid(), "pool.bytes": "2GiB",
                "tier.nodes": "127.0.0.1:%d,127.0.0.1:%d" % (args.port, args.port + 1),
                "tier.spill_idle_ms": 200, "tier.quota_bytes": "8GiB"}
    for kv in args.set:
        key, _, value = kv.partition("=")
        settings[key] = value
    daemon = spawn_daemon(args.kvctl_bin, settings, os.path.join(work, "kvctl.log"))
    try:
        wait_until_serving(daemon, endpoint, 60)
        rng = np.random.default_rng(0)
        with Client(endpoint) as c:
            c.hello(LAYERS, KV_HEADS, HEAD_DIM, dtype="float16", model_name="bench")
            shape = (LAYERS, args.tokens, KV_HEADS, HEAD_DIM)
            for s in range(args.sequences):
                c.open(s + 1)
                c.append(s + 1, rng.standard_normal(shape).astype(np.float16),
                         rng.standard_normal(shape).astype(np.float16))
            tier = wait_for(c, "tier_spills_total", args.sequences)
            image_bytes = tier["tier_spilled_bytes"]
            spill_s = tier["tier_spill_us_total"] / 1e6
            for s in range(args.sequences):
                c.fetch(s + 1, dtype="float16")
            tier = c.stats("tier")["tier"]
            restore_s = tier["tier_restore_us_total"] / 1e6
            method = c.stats("policy")["policy"].get("quant_method", "?")
        size = image_bytes // args.sequences
        raw = redis_benchmark(args.port, size, max(10, (256 << 20) // max(size, 1)))
        spill = image_bytes / spill_s / 1e6
        restore = image_bytes / restore_s / 1e6
        print("quantizer %s, %d sequences x %d tokens, image %.2f MiB each (%.0f B/token, fp16 "
              "would be %d)" % (method, args.sequences, args.tokens, size / 2**20,
                                size / args.tokens, 2 * LAYERS * KV_HEADS * HEAD_DIM * 2))
        print("| path | MB/s | raw (redis-benchmark, same size) | ratio |")
        print("|---|---:|---:|---:|")
        print("| spill (export + write) | %.0f | SET %.0f | %.2fx |" %
              (spill, raw.get("SET", 0), spill / raw["SET"] if raw.get("SET") else 0))
        print("| restore (read + rebuild) | %.0f | GET %.0f | %.2fx |" %
              (restore, raw.get("GET", 0), restore / raw["GET"] if raw.get("GET") else 0))
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        subprocess.run(["bash", script, "stop", cluster_dir], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
