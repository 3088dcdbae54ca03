# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""KvctlCache (python/kvctl/hf_cache.py) with SmolLM2-135M against real daemons.

Loads the model once per test session (~20 s). Runs only with KVCTL_HF_TESTS=1 (the CTest
"pytest: hf cache" sets it) so the client suite stays fast; skipped when the model stack or the
GGUF file is not installed (tools/setup.sh installs them).
"""

import os

import pytest

from hf_common import TEXT, forward_loop  # First: skips this module unless the HF tests run.

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import kvctl  # noqa: E402
from kvctl.hf import KvctlCache  # noqa: E402


@pytest.fixture(scope="session")
def tokens(smollm2):
    _, tok = smollm2
    # 70 prefill tokens, then 48 one-token steps: past a 32-token flush and several eviction
    # rounds (150 tokens checked nothing more and took a third longer).
    ids = tok(TEXT * 3, return_tensors="pt").input_ids
    assert ids.shape[1] >= 118
    return ids[:, :118]


@pytest.fixture(scope="session")
def reference(smollm2, tokens):
    model, _ = smollm2
    model.set_attn_implementation("sdpa")
    return forward_loop(model, DynamicCache(), tokens, prefill=70)


@pytest.fixture(scope="session")
def hf_daemons(_shared_factory):
    """Lossless and two quantizing daemons with short flush periods (many flushes)."""
    return {
        "lossless": _shared_factory(quant__lossless=True, pool__bytes="64MiB"),
        "kivi2": _shared_factory(quant__method="kivi", quant__k_bits=2, quant__v_bits=2,
                                 pool__bytes="64MiB", quant__flush_tokens=32),
        "kvarn2": _shared_factory(quant__method="kvarn", quant__k_bits=2, quant__v_bits=2,
                                  quant__block_tokens=32, quant__sink_tokens=16,
                                  quant__flush_tokens=32, pool__bytes="64MiB"),
        "kivi8": _shared_factory(quant__method="kivi", quant__k_bits=8, quant__v_bits=8,
                                 pool__bytes="64MiB"),
    }


def test_lossless_forward_loop_equals_dynamic_cache(smollm2, tokens, reference, hf_daemons):
    model, _ = smollm2
    with KvctlCache(model, hf_daemons["lossless"].endpoint) as cache:
        got = forward_loop(model, cache, tokens, prefill=70)
        assert cache.seqs[0].rounding == "exact"
        assert cache.counters["fetches"] == 1  # Only after the prefill: nothing ever changes.
        stats = cache.stats(section="sequences")["sequences"]
        assert stats["tokens"] == tokens.shape[1]
    diff = (got - reference).abs().max().item()
    assert diff <= 1e-4, diff


def test_lossless_generate_equals_dynamic_cache(smollm2, tokens, hf_daemons):
    model, _ = smollm2
    prompt = tokens[:, :40]
    model.set_attn_implementation("sdpa")
    ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24,
                         do_sample=False, past_key_values=DynamicCache(), output_logits=True,
                         return_dict_in_generate=True, pad_token_id=0)
    with KvctlCache(model, hf_daemons["lossless"].endpoint) as cache:
        got = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24,
                             do_sample=False, past_key_values=cache, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    assert torch.equal(got.sequences, ref.sequences)
    diff = max((a - b).abs().max().item() for a, b in zip(got.logits, ref.logits))
    assert diff <= 1e-4, diff


@pytest.mark.parametrize("name", ["kivi2", "kvarn2"])
def test_quantized_differs_but_stays_close_and_mirror_equals_refetch(
        smollm2, tokens, reference, hf_daemons, name):
    model, _ = smollm2
    with KvctlCache(model, hf_daemons[name].endpoint) as cache:
        got = forward_loop(model, cache, tokens, prefill=70)
        assert cache.seqs[0].rounding == "fp16"
        assert cache.seqs[0].tokens_quantized > 0
        mirrored_fetches = cache.counters["fetches"]
    with KvctlCache(model, hf_daemons[name].endpoint, refetch="always") as cache:
        always = forward_loop(model, cache, tokens, prefill=70)
        assert cache.counters["fetches"] == tokens.shape[1] - 70
    assert mirrored_fetches < tokens.shape[1] - 70
    # Skipping fetches between flushes must not change a single bit.
    assert torch.equal(got, always)
    diff = (got - reference).abs().max().item()
    assert diff > 1e-3, "quantized cache gave DynamicCache's logits"
    agree = (got.argmax(-1) == reference.argmax(-1)).float().mean().item()
    assert agree >= 0.6, agree


def test_eight_bit_is_nearly_lossless(smollm2, tokens, reference, hf_daemons):
    model, _ = smollm2
    with KvctlCache(model, hf_daemons["kivi8"].endpoint) as cache:
        got = forward_loop(model, cache, tokens, prefill=70)
    ref_lp = torch.log_softmax(reference, -1)
    kl = (ref_lp.exp() * (ref_lp - torch.log_softmax(got, -1))).sum(-1).mean().item()
    assert kl < 1e-3, kl
    assert torch.equal(got.argmax(-1), reference.argmax(-1))


def test_batch_elements_are_independent_sequences(smollm2, tokens, reference, hf_daemons):
    model, _ = smollm2
    ids = tokens.expand(2, -1)
    with KvctlCache(model, [hf_daemons["lossless"].endpoint,
                            hf_daemons["kivi2"].endpoint]) as cache:
        got = []
        with torch.no_grad():
            o = model(ids[:, :70], past_key_values=cache, use_cache=True)
            got.append(o.logits[:, -1])
            for i in range(70, ids.shape[1]):
                got.append(model(ids[:, i:i + 1], past_key_values=cache).logits[:, -1])
        got = torch.stack(got, 1)
        assert [s.rounding for s in cache.seqs] == ["exact", "fp16"]
    assert (got[0] - reference).abs().max().item() <= 1e-4
    assert (got[1] - reference).abs().max().item() > 1e-3


def test_daemon_down_raises_timeout(smollm2, workdir):
    model, _ = smollm2
    endpoint = "ipc://" + os.path.join(workdir, "nobody-listens.sock")
    with pytest.raises(kvctl.Timeout, match="no reply"):
        KvctlCache(model, endpoint, timeout_ms=300)


def test_batch_size_mismatch_is_refused(smollm2, tokens, hf_daemons):
    model, _ = smollm2
    with KvctlCache(model, hf_daemons["lossless"].endpoint) as cache:
        with pytest.raises(ValueError, match="batch size 2, expected 1"):
            with torch.no_grad():
                model(tokens[:, :8].expand(2, -1), past_key_values=cache)
        assert cache.appended == 0 and cache.get_seq_length() == 0  # Nothing half-sent.


@pytest.mark.parametrize("policy", ["h2o", "snapkv"])
def test_split_prefill_is_flagged_and_keeps_what_one_append_keeps(smollm2, tokens,
                                                                 _shared_factory, monkeypatch,
                                                                 policy):
    """A prefill split into several APPENDs (a small _MAX_APPEND_BYTES) flags all but the last
    APPEND_CONTINUES, so the daemon evicts once: the logits equal those of one APPEND, bit for
    bit (unflagged pieces would evict the first with its own last queries). Inline: the test
    daemons' staging slots would split the prefill by themselves."""
    import kvctl.hf_cache as hf_cache
    model, _ = smollm2
    daemon = _shared_factory(quant__method="fp16", budget__mode="evict-only",
                             budget__token_fraction=0.25, evict__policy=policy, evict__sinks=4,
                             evict__window=16, evict__obs_window=16, evict__compression_period=4,
                             pool__bytes="64MiB")
    with KvctlCache(model, daemon.endpoint, send_q=True, use_staging=False) as cache:
        whole = forward_loop(model, cache, tokens, prefill=70)
        assert cache.counters["appends_continued"] == 0
    # About 25 tokens per APPEND: 70 prefill tokens in 3 APPENDs, the first 2 flagged.
    per_token = sum(2 * l.k_proj.out_features + l.q_proj.out_features
                    for l in (layer.self_attn for layer in model.model.layers)) * 4
    monkeypatch.setattr(hf_cache, "_MAX_APPEND_BYTES", per_token * 25)
    with KvctlCache(model, daemon.endpoint, send_q=True, use_staging=False) as cache:
        split = forward_loop(model, cache, tokens, prefill=70)
        assert cache.counters["appends_continued"] == 2
        seq = cache.stats(section="sequences")["sequences"]
        assert int(seq["tokens_evicted_total"]) > 0 and int(seq["tokens_deferred"]) == 0
    assert torch.equal(whole, split)


