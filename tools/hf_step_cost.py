#!/usr/bin/env python3
# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""What kvctl costs per decode step of a real engine: SmolLM2-135M through HF transformers with
kvctl.hf.KvctlCache (fused attention by default), against the same steps with transformers'
DynamicCache, in one run (issue 14: daemon CPU per decode step <= 5 % of the engine's step).

    python3 tools/hf_step_cost.py [--context 2048] [--steps 64] [--set quant.method=kivi] [--json]
    python3 tools/hf_step_cost.py --send-q --set budget.mode=evict-only --set evict.policy=snapkv ...

Per step it reports the engine's wall time (kvctl and DynamicCache), the engine process's CPU
time, and the daemon's CPU time (the run time of the daemon's threads from /proc, over the timed
steps, divided by the steps): what a core beside the engine spends serving it. The daemon is a
real kvctl process on a private endpoint; the tokens are a real text (forced, not generated), so
both caches see the same inputs.
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

DEFAULT_TEXT = "/usr/share/common-licenses/GPL-3"


def process_cpu_seconds(pid: int) -> float:
    """CPU time of a process's threads: the run time in /proc/PID/task/*/schedstat (nanoseconds),
    or utime + stime of /proc/PID/stat (clock ticks, 10 ms) where schedstat is missing. Threads
    that exited are not counted by the first; the daemon's threads live as long as it does."""
    total, found = 0, False
    try:
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                    total += int(f.read().split()[0])
                    found = True
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        pass
    if found:
        return total / 1e9
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command: utime and stime are fields 14 and 15 (1-based) of the whole line.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_decode(model, cache, ids, context, steps, daemon_pid=None):
    """Prefills `context` tokens, then `steps` single-token forwards; per step: the wall and CPU
    time of this process and the daemon's CPU seconds (read after each step, so a step's figure
    also holds what the daemon's background threads did meanwhile); and the prefill's wall
    seconds (with a KvctlCache, its APPENDs included)."""
    import torch
    walls, cpus, daemon = [], [], []
    with torch.no_grad():
        w0 = time.perf_counter()
        model(ids[:, :context], past_key_values=cache, use_cache=True)
        prefill = time.perf_counter() - w0
        last = process_cpu_seconds(daemon_pid) if daemon_pid else 0.0
        for i in range(context, context + steps):
            w0, c0 = time.perf_counter(), time.process_time()
            model(ids[:, i:i + 1], past_key_values=cache, use_cache=True)
            walls.append(time.perf_counter() - w0)
            cpus.append(time.process_time() - c0)
            if daemon_pid:
                now = process_cpu_seconds(daemon_pid)
                daemon.append(now - last)
                last = now
    return walls, cpus, daemon, prefill


def summary(xs):
    return {"p50_ms": 1e3 * statistics.median(xs), "mean_ms": 1e3 * statistics.fmean(xs),
            "max_ms": 1e3 * max(xs)}


