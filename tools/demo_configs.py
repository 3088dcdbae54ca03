# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Quantizer candidates for configs/default.toml on the README demo's prompt: SmolLM2-135M loads
once, the uncompressed baseline runs once, then per candidate a kvctl daemon started with the
candidate's settings runs kvctl.hf_cli.run_demo against that baseline. Prints one JSON line and
the demo's summary per candidate (the README's table, "Two commands").

    OMP_WAIT_POLICY=PASSIVE python3 tools/demo_configs.py --kvctl-bin build-demo/bin/kvctl
"""

import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "python"))

# name -> config keys (kvctl --set); {} = the built-in defaults.
CANDIDATES = {
    "kvarn2_128sinks_flush128": {},
    "kivi4_flush32": {"quant.method": "kivi", "quant.k_bits": 4, "quant.v_bits": 4,
                      "quant.flush_tokens": 32},
    "kvarn_k4v2_b32_16sinks_flush32": {"quant.method": "kvarn", "quant.k_bits": 4,
                                       "quant.v_bits": 2, "quant.block_tokens": 32,
                                       "quant.sink_tokens": 16, "quant.flush_tokens": 32},
    "kvarn2_b32_16sinks_flush32": {"quant.method": "kvarn", "quant.k_bits": 2, "quant.v_bits": 2,
                                   "quant.block_tokens": 32, "quant.sink_tokens": 16,
                                   "quant.flush_tokens": 32},
    "kivi2_flush32": {"quant.method": "kivi", "quant.k_bits": 2, "quant.v_bits": 2,
                      "quant.flush_tokens": 32},
    "oscar2_flush32": {"quant.method": "oscar", "quant.k_bits": 2, "quant.v_bits": 2,
                       "quant.flush_tokens": 32},
}
FIELDS = ("tokens", "tokens_quantized", "bits_per_element", "fp16_bytes", "reserved_bytes",
          "payload_bytes", "first_divergence", "top1_agreement", "mean_kl", "ppl_under_full",
          "kv_seconds")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvctl-bin", default="build-demo/bin/kvctl")
    ap.add_argument("--max-new-tokens", type=int, default=320)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated candidate names")
    a = ap.parse_args()
    import torch

    from kvctl import hf_cli
    from kvctl.model import load_smollm2
    from kvctl.process import spawn_daemon, wait_until_serving

    torch.set_num_threads(a.threads)
    model, tok = load_smollm2()
    ids = hf_cli.prompt_ids(tok, hf_cli.DEFAULT_PROMPT)
    base, _, seconds = hf_cli.baseline_generate(model, tok, ids, a.max_new_tokens)
    print("baseline: %d new tokens in %.1f s" % (base.shape[1] - ids.shape[1], seconds),
          flush=True)
    work = tempfile.mkdtemp(prefix="kvctl-demo-configs-")
    names = a.only.split(",") if a.only else list(CANDIDATES)
    for name in names:
        endpoint = "ipc://%s/%s.sock" % (work, name)
        settings = {"server.endpoint": endpoint, "server.stats_endpoint": "",
                    "pool.shm_name": "/kvctl-demo-configs-%d-%s" % (os.getpid(), name)}
        settings.update(CANDIDATES[name])
        proc = spawn_daemon(a.kvctl_bin, settings, os.path.join(work, name + ".log"))
        try:
            wait_until_serving(proc, endpoint, 60)
            r = hf_cli.run_demo(model, tok, endpoint, hf_cli.DEFAULT_PROMPT, a.max_new_tokens,
                                baseline=base, echo=False, progress=lambda _: None)
        finally:
            proc.terminate()
            proc.wait()
        out = {k: r[k] for k in FIELDS}
        out["reserved_vs_fp16"] = r["reserved_bytes"] / r["fp16_bytes"]
        out["payload_vs_fp16"] = r["payload_bytes"] / r["fp16_bytes"]
        print(name, json.dumps(out), flush=True)
        print(hf_cli.format_summary(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