def test_prefill_larger_than_the_staging_slot_goes_through_it_in_pieces(smollm2, tokens,
                                                                      _shared_factory):
    """A prefill that does not fit the session's staging slot is written into it in slot-sized
    APPENDs, all but the last flagged APPEND_CONTINUES, instead of travelling inline: the logits
    equal those of the same prefill sent inline, bit for bit, and the daemon evicts once."""
    model, _ = smollm2
    daemon = _shared_factory(quant__method="kivi", quant__k_bits=2, quant__v_bits=2,
                             budget__mode="evict-only", budget__token_fraction=0.5,
                             evict__policy="snapkv", evict__sinks=4, evict__window=16,
                             evict__obs_window=16, evict__compression_period=4,
                             pool__bytes="64MiB", pool__staging_bytes_per_session="1MiB")
    with KvctlCache(model, daemon.endpoint, send_q=True, use_staging=False) as cache:
        inline = forward_loop(model, cache, tokens, prefill=70)
        assert cache.counters["appends_staged"] == 0 and cache.counters["appends_continued"] == 0
    per_token = sum(2 * l.k_proj.out_features + l.q_proj.out_features
                    for l in (layer.self_attn for layer in model.model.layers)) * 4
    pieces = -(-70 // ((1 << 20) // per_token))
    assert pieces > 2
    with KvctlCache(model, daemon.endpoint, send_q=True) as cache:
        staged = forward_loop(model, cache, tokens, prefill=70)
        assert cache.counters["appends_continued"] == pieces - 1
        assert cache.counters["appends_staged"] == cache.counters["appends"]
        assert all(seq.client.staging_fallbacks == 0 for seq in cache.seqs)
        assert cache.seqs[0].session.staging_tokens(per_token) == (1 << 20) // per_token
        seq = cache.stats(section="sequences")["sequences"]
        assert int(seq["tokens_evicted_total"]) > 0 and int(seq["tokens_deferred"]) == 0
    assert torch.equal(inline, staged)


@pytest.mark.parametrize("policy,stagger", [("streaming", False), ("snapkv", False),
                                            ("snapkv", True)])
def test_evicting_daemon_masks_and_mirror_equals_refetch(smollm2, tokens, reference,
                                                         _shared_factory, policy, stagger):
    """evict-only budgets: heads hold fewer, different tokens; refetching only the layers whose
    eviction counters moved gives bit-identical logits to refetching every step."""
    model, _ = smollm2
    daemon = _shared_factory(quant__method="fp16", budget__mode="evict-only",
                             budget__token_fraction=0.5, evict__policy=policy,
                             evict__sinks=4, evict__window=32, evict__compression_period=8,
                             evict__stagger_layers=stagger, pool__bytes="64MiB")
    send_q = policy != "streaming"
    with KvctlCache(model, daemon.endpoint, send_q=send_q) as cache:
        got = forward_loop(model, cache, tokens, prefill=70)
        seq = cache.stats(section="sequences")["sequences"]
        assert int(seq["tokens_evicted_total"]) > 0
        assert cache.seqs[0].evicting
        fetches, fetched_layers = cache.counters["fetches"], cache.counters["fetched_layers"]
        counts = []
        for layer in cache.layers:
            for h in range(cache.kv_heads):
                bias = layer.hold_bias
                counts.append(cache.appended if bias is None else
                              int(torch.isfinite(bias[0, h, 0, :cache.appended]).sum()))
    assert min(counts) < tokens.shape[1] * 0.75, counts
    with KvctlCache(model, daemon.endpoint, send_q=send_q, refetch="always") as cache:
        always = forward_loop(model, cache, tokens, prefill=70)
    steps = tokens.shape[1] - 70
    if stagger:
        # Layers take turns: some layer changes on most steps, and only those are fetched again.
        layers = model.config.num_hidden_layers
        assert fetched_layers < steps * layers / 2, (fetches, fetched_layers)
    else:
        # Every layer compresses on the same steps: most steps refetch nothing.
        assert fetches < steps
    assert torch.equal(got, always)
    agree = (got.argmax(-1) == reference.argmax(-1)).float().mean().item()
    assert agree >= 0.5, agree


def test_generate_after_daemon_kill9_raises_session_lost_then_the_cache_works(
        smollm2, tokens, daemon_factory):
    """The daemon is killed with SIGKILL between two generate() calls and started again with the
    same settings: continuing raises SessionLostError (no crash, no attention to lost rows), and
    the same cache then generates from a prompt exactly like DynamicCache."""
    model, _ = smollm2
    prompt = tokens[:, :40]
    ones = torch.ones_like(prompt)
    model.set_attn_implementation("sdpa")
    ref = model.generate(prompt, attention_mask=ones, max_new_tokens=8, do_sample=False,
                         past_key_values=DynamicCache(), pad_token_id=0)
    d = daemon_factory(quant__lossless=True, pool__bytes="64MiB")
    with KvctlCache(model, d.endpoint) as cache:
        first = model.generate(prompt, attention_mask=ones, max_new_tokens=8, do_sample=False,
                               past_key_values=cache, pad_token_id=0)
        assert torch.equal(first, ref)
        held = cache.get_seq_length()
        assert held >= 40
        d.crash()
        d.start()
        with pytest.raises(kvctl.SessionLostError) as e:
            model.generate(first, attention_mask=torch.ones_like(first), max_new_tokens=4,
                           do_sample=False, past_key_values=cache, pad_token_id=0)
        assert e.value.tokens_lost == held
        assert "restart the generation" in str(e.value)
        assert cache.get_seq_length() == 0
        again = model.generate(prompt, attention_mask=ones, max_new_tokens=8, do_sample=False,
                               past_key_values=cache, pad_token_id=0)
        assert torch.equal(again, ref)
