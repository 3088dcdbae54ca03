# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_memprobe: kveval's memory column of a quantizer row, without the model.

kveval reports "reserved mem vs fp16" as the mean over the scored steps of the pool bytes a
sequence holds against an fp16 cache of its tokens. For a row whose layout depends on the token
count only (a quantizer: widths, sinks, flush, record length, page size; no eviction scorer and
no RateQuant plan fitted on real K/V), that mean is the same for any K/V, so it can be measured
before a quality run, to keep a candidate inside a memory band. This replays kveval's appends
with synthetic K/V against a daemon started with the row's settings and kveval's pool: the
prefix of C - S - 1 tokens in one APPEND, then S single-token APPENDs with STATS after each
(what kveval's at_step reads), one segment (the layout repeats per segment).

    python3 tools/kveval_memprobe.py --kvctl-bin build/bin/kvctl \\
        --rows turbo3,turbo_k4v3_f64 --config try quant.method=turbo,quant.k_bits=4,...

--evict also takes evict-only rows and sends random Q with every APPEND: which tokens a scorer
keeps then differs from the model's, but how many (each head at its budget, compressed
evict.compression_period - 1 below it) does not, so the mean is an estimate to within the page
slack of partly evicted records, not a measurement (kveval's own column is). With --profiles DIR
(kveval's --calib-profiles: profile-<method>.toml) it also takes joint rows and evict-only rows
with a profile (layer budgets from its demand): the plan (each head's widths and token cap, or
each layer's budget) comes from the profile alone, so it is the one kveval's daemon makes with
the same profile, and budget.plan_tokens is resolved as kveval does.

Prints one line per row: mean reserved and payload memory vs fp16 over the scored steps, the
largest reserved value, and the value at the last step. Exit 0 ok, 1 bad input, 2 a daemon that
does not start.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from typing import Dict, List, Tuple

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kvctl  # noqa: E402
from kvctl.process import DaemonStartError, ManagedDaemon  # noqa: E402
from kveval_rows import EvalError, all_rows, pool_settings, resolve_plan_tokens  # noqa: E402


def parse_config(name: str, spec: str) -> Dict[str, str]:
    """'key=value,key=value' -> {key: value}; a clear error for anything else."""
    out = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError("--config %s: got %r, expected key=value[,key=value...]"
                             % (name, item))
        out[key.strip()] = value.strip()
    return out


def rows_to_probe(row_names: List[str], configs: List[List[str]], evict: bool = False,
                  profiles: str = "", tokens: int = 2048,
                  scored: int = 128) -> List[Tuple[str, dict]]:
    rows = all_rows()
    out = []
    for name in row_names:
        row = rows.get(name)
        if row is None:
            raise ValueError("--rows: unknown row %r" % name)
        mode = row.settings.get("budget.mode", "none")
        # A profile fixes a joint plan and evict-only's layer split (budget.layer_profile).
        joint = (evict and profiles and mode in ("joint", "evict-only") and row.profile and
                 not row.ratequant)
        if row.kind != "kvctl" or row.ratequant or row.pool_fraction or (row.profile and
                                                                         not joint):
            raise ValueError("--rows: %s: expected a quantizer row (kvctl, no RateQuant plan, "
                             "profile or pressure pool; with --evict and --profiles also joint "
                             "and profiled evict-only rows): its memory depends on more than the "
                             "token count" % name)
        if mode != "none" and not (evict and mode == "evict-only") and not joint:
            raise ValueError("--rows: %s: budget.mode %s evicts by score; its memory depends on "
                             "the K/V (--evict takes evict-only rows as an estimate)"
                             % (name, mode))
        settings = dict(row.settings)
        if joint:
            path = os.path.join(profiles, "profile-%s.toml" % row.profile)
            if not os.path.isfile(path):
                raise ValueError("--profiles: %s: no %s" % (name, path))
            settings["budget.profile"] = path
            try:
                resolve_plan_tokens(settings, tokens, scored)
            except EvalError as e:
                raise ValueError(str(e)) from None
        out.append((name, settings))
    for name, spec in configs:
        out.append((name, parse_config(name, spec)))
    return out


def probe(binary: str, workdir: str, name: str, settings: Dict[str, str], tokens: int,
          scored: int, layers: int, kv_heads: int, head_dim: int, seed: int = 0,
          q_heads: int = 0) -> dict:
    """Mean / max / last reserved and mean payload memory vs fp16 over the scored steps."""
    fp16 = lambda t: 2 * 2 * layers * kv_heads * head_dim * t  # noqa: E731
    lossless, other = pool_settings(fp16(tokens))
    pool = lossless if settings.get("quant.lossless") == "true" else other
    daemon = ManagedDaemon(binary, workdir, name, dict(pool, **settings), shm_prefix="kvmem")
    daemon.start()
    rng = np.random.default_rng(seed)
    mem, pay = [], []
    try:
        with kvctl.Client(daemon.endpoint, timeout_ms=600000) as c:
            c.hello(layers=layers, kv_heads=kv_heads, head_dim=head_dim, dtype="float16",
                    q_heads=q_heads)

            def rand(tokens, heads):
                return rng.standard_normal((layers, tokens, heads, head_dim)).astype(np.float16)

            def append(tokens):
                kv = rand(tokens, kv_heads)
                c.append(0, kv, kv, q=rand(tokens, q_heads) if q_heads else None)

            c.open(0)
            prefix = tokens - scored - 1
            append(prefix)
            for _ in range(scored):
                append(1)
                s = c.stats("sequences")["sequences"]
                mem.append(int(s["kv_pool_bytes"]) / fp16(int(s["tokens"])))
                pay.append(int(s["kv_payload_bytes"]) / fp16(int(s["tokens"])))
    finally:
        daemon.stop()
    return {"row": name, "memory_vs_fp16": sum(mem) / len(mem),
            "payload_vs_fp16": sum(pay) / len(pay), "payload_max": max(pay), "memory_max": max(mem),
            "memory_last": mem[-1]}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="", help="kveval quantizer rows, comma-separated")
    ap.add_argument("--config", nargs=2, action="append", default=[], metavar=("NAME", "KEYS"),
                    help="an ad-hoc row: NAME key=value,key=value (daemon config keys)")
    ap.add_argument("--tokens", type=int, default=2048, help="context length (kveval --tokens)")
    ap.add_argument("--scored", type=int, default=128, help="scored steps (kveval --scored)")
    ap.add_argument("--layers", type=int, default=30, help="SmolLM2-135M: 30")
    ap.add_argument("--kv-heads", type=int, default=3, help="SmolLM2-135M: 3")
    ap.add_argument("--head-dim", type=int, default=64, help="SmolLM2-135M: 64")
    ap.add_argument("--evict", action="store_true",
                    help="also evict-only rows, with random Q (an estimate: see above)")
    ap.add_argument("--q-heads", type=int, default=9, help="with --evict; SmolLM2-135M: 9")
    ap.add_argument("--profiles", default="", metavar="DIR",
                    help="with --evict, joint rows too: kvcalib profiles (kveval's "
                    "--calib-profiles, profile-<method>.toml)")
    ap.add_argument("--kvctl-bin", default=os.path.join(REPO, "build", "bin", "kvctl"))
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        if not 1 <= args.scored < args.tokens - 1:
            raise ValueError("--scored: got %d, expected 1..%d (below --tokens %d - 1)"
                             % (args.scored, args.tokens - 2, args.tokens))
        if not os.access(args.kvctl_bin, os.X_OK):
            raise ValueError("--kvctl-bin: %s is not an executable file" % args.kvctl_bin)
        todo = rows_to_probe([r for r in args.rows.split(",") if r], args.config, args.evict,
                             args.profiles, args.tokens, args.scored)
        if not todo:
            raise ValueError("--rows / --config: expected at least one row")
    except ValueError as e:
        print("kveval_memprobe: %s" % e, file=sys.stderr)
        return 1
    workdir = tempfile.mkdtemp(prefix="kvmem-", dir="/tmp")
    try:
        for name, settings in todo:
            r = probe(args.kvctl_bin, workdir, name, settings, args.tokens, args.scored,
                      args.layers, args.kv_heads, args.head_dim,
                      q_heads=args.q_heads if args.evict else 0)
            print("%-28s mem %.4f  payload %.4f  max %.4f  last %.4f" % (
                name, r["memory_vs_fp16"], r["payload_vs_fp16"], r["memory_max"],
                r["memory_last"]), flush=True)
    except DaemonStartError as e:
        print("kveval_memprobe: %s" % e, file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
