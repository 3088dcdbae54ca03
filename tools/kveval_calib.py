# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval's calibration for the rows that need a kvcalib profile (RateQuant overrides, layer
demand, joint planning, pressure relief curves): K/V/Q dumps of the model on the calibration
text, `kvcalib fit` and `kvcalib plan`. tools/kveval.py calls these once per run.

    dumps = dump_calibration(torch, model, tok, text, "/tmp/calib", 256, 8)
    profile = fit_profile(args, "kivi", profiles, dumps, workdir)   # cached per method
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from typing import Dict, List

from kveval_rows import EvalError, Row


def dump_calibration(torch, model, tokenizer, text: str, out_dir: str, seq_tokens: int,
                     max_seqs: int) -> List[str]:
    """Post-RoPE K, V and Q of every layer for consecutive windows of the calibration text, in
    kvcalib's dump layout (docs/kvcalib.md), float16."""
    import numpy as np
    from transformers import AttentionInterface, DynamicCache
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    captured = {}

    def capture(module, query, key, value, attention_mask, **kw):
        captured[module.layer_idx] = (query[0].transpose(0, 1), key[0].transpose(0, 1),
                                      value[0].transpose(0, 1))
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kw)

    AttentionInterface.register("kveval_dump", capture)
    model.set_attn_implementation("kveval_dump")
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    n = min(max_seqs, len(ids) // seq_tokens)
    if n < 1:
        raise EvalError("calibration text: %d tokens, expected at least %d" % (len(ids),
                                                                               seq_tokens))
    dirs = []
    try:
        for s in range(n):
            captured.clear()
            with torch.no_grad():
                model(ids[None, s * seq_tokens:(s + 1) * seq_tokens],
                      past_key_values=DynamicCache(), use_cache=True)
            seq_dir = os.path.join(out_dir, "seq_%d" % s)
            for layer, (q, k, v) in captured.items():
                d = os.path.join(seq_dir, "layer_%d" % layer)
                os.makedirs(d, exist_ok=True)
                for name, t in (("q", q), ("k", k), ("v", v)):
                    np.save(os.path.join(d, name + ".npy"),
                            t.float().numpy().astype(np.float16))
            dirs.append(seq_dir)
    finally:
        model.set_attn_implementation("sdpa")
    return dirs


def run_tool(args: List[str]) -> str:
    proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise EvalError("%s failed (%d): %s" % (" ".join(args[:2]), proc.returncode,
                                                 proc.stderr.strip() or proc.stdout[-400:]))
    return proc.stdout


def profile_key(method: str, bits: str = "", target: str = "") -> str:
    """The key of a fitted profile in kveval's profile cache: "turbo", "turbo/2,3,4",
    "turbo/3,4/attention" (target "" = kvcalib's default, mse with attention importance)."""
    return "/".join(x for x in (method, bits, target) if x)


def profile_file(key: str) -> str:
    """profile-<method>[-<widths>][-<target>].toml: "turbo/3,4/attention" ->
    profile-turbo-34-attention.toml (every width is one digit: 2, 3, 4, 8)."""
    return "profile-%s.toml" % key.replace("/", "-").replace(",", "")


def profile_key_of_file(name: str) -> str:
    """The inverse of profile_file, for --calib-profiles: profile-turbo-34.toml -> "turbo/3,4"."""
    if not (name.startswith("profile-") and name.endswith(".toml")):
        raise EvalError("--calib-profiles: %s is not a profile-<method>[-<widths>][-<target>].toml"
                        % name)
    method, *rest = name[len("profile-"):-len(".toml")].split("-")
    bits = [",".join(p) for p in rest if p.isdigit()]
    target = [p for p in rest if not p.isdigit()]
    return profile_key(method, bits[0] if bits else "", target[0] if target else "")


def fit_profile(args, method: str, profiles: Dict[str, str], dumps: List[str],
                workdir: str, bits: str = "", target: str = "") -> str:
    """kvcalib fit of `method` on the calibration dumps (RateQuant units and layer demand), over
    the widths `bits` ("2,3,4"; "" = kvcalib's default 2,3,4,8). target "attention": the curves
    fit the measured attention-output error (kvcalib --target attention, uniform importance)
    instead of importance x MSE."""
    key = profile_key(method, bits, target)
    if key not in profiles:
        path = os.path.join(workdir, profile_file(key))
        extra = []
        if getattr(args, "calib_decode_flush", None) is not None:
            extra = ["--decode-flush", str(args.calib_decode_flush)]
        if getattr(args, "calib_absolute_errors", False):
            extra.append("--absolute-errors")
        if bits:
            extra += ["--bits", bits]
        if target:
            extra += ["--target", target, "--importance", "uniform"]
        run_tool([args.kvcalib_bin, "fit", "--input"] + dumps + ["--method", method,
                                                                  "--out", path] + extra)
        profiles[key] = path
    return profiles[key]


def ratequant_budget_bpe(lowest_bpe: float, code_bits: float, bits: str) -> float:
    """The b/e budget of code_bits average code bits, given the b/e of the all-narrowest plan
    (kvcalib's lower end): every method's metadata per element does not depend on the width, so
    the budget is lowest_bpe plus the code bits above the narrowest fitted width (2 unless `bits`,
    "3,4", names others; "" = kvcalib's default widths, which start at 2)."""
    lowest = min(int(b) for b in bits.split(",")) if bits else 2
    if code_bits < lowest:
        raise EvalError("ratequant code_bits: got %g, expected at least %d, the narrowest of "
                        "the fitted widths %s" % (code_bits, lowest, bits or "2,..."))
    return lowest_bpe + code_bits - lowest


def ratequant_config(args, row: Row, profiles: Dict[str, str], dumps: List[str],
                     workdir: str) -> str:
    """A daemon config file: [quant] of the row plus kvcalib's per-head overrides for
    code_bits average code bits (b/e = the method's b/e at the narrowest fitted width w +
    code_bits - w; w = 2 unless rq["bits"] starts higher)."""
    rq = row.ratequant
    method = rq["method"]
    profile = fit_profile(args, method, profiles, dumps, workdir, rq.get("bits", ""),
                          rq.get("target", ""))
    # The b/e at the narrowest fitted width: kvcalib refuses a budget outside the widths' range and
    # names the range ("expected 2.5625..4.5625 for kvarn").
    proc = subprocess.run([args.kvcalib_bin, "plan", "--profile", profile, "--budget-bpe", "0.01",
                           "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found = re.search(r"expected ([0-9.]+)\.\.([0-9.]+)", proc.stderr)
    if not found:
        raise EvalError("kvcalib plan: no b/e range in %r" % proc.stderr.strip())
    budget = ratequant_budget_bpe(float(found.group(1)), rq["code_bits"], rq.get("bits", ""))
    overrides = os.path.join(workdir, "overrides-%s.toml" % row.name)
    plan = [args.kvcalib_bin, "plan", "--profile", profile, "--budget-bpe",
            "%.6f" % budget, "--json", "--overrides-toml", overrides]
    if rq.get("beta"):
        plan += ["--beta-override", str(rq["beta"])]
    report = json.loads(run_tool(plan))
    row.note = ("%s; kvcalib plan b/e %.4f (requested %.4f), beta_k %.3g beta_v %.3g"
                % (row.note, report["budget"]["achieved_bpe"], budget, report["beta_k"],
                   report["beta_v"])).strip("; ")
    config = os.path.join(workdir, "config-%s.toml" % row.name)
    with open(config, "w") as f:
        f.write(open(overrides).read())
    return config
