# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""The README's demo (`python3 -m kvctl.hf`, python/kvctl/hf_cli.py) with SmolLM2-135M against
real daemons: its baseline comparison and memory figures tell the truth, --send-queries lets an
eviction policy that scores with Q run, and configs/default.toml quantizes most of a demo-sized
sequence. Few generated tokens each. Runs with the HF cache tests (KVCTL_HF_TESTS=1).
"""

import os
import tomllib

import pytest

import hf_common  # noqa: F401  First: skips this module unless the HF tests run.

import torch  # noqa: E402

import kvctl  # noqa: E402
from kvctl import hf_cli  # noqa: E402
from kvctl.hf import KvctlCache  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROMPT = "Name three colours."
SMOLLM2_BYTES_PER_FP16_TOKEN = 30 * 3 * 64 * 2 * 2  # layers x KV heads x head_dim x (K, V) x 2.


def quiet(_message):
    pass


def run(model, tok, endpoint, **kw):
    return hf_cli.run_demo(model, tok, endpoint, PROMPT, kw.pop("max_new_tokens", 6),
                           echo=False, progress=quiet, **kw)


def test_lossless_daemon_matches_the_baseline_exactly(smollm2, _shared_factory):
    model, tok = smollm2
    daemon = _shared_factory(quant__lossless=True, pool__bytes="64MiB")
    r = run(model, tok, daemon.endpoint)
    assert r["first_divergence"] is None
    assert r["top1_agreement"] == 1.0
    assert r["mean_kl"] < 1e-6, r["mean_kl"]
    assert r["text"] == r["baseline_text"]
    assert r["fp16_bytes"] == r["tokens"] * SMOLLM2_BYTES_PER_FP16_TOKEN
    # Lossless float32 rows: the payload is twice fp16, and whole pages are reserved for it.
    assert r["payload_bytes"] == 2 * r["fp16_bytes"]
    assert r["reserved_bytes"] >= r["payload_bytes"]
    summary = hf_cli.format_summary(r)
    assert "identical to it over all" in summary
    assert "pool pages reserved" in summary and "payload" in summary
    assert len(summary.splitlines()) <= 6


def test_two_bit_kivi_is_compared_with_the_baseline(smollm2, _shared_factory):
    """A lossy cache: every quality figure is computed, and they agree with each other."""
    model, tok = smollm2
    # No sinks (set explicitly, not KIVI's default 16): the short demo prompt must reach a flush.
    daemon = _shared_factory(quant__method="kivi", quant__k_bits=2, quant__v_bits=2,
                             quant__sink_tokens=0, quant__flush_tokens=32, pool__bytes="64MiB")
    r = run(model, tok, daemon.endpoint, max_new_tokens=8)
    assert r["tokens_quantized"] >= 32
    assert r["mean_kl"] > 1e-4, "a 2-bit cache gave the uncompressed distribution"
    assert 0.0 <= r["top1_agreement"] <= 1.0
    if r["first_divergence"] is not None:
        assert r["top1_agreement"] < 1.0  # A different greedy token is a top-1 disagreement.
    assert r["payload_bytes"] < r["fp16_bytes"]
    assert r["bits_per_element"] < 16


def test_send_queries_lets_rkv_eviction_run(smollm2, _shared_factory):
    model, tok = smollm2
    daemon = _shared_factory(quant__method="fp16", budget__mode="evict-only",
                             budget__token_fraction=0.5, evict__policy="rkv", evict__sinks=4,
                             evict__window=8, evict__compression_period=8,
                             pool__bytes="64MiB")
    with pytest.raises(kvctl.ServerError, match="q_heads") as refused:
        run(model, tok, daemon.endpoint, baseline=False)
    assert "--send-queries" in hf_cli.explain(refused.value, send_queries=False)
    r = run(model, tok, daemon.endpoint, send_queries=True, max_new_tokens=4)
    assert r["kept_rows"] < r["rows"], "nothing was evicted"
    assert r["policy"]["evict_policy"] == "rkv"
    assert "rkv eviction kept" in hf_cli.format_summary(r)


def test_default_config_quantizes_most_of_a_demo_sized_sequence(smollm2, _shared_factory):
    """configs/default.toml's quantizer on ~380 tokens (the demo's prompt and continuation):
    most tokens end up in quantized records, and the payload is well below fp16."""
    model, _ = smollm2
    with open(os.path.join(REPO, "configs", "default.toml"), "rb") as f:
        quant = tomllib.load(f)["quant"]
    daemon = _shared_factory(pool__bytes="64MiB",
                             **{"quant__" + k: v for k, v in quant.items()})
    ids = torch.randint(100, 40000, (1, 380), generator=torch.Generator().manual_seed(1))
    with KvctlCache(model, daemon.endpoint) as cache, torch.no_grad():
        model(ids, past_key_values=cache)
        seq = cache.stats(section="sequences")["sequences"]
    assert int(seq["tokens_quantized"]) >= 0.75 * 380, seq
    assert float(seq["bits_per_element"]) < 6.0, seq


def test_model_cache_holds_the_gguf_weights_bit_for_bit(smollm2, tmp_path, monkeypatch):
    """load_smollm2's converted copy (the fast path of every load after the first) is the model
    the GGUF file gives: same weights, same tokens, same logits."""
    from kvctl.model import load_smollm2

    monkeypatch.setenv("KVCTL_MODEL_CACHE", str(tmp_path))
    converted, tok_a = load_smollm2()
    cached, tok_b = load_smollm2()
    assert (converted.kvctl_loaded_from, cached.kvctl_loaded_from) == ("gguf", "cache")
    a, b = converted.state_dict(), cached.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    ids = tok_a(PROMPT + " " + hf_common.TEXT, return_tensors="pt").input_ids
    assert torch.equal(ids, tok_b(PROMPT + " " + hf_common.TEXT, return_tensors="pt").input_ids)
    with torch.no_grad():
        assert torch.equal(converted(ids).logits, cached(ids).logits)


def test_command_line_send_queries_runs_an_rkv_daemon_and_explains_the_refusal(_shared_factory):
    """`python3 -m kvctl.hf` as the README runs it: without --send-queries an R-KV daemon refuses
    the sequence and the demo says which flag to add (exit 2); with it the demo runs and prints
    its summary (exit 0)."""
    import subprocess
    import sys

    daemon = _shared_factory(quant__method="fp16", budget__mode="evict-only",
                             budget__token_fraction=0.5, evict__policy="rkv", evict__sinks=4,
                             evict__window=8, evict__compression_period=8,
                             pool__bytes="64MiB")
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"), OMP_WAIT_POLICY="PASSIVE")
    cmd = [sys.executable, "-m", "kvctl.hf", "--endpoint", daemon.endpoint, "--prompt", PROMPT,
           "--max-new-tokens", "3", "--no-baseline", "--threads", "1"]
    refused = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "q_heads" in refused.stderr and "--send-queries" in refused.stderr, refused.stderr
    ran = subprocess.run(cmd + ["--send-queries"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "summary:" in ran.stdout and "pool pages reserved" in ran.stdout, ran.stdout
    assert "queries sent" in ran.stdout
