#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tier_ttft: time to first token of a SmolLM2-135M prompt (2048 tokens by default), full
prefill against restoring its stored prefix from the other daemon through the Redis Cluster
tier (or, with --local, from the same daemon's local prefix cache, sharing its pages), and the
bytes the tier stores per token against an fp16 store, for each quantizer asked.

Per quantizer, two kvctl daemons standing for two nodes share one cluster (same tier.nodes and
key prefix, a fresh prefix per run so nothing of an earlier run is found):
- engine A on daemon 1: KvctlCache(prefix_reuse=True), open_prefix (restores nothing), one
  prefill forward of the whole prompt -> its last-token logits: the full-prefill TTFT. Its
  sync() APPENDs the prompt and SAVE_PREFIX stores it (saved_tokens, stored_bytes).
- `--repeats` times, alternating: a full prefill on daemon 1 (a plain cache), a restore on daemon 2:
  KvctlCache(prefix_reuse=True), open_prefix (OPEN_PREFIX through the cluster + a dense FETCH of
  every layer), then the forward of the prompt's tokens past the restored prefix -> logits:
  the restore TTFT. Medians are printed, with the ratio prefill / restore.
- bytes per token: stored_bytes / saved_tokens against fp16 = 2 (K, V) x layers x kv_heads x
  head_dim x 2 bytes (LMCache's format stores K and V in fp16).
The restore's first logits are checked against A's (argmax equal; max |diff| printed).
Through the cluster, daemon 2 runs without a local prefix cache (tier.local_prefix_fraction = 0),
so every timed restore reads the cluster. With --local there is one daemon and no cluster: the
restores are forks of the prefix A's save left in the daemon's pool, and the pool bytes each
restore adds are printed against the frozen prefix's.

    python3 tools/tier_ttft.py --start-cluster                    # tools/redis_cluster.sh
    python3 tools/tier_ttft.py --nodes 127.0.0.1:7100,127.0.0.1:7101 --quant kvarn,kivi,lossless
    python3 tools/tier_ttft.py --start-cluster --tokens 2048 --repeats 5 --json /tmp/ttft.json
    python3 tools/tier_ttft.py --local --quant kvarn,kivi,lossless

Needs a kvctl built with the cluster tier (docs/tier.md), the model stack
(python/requirements-model.txt) and the SmolLM2 GGUF wheel. Exit status 0 ok, 1 bad input or a
missing piece (one clear message on stderr: no cluster, no tier in the daemon, nothing
restored), 2 a daemon failed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
from kvctl.process import DaemonStartError, ManagedDaemon  # noqa: E402

# Quantizer settings by name (daemon config overrides; configs/README.md).
QUANTIZERS = {
    "kvarn": {"quant.method": "kvarn"},
    "kivi": {"quant.method": "kivi"},
    "fp16": {"quant.method": "fp16"},
    "lossless": {"quant.lossless": "true"},
}
DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"


class Fail(Exception):
    """A missing piece or bad input: one message, exit 1."""


class DaemonFailed(Exception):
    """A daemon did not start or died: exit 2."""


class Daemon(ManagedDaemon):
    """ManagedDaemon (a 512MiB pool) whose start failure is DaemonFailed (exit code 2)."""

    def __init__(self, binary: str, workdir: str, name: str, settings: Dict[str, str]):
        super().__init__(binary, workdir, name, {"pool.bytes": "512MiB", **settings},
                         shm_prefix="tierttft")

    def start(self) -> "Daemon":
        try:
            return super().start()
        except DaemonStartError as e:
            raise DaemonFailed(str(e)) from None


class Cluster:
    """A throwaway 3-master Redis Cluster from tools/redis_cluster.sh."""

    def __init__(self, workdir: str, base_port: int):
        self.script = os.path.join(REPO, "tools", "redis_cluster.sh")
        if not os.path.exists(self.script):
            raise Fail("--start-cluster: %s is missing (it comes with the tier on main); pass "
                       "--nodes HOST:PORT,... of a running Redis Cluster instead" % self.script)
        self.folder = os.path.join(workdir, "redis")
        self.base_port = base_port

    def start(self) -> str:
        run = subprocess.run([self.script, "start", self.folder, str(self.base_port), "3", "0"],
                             capture_output=True, text=True, timeout=180)
        if run.returncode != 0:
            self.stop()
            raise Fail("tools/redis_cluster.sh start failed (%d): %s%s"
                       % (run.returncode, run.stdout, run.stderr))
        return ",".join("127.0.0.1:%d" % (self.base_port + i) for i in range(3))

    def stop(self) -> None:
        subprocess.run([self.script, "stop", self.folder, str(self.base_port)],
                       capture_output=True, timeout=60)


def prompt_ids(tokenizer, path: str, tokens: int):
    """The first `tokens` + 0 ids of the text at `path` (repeated when it is shorter)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise Fail("--text: cannot read %s (%s)" % (path, e.strerror))
    if not text.strip():
        raise Fail("--text: %s is empty" % path)
    ids = tokenizer(text, return_tensors="pt").input_ids
    while ids.shape[1] < tokens:
        ids = tokenizer(text * (tokens // ids.shape[1] + 1), return_tensors="pt").input_ids
    return ids[:, :tokens]


def first_logits(model, cache, ids, start: int):
    """Logits of the prompt's last token after a forward of ids[:, start:] on `cache`."""
    import torch
    with torch.no_grad():
        out = model(ids[:, start:], past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[0, -1]


def measure(model, ids, binary: str, workdir: str, nodes: str, name: str, settings: dict,
            repeats: int) -> dict:
    """nodes "": one daemon, restores from its local prefix cache."""
    from kvctl.hf import KvctlCache

    common = dict(settings)
    common.update({"tier.nodes": nodes, "tier.key_prefix": "ttft-%s" % uuid.uuid4().hex[:12]})
    d1 = Daemon(binary, workdir, "%s-1" % name, common)
    d2 = (Daemon(binary, workdir, "%s-2" % name, dict(common, **{"tier.local_prefix_fraction": "0"}))
          if nodes else d1)
    pool_growth, frozen_bytes = [], 0
    try:
        d1.start()
        if d2 is not d1:
            d2.start()
        # Engine A: full prefill, then SAVE_PREFIX of the prompt (at sync()).
        with KvctlCache(model, d1.endpoint, prefix_reuse=True, timeout_ms=120000) as a:
            quant = a.client.session.quant
            if a.open_prefix(ids) != 0:
                raise Fail("%s: daemon 1 restored a prefix under a fresh key prefix" % name)
            want = first_logits(model, a, ids, 0)
            a.sync()
            if a.prefix_saved is None or a.prefix_saved[0] == 0:
                why = a.prefix_error or "SAVE_PREFIX stored 0 tokens (no exact cut)"
                if "no cluster tier" in why:
                    raise Fail("%s: the kvctl binary %s has no cluster tier (%s): build it from "
                               "a main with the tier (docs/tier.md)" % (name, binary, why))
                raise Fail("%s: the prompt was not saved: %s" % (name, why))
            saved, stored_bytes = a.prefix_saved
            geometry = (a.n_layers, a.kv_heads, a.head_dim)
        # Timed runs alternate, so a load change on a shared machine hits both paths alike. A's
        # prefill above is not among them: it may have paid the process's first-forward cost.
        prefill_s, restore_s, parts, restored, diffs, agree = [], [], [], 0, [], True
        for _ in range(repeats):
            with KvctlCache(model, d1.endpoint, timeout_ms=120000) as c:
                t0 = time.perf_counter()
                first_logits(model, c, ids, 0)
                prefill_s.append(time.perf_counter() - t0)
            with KvctlCache(model, d2.endpoint, prefix_reuse=True, timeout_ms=120000) as b:
                used = b.client.stats("pool")["pool"]["bytes_used"]
                t0 = time.perf_counter()
                restored = b.open_prefix(ids)
                t1 = time.perf_counter()
                got = first_logits(model, b, ids, restored)
                restore_s.append(time.perf_counter() - t0)
                # OPEN_PREFIX (the daemon's cluster reads and import), FETCH + load, forward.
                parts.append((b.counters["prefix_open_s"], b.counters["fetch_s"],
                              time.perf_counter() - t1))
                pool_growth.append(b.client.stats("pool")["pool"]["bytes_used"] - used)
                frozen_bytes = b.client.stats("sequences")["sequences"]["kv_prefix_frozen_bytes"]
            if restored == 0:
                raise Fail("%s: daemon 2 restored nothing of the %d-token prefix daemon 1 saved "
                           "(same tier.nodes and key prefix); see %s" % (name, saved,
                                                                       d2.log_path))
            diffs.append(float((got - want).abs().max()))
            agree = agree and int(got.argmax()) == int(want.argmax())
    finally:
        d1.stop()
        if d2 is not d1:
            d2.stop()
    layers, kv_heads, head_dim = geometry
    fp16_per_token = 2 * layers * kv_heads * head_dim * 2
    per_token = stored_bytes / saved
    prefill, restore = statistics.median(prefill_s), statistics.median(restore_s)
    return {"quantizer": name, "method": quant.method_name, "k_bits": quant.k_bits,
            "v_bits": quant.v_bits, "prompt_tokens": int(ids.shape[1]),
            "saved_tokens": saved, "restored_tokens": restored, "stored_bytes": stored_bytes,
            "bytes_per_token": per_token, "fp16_bytes_per_token": fp16_per_token,
            "fp16_over_stored": fp16_per_token / per_token,
            "prefill_ttft_s": prefill, "restore_ttft_s": restore,
            "prefill_over_restore": prefill / restore,
            "prefill_runs_s": prefill_s, "restore_runs_s": restore_s,
            "restore_parts_s": {"open_prefix": statistics.median(p[0] for p in parts),
                                "fetch": statistics.median(p[1] for p in parts),
                                "forward": statistics.median(p[2] for p in parts)},
            "first_logits_max_diff": max(diffs), "first_token_equal": agree,
            "restore_from": "cluster" if nodes else "local prefix cache",
            "restore_pool_growth_bytes": statistics.median(pool_growth),
            "prefix_frozen_bytes": frozen_bytes}


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--nodes", default=os.environ.get("KVCTL_TEST_TIER_NODES", ""),
                       help="HOST:PORT,... of a running Redis Cluster (default "
                            "$KVCTL_TEST_TIER_NODES)")
    where.add_argument("--start-cluster", action="store_true",
                       help="start a 3-master cluster with tools/redis_cluster.sh")
    where.add_argument("--local", action="store_true",
                       help="no cluster: restore from one daemon's local prefix cache")
    ap.add_argument("--base-port", type=int, default=7300, help="of --start-cluster")
    ap.add_argument("--kvctl", default=os.environ.get("KVCTL_BIN")
                    or os.path.join(REPO, "build", "bin", "kvctl"))
    ap.add_argument("--quant", default="kvarn",
                    help="comma-separated, of %s" % ", ".join(QUANTIZERS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="more daemon settings (both daemons, every quantizer)")
    ap.add_argument("--tokens", type=int, default=2048, help="prompt length")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each path")
    ap.add_argument("--text", default=DEFAULT_TEXT, help="file the prompt is cut from")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = as is)")
    ap.add_argument("--json", default="", help="write the results here too")
    args = ap.parse_args(argv)
    # The cache warns when its automatic SAVE_PREFIX fails; measure() reports that itself.
    warnings.filterwarnings("ignore", message=r"KvctlCache\(prefix_reuse=True\)")
    try:
        names = [q.strip() for q in args.quant.split(",") if q.strip()]
        bad = [q for q in names if q not in QUANTIZERS]
        if bad or not names:
            raise Fail("--quant: got %r, expected names of %s" % (args.quant,
                                                                ", ".join(QUANTIZERS)))
        extra = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise Fail("--set: got %r, expected KEY=VALUE" % item)
            extra[key] = value
        if args.tokens < 2 or args.repeats < 1:
            raise Fail("--tokens >= 2 and --repeats >= 1, got %d and %d"
                       % (args.tokens, args.repeats))
        if not os.access(args.kvctl, os.X_OK):
            raise Fail("--kvctl: %s is not an executable (cmake --build build --target kvctl)"
                       % args.kvctl)
        if not args.nodes and not args.start_cluster and not args.local:
            raise Fail("no Redis Cluster: pass --nodes HOST:PORT,... or --start-cluster (the "
                       "tier needs one; docs/tier.md), or --local")
        from kvctl.model import ModelNotFound, load_smollm2
        try:
            model, tokenizer = load_smollm2()
        except ModelNotFound as e:
            raise Fail(str(e))
        if args.threads:
            import torch
            torch.set_num_threads(args.threads)
        ids = prompt_ids(tokenizer, args.text, args.tokens)
        with tempfile.TemporaryDirectory(prefix="tierttft-", dir="/tmp") as workdir:
            cluster = Cluster(workdir, args.base_port) if args.start_cluster else None
            nodes = cluster.start() if cluster else ("" if args.local else args.nodes)
            try:
                rows = []
                for name in names:
                    settings = dict(QUANTIZERS[name], **extra)
                    load = os.getloadavg()[0]
                    rows.append(measure(model, ids, args.kvctl, workdir, nodes, name, settings,
                                        args.repeats))
                    # Timings on a shared machine follow its load: say what it was.
                    rows[-1]["load_average_1m"] = [load, os.getloadavg()[0]]
                    report(rows[-1])
            finally:
                if cluster:
                    cluster.stop()
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=2)
        return 0
    except Fail as e:
        print("tier_ttft: %s" % e, file=sys.stderr)
        return 1
    except DaemonFailed as e:
        print("tier_ttft: daemon failed: %s" % e, file=sys.stderr)
        return 2


def report(r: dict) -> None:
    print("%s (%s k%d v%d), %d-token prompt (1-min load average %.1f -> %.1f on %d CPUs):"
          % (r["quantizer"], r["method"], r["k_bits"], r["v_bits"], r["prompt_tokens"],
             r["load_average_1m"][0], r["load_average_1m"][1], os.cpu_count() or 0))
    print("  TTFT full prefill   %8.3f s  (median of %d; runs %s)"
          % (r["prefill_ttft_s"], len(r["prefill_runs_s"]),
             " ".join("%.2f" % x for x in r["prefill_runs_s"])))
    print("  TTFT restore        %8.3f s  (median of %d; runs %s; %d tokens restored from the "
          "%s, %d prefilled)" % (r["restore_ttft_s"], len(r["restore_runs_s"]),
                                 " ".join("%.2f" % x for x in r["restore_runs_s"]),
                                 r["restored_tokens"], r["restore_from"],
                                 r["prompt_tokens"] - r["restored_tokens"]))
    p = r["restore_parts_s"]
    print("    of which          %8.3f s OPEN_PREFIX, %.3f s FETCH, %.3f s forward"
          % (p["open_prefix"], p["fetch"], p["forward"]))
    print("  prefill / restore   %8.2fx" % r["prefill_over_restore"])
    print("  pool bytes a restore adds %d (the frozen prefix in the pool: %d)"
          % (r["restore_pool_growth_bytes"], r["prefix_frozen_bytes"]))
    print("  stored              %8d bytes for %d tokens: %.0f B/token, fp16 %d B/token "
          "(%.2fx smaller)" % (r["stored_bytes"], r["saved_tokens"], r["bytes_per_token"],
                               r["fp16_bytes_per_token"], r["fp16_over_stored"]))
    print("  first logits        max |diff| %.3g vs the full prefill, argmax %s"
          % (r["first_logits_max_diff"], "equal" if r["first_token_equal"] else "DIFFERS"))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main())
