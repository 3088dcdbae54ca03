#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Measures what a hostile or careless client can cost a real kvctl daemon (docs/reliability.md).

  python3 tools/reliability_probe.py --kvctl-bin build/bin/kvctl

Starts the daemon on a private socket and shm name, then prints markdown tables of:
  - host memory per OPEN: the daemon's RSS growth against the host-memory charge it books
    (STATS host_memory_used_bytes) for several geometries, and what a geometry too large for the
    pool gets at HELLO;
  - STATS at a large geometry: its size and time, and PING latency with and without a client
    calling STATS in a loop (PING is answered on the socket's I/O thread, STATS on its own).
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import kvctl  # noqa: E402


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def start_daemon(binary: str, workdir: str, pool: str) -> subprocess.Popen:
    endpoint = f"ipc://{workdir}/kvctl.sock"
    config = os.path.join(workdir, "kvctl.toml")
    with open(config, "w") as f:
        f.write(f'[server]\nendpoint = "{endpoint}"\nlog_level = "warn"\nstats_endpoint = ""\n'
                f'[pool]\nshm_name = "/kvctl-probe-{os.getpid()}"\nbytes = "{pool}"\n'
                f'page_bytes = "64KiB"\nstaging_slots = 0\nunlink_stale = true\n'
                f'[quant]\nmethod = "kivi"\nk_bits = 4\nv_bits = 4\n')
    proc = subprocess.Popen([binary, "--config", config])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with kvctl.Client(endpoint, timeout_ms=500) as c:
                c.ping()
                proc.endpoint = endpoint
                return proc
        except kvctl.KvctlError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("daemon did not answer PING")


def host_used(client) -> int:
    return int(client.stats("pool")["pool"]["host_memory_used_bytes"])


def open_memory(proc, geometries, per_geometry: int):
    print("| geometry (layers x kv_heads x head_dim) | RSS growth per OPEN | charged per OPEN "
          "(estimate) | time per OPEN |")
    print("|---|---|---|---|")
    for layers, heads, dim in geometries:
        with kvctl.Client(proc.endpoint, timeout_ms=60000) as c:
            c.hello(layers=layers, kv_heads=heads, head_dim=dim, dtype="float16")
            c.open(0)  # Warms allocator caches.
            rss0, used0, t0 = rss_bytes(proc.pid), host_used(c), time.perf_counter()
            for seq in range(1, per_geometry + 1):
                c.open(seq)
            seconds = (time.perf_counter() - t0) / per_geometry
            rss1, used1 = rss_bytes(proc.pid), host_used(c)
            print(f"| {layers} x {heads} x {dim} | {(rss1 - rss0) / per_geometry / 1024:.1f} KiB"
                  f" | {(used1 - used0) / per_geometry / 1024:.1f} KiB | {seconds * 1e3:.2f} ms |")
    with kvctl.Client(proc.endpoint, timeout_ms=60000) as c:
        t0 = time.perf_counter()
        try:
            c.hello(layers=1024, kv_heads=1024, head_dim=1024, dtype="float16")
            print("\n1024 x 1024 x 1024 HELLO: accepted")
        except kvctl.ServerError as e:
            print(f"\n1024 x 1024 x 1024 HELLO: {e.code} in "
                  f"{(time.perf_counter() - t0) * 1e3:.1f} ms: {e.message}")


def ping_latencies(endpoint: str, seconds: float):
    out = []
    with kvctl.Client(endpoint, timeout_ms=60000) as c:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            c.ping()
            out.append(time.perf_counter() - t0)
            time.sleep(0.002)
    return out


def stats_probe(proc, layers: int, heads: int, dim: int, sequences: int, tokens: int):
    c = kvctl.Client(proc.endpoint, timeout_ms=120000)
    c.hello(layers=layers, kv_heads=heads, head_dim=dim, dtype="float16")
    rng = np.random.default_rng(0)
    for seq in range(sequences):
        c.open(seq)
        k = rng.standard_normal((layers, tokens, heads, dim)).astype(np.float16)
        c.append(seq, k, -k)
    times, size = [], 0
    for _ in range(5):
        t0 = time.perf_counter()
        text = c.stats_text()
        times.append(time.perf_counter() - t0)
        size = len(text)
    quiet = ping_latencies(proc.endpoint, 2.0)
    stop = threading.Event()

    def hammer():
        with kvctl.Client(proc.endpoint, timeout_ms=120000) as h:
            while not stop.is_set():
                h.stats_text()

    thread = threading.Thread(target=hammer)
    thread.start()
    busy = ping_latencies(proc.endpoint, 4.0)
    stop.set()
    thread.join()
    c.disconnect()

    def fmt(xs):
        xs = sorted(xs)
        return (f"{statistics.median(xs) * 1e3:.2f} / {xs[int(0.99 * (len(xs) - 1))] * 1e3:.2f}"
                f" / {xs[-1] * 1e3:.2f}")

    print(f"\nSTATS(\"\") of {sequences} sequences of {layers} x {heads} x {dim}, {tokens} tokens "
          f"each: {size} bytes, median {statistics.median(times) * 1e3:.1f} ms "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f})\n")
    print("| PING latency, ms | median / p99 / max |")
    print("|---|---|")
    print(f"| no STATS | {fmt(quiet)} |")
    print(f"| another client calling STATS(\"\") back to back | {fmt(busy)} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kvctl-bin", default="build/bin/kvctl")
    parser.add_argument("--pool", default="2GiB")
    parser.add_argument("--opens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvctl-probe-") as workdir:
        proc = start_daemon(args.kvctl_bin, workdir, args.pool)
        try:
            open_memory(proc, [(32, 8, 128), (80, 8, 128), (80, 64, 128)], args.opens)
            stats_probe(proc, 80, 64, 128, sequences=4, tokens=64)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