def measure(model, ids, context, steps, attention, settings, kvctl_bin, send_q=False,
            settle_steps=0):
    """The figures of one run (the JSON object main prints): `ids` [1, >= context + steps]. With
    settle_steps K (0 < K < steps - 1) the steps after the first K + 1 are also reported apart:
    with a fixed budget or token_fraction <= 0.5, past one compression period every layer has
    compressed once since the prefill (above 0.5 the layers take turns over a longer interval,
    controller/sequence/eviction_driver.h StaggerInterval, so a run needs that many steps to see
    each layer's turn), and an evicting scorer's state built for the decode (R-KV's carried
    partners) is in use."""
    from transformers import DynamicCache
    from kvctl.hf import KvctlCache
    from kvctl.process import ManagedDaemon

    base_walls, base_cpus, _, base_prefill = timed_decode(model, DynamicCache(), ids, context,
                                                          steps)
    with tempfile.TemporaryDirectory(prefix="kvctl-stepcost-") as workdir:
        daemon = ManagedDaemon(kvctl_bin, workdir, "stepcost", settings).start()
        try:
            with KvctlCache(model, daemon.endpoint, attention=attention, fused_min_tokens=1,
                            send_q=send_q) as cache:
                walls, cpus, daemon_cpus, prefill = timed_decode(model, cache, ids, context,
                                                                 steps, daemon.proc.pid)
                fused_steps = cache.counters["fused_steps"]
                block_fetches = cache.counters["block_fetches"]
        finally:
            daemon.stop()
    per_step = statistics.fmean(daemon_cpus)
    # The first decode step is not like the others (the engine fetches every layer's blocks,
    # the daemon answers for the whole prefilled context): reported on its own as well.
    later = daemon_cpus[1:] or daemon_cpus
    later_walls = walls[1:] or walls
    out = {
        "model": "SmolLM2-135M-Instruct", "context": context, "steps": steps,
        "attention": attention, "fused_steps": fused_steps, "block_fetches": block_fetches,
        "send_q": send_q, "settings": dict(settings),
        "cpu": cpu_model(), "cpus": os.cpu_count(), "load_end": os.getloadavg()[0],
        "dynamic_cache_step": summary(base_walls),
        "dynamic_cache_cpu_ms": 1e3 * statistics.fmean(base_cpus),
        "kvctl_step": summary(walls), "kvctl_engine_cpu_ms": 1e3 * statistics.fmean(cpus),
        "daemon_cpu_ms_per_step": 1e3 * per_step,
        "daemon_cpu_step": summary(daemon_cpus),
        "daemon_cpu_first_step_ms": 1e3 * daemon_cpus[0],
        # The prefill forward's wall time, and the first step's: the engine's step plus the wait
        # for the prefill's APPEND replies (the adapter sends them after the forward's last layer).
        "dynamic_cache_prefill_s": base_prefill,
        "kvctl_prefill_s": prefill,
        "dynamic_cache_first_step_ms": 1e3 * base_walls[0],
        "kvctl_first_step_ms": 1e3 * walls[0],
        "daemon_cpu_ms_per_later_step": 1e3 * statistics.fmean(later),
        "daemon_cpu_later_vs_engine_step": statistics.fmean(later) / statistics.fmean(later_walls),
        "daemon_cpu_vs_engine_step": per_step / statistics.fmean(walls),
        "daemon_cpu_vs_dynamic_cache_step": per_step / statistics.fmean(base_walls),
        "daemon_cpu_ms_by_step": [1e3 * c for c in daemon_cpus],
        "target": 0.05,
    }
    if 0 < settle_steps < steps - 1:
        settled = daemon_cpus[settle_steps + 1:]
        out["settle_steps"] = settle_steps
        out["daemon_cpu_ms_per_settled_step"] = 1e3 * statistics.fmean(settled)
        out["daemon_cpu_settled_vs_engine_step"] = (
            statistics.fmean(settled) / statistics.fmean(walls[settle_steps + 1:]))
    out["met"] = out["daemon_cpu_vs_engine_step"] <= out["target"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=2048, help="tokens prefilled before timing")
    p.add_argument("--steps", type=int, default=64, help="timed single-token decode steps")
    p.add_argument("--attention", default="fused", choices=("fused", "dense", "auto"),
                   help="KvctlCache attention (default fused)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="daemon config setting (repeatable); the daemon's built-in default else")
    p.add_argument("--kvctl-bin", default=os.path.join(os.path.dirname(HERE), "build", "bin",
                                                        "kvctl"))
    p.add_argument("--text", default=DEFAULT_TEXT, help="a UTF-8 text file (default GPL-3)")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    p.add_argument("--send-q", action="store_true",
                   help="send each step's queries with its APPEND (what the h2o, snapkv and rkv "
                        "eviction scorers need: OPEN of such a sequence is refused without them)")
    p.add_argument("--settle-steps", type=int, default=0, metavar="K",
                   help="also report the steps after the first K + 1 apart (K = "
                        "evict.compression_period: with token_fraction <= 0.5 every layer has "
                        "compressed once since the prefill)")
    p.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = p.parse_args(argv)
    if args.context < 1 or args.steps < 1:
        p.error("--context and --steps must be >= 1, got %d and %d" % (args.context, args.steps))
    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            p.error("--set: got %r, expected KEY=VALUE" % item)
        settings[key] = value

    import torch
    from kvctl.model import load_smollm2

    torch.set_num_threads(args.threads)
    model, tokenizer = load_smollm2()
    with open(args.text, encoding="utf-8") as f:
        ids = tokenizer(f.read(), return_tensors="pt").input_ids
    need = args.context + args.steps
    if ids.shape[1] < need:
        p.error("--text has %d tokens, expected at least --context + --steps = %d"
                % (ids.shape[1], need))
    out = measure(model, ids[:, :need], args.context, args.steps, args.attention, settings,
                  args.kvctl_bin, args.send_q, args.settle_steps)
    out["threads"] = args.threads
    engine = out["kvctl_step"]
    fused_steps = out["fused_steps"]
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print("SmolLM2-135M, %d-token context, %d decode steps, attention %s (%d fused steps), "
          "%d torch thread(s), %s" % (args.context, args.steps, args.attention, fused_steps,
                                      args.threads, out["cpu"]))
    print("%-28s %9s %9s %9s" % ("", "p50 ms", "mean ms", "max ms"))
    for name, s in (("DynamicCache step", out["dynamic_cache_step"]), ("kvctl step", engine)):
        print("%-28s %9.2f %9.2f %9.2f" % (name, s["p50_ms"], s["mean_ms"], s["max_ms"]))
    print("daemon CPU per step: %.3f ms = %.2f %% of the kvctl step (target <= 5 %%: %s), "
          "%.2f %% of DynamicCache's" % (out["daemon_cpu_ms_per_step"],
                                         100 * out["daemon_cpu_vs_engine_step"],
                                         "met" if out["met"] else "MISS",
                                         100 * out["daemon_cpu_vs_dynamic_cache_step"]))
    print("daemon CPU of the first step %.1f ms; of the later steps %.3f ms = %.2f %% of their "
          "kvctl step (p50 %.3f ms, max %.1f ms over all steps)"
          % (out["daemon_cpu_first_step_ms"], out["daemon_cpu_ms_per_later_step"],
             100 * out["daemon_cpu_later_vs_engine_step"], out["daemon_cpu_step"]["p50_ms"],
             out["daemon_cpu_step"]["max_ms"]))
    if "settle_steps" in out:
        print("daemon CPU of the steps after the first %d: %.3f ms = %.2f %% of their kvctl step"
              % (out["settle_steps"] + 1, out["daemon_cpu_ms_per_settled_step"],
                 100 * out["daemon_cpu_settled_vs_engine_step"]))
    return 0


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    sys.exit(main())
