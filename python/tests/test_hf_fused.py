# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""KvctlCache(attention="fused", and "auto") with SmolLM2-135M (9 q heads, 3 KV heads) against real daemons:
decode steps attend with the kvctl torch extension on the daemon's records (blocks FETCH, zero-copy
pool views) and must give dense mode's logits.

Runs with KVCTL_HF_TESTS=1 (the CTest "pytest: hf cache", `-k test_hf`). The extension is taken
from $KVCTL_TORCH_LIB, else build/lib next to $KVCTL_BIN's bin/, else <repo>/build/lib; the module
is skipped (with the reason) when it, the model stack or the GGUF file is missing.
"""

import os

import pytest

from hf_common import TEXT, forward_loop  # First: skips this module unless the HF tests run.

import torch  # noqa: E402

import kvctl  # noqa: E402

from kvctl import torch_ops  # noqa: E402
from kvctl.hf import KvctlCache  # noqa: E402


def _load_extension():
    bin_path = os.environ.get("KVCTL_BIN")
    if not os.environ.get("KVCTL_TORCH_LIB") and bin_path:
        near = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(bin_path))),
                            "lib", "libkvctl_torch.so")
        if os.path.exists(near):
            return torch_ops.load(near)
    return torch_ops.load()


try:
    _load_extension()
except RuntimeError as e:
    pytest.skip("fused attention needs the kvctl torch extension: %s" % e,
                allow_module_level=True)

PREFILL = 70
TOTAL = 134          # 64 teacher-forced decode steps; flush_tokens 32 below: several flushes.
# Fused attention output vs float64 attention over the same daemon rows (observed ~5e-6).
ATTENTION_TOLERANCE = 1e-4
# Logits, fused vs dense end to end (different daemon contents, see the test; observed <= 0.75).
LOGIT_TOLERANCE = 2.0


@pytest.fixture(scope="session")
def tokens(smollm2):
    _, tok = smollm2
    ids = tok(TEXT * 3, return_tensors="pt").input_ids
    assert ids.shape[1] >= TOTAL
    return ids[:, :TOTAL]


DAEMONS = {
    "kivi2": dict(quant__method="kivi", quant__k_bits=2, quant__v_bits=2,
                  quant__flush_tokens=32),
    "kvarn2": dict(quant__method="kvarn", quant__k_bits=2, quant__v_bits=2,
                   quant__block_tokens=32, quant__sink_tokens=16, quant__flush_tokens=32),
    # Ragged heads: streaming eviction drops different tokens per head out of the records.
    "streaming": dict(quant__method="kivi", quant__k_bits=2, quant__v_bits=2,
                      quant__flush_tokens=32, budget__mode="evict-only",
                      budget__token_fraction=0.5, evict__policy="streaming", evict__sinks=4,
                      evict__window=32, evict__compression_period=8),
}


def _check_against_daemon_state(monkeypatch, errors):
    """Wraps the fused attention: every call is also computed in float64 by softmax attention
    over the same layer's dense FETCH (the daemon's dequantized rows, per head, ragged when
    evicted) plus the step's own K/V; the max abs difference of each call goes to `errors`."""
    fused = KvctlCache._fused_attention
    fetched = {}

    def checked(self, layer, query, key, value, attention_mask, scaling):
        out, weights = fused(self, layer, query, key, value, attention_mask, scaling)
        seq = self.seqs[0]
        if layer.index == 0:  # One dense FETCH of every layer per step (nothing changes).
            fetched["res"] = seq.client.fetch(seq.sequence_id, dtype="float32")
        res = fetched["res"]
        heads, l = key.shape[1], layer.index
        g = query.shape[1] // heads
        worst = 0.0
        for h in range(heads):
            k = torch.cat([torch.from_numpy(res.k[l][h]), key[0, h, -1:]]).double()
            v = torch.cat([torch.from_numpy(res.v[l][h]), value[0, h, -1:]]).double()
            q = query[0, h * g:(h + 1) * g, 0].double()
            ref = torch.softmax(scaling * q @ k.T, -1) @ v
            worst = max(worst, (out[0, 0, h * g:(h + 1) * g].double() - ref).abs().max().item())
        errors.append(worst)
        return out, weights

    monkeypatch.setattr(KvctlCache, "_fused_attention", checked)


@pytest.mark.parametrize("name", ["kivi2", "kvarn2", "streaming"])
def test_hf_fused_decode_equals_dense(smollm2, tokens, _shared_factory, monkeypatch, name):
    model, _ = smollm2
    n_layers = model.config.num_hidden_layers
    daemon = _shared_factory(pool__bytes="64MiB", **DAEMONS[name])
    errors = []
    with monkeypatch.context() as m:
        _check_against_daemon_state(m, errors)
        with KvctlCache(model, daemon.endpoint, attention="fused") as cache:
            fused = forward_loop(model, cache, tokens, PREFILL)
            assert cache.counters["fused_steps"] == TOTAL - PREFILL
            assert cache.counters["fetches"] == 0  # No dense copy was fetched.
            seq = cache.stats(section="sequences")["sequences"]
            if name == "streaming":
                assert int(seq["tokens_evicted_total"]) > 0
                assert cache.counters["block_reuses"] == 0  # Evicting: refetched every step.
            else:  # The prefill's APPEND flushed once; decode steps crossed more flushes.
                assert cache.counters["flushes"] >= 2, cache.counters
                # Between flushes the cached blocks FETCH is reused, the new rows added to it.
                assert cache.counters["block_reuses"] > 0, cache.counters
                assert (cache.counters["block_fetches"] + cache.counters["block_reuses"]
                        >= TOTAL - PREFILL), cache.counters
    # Every layer of every decode step: fused == attention over what the daemon holds.
    assert len(errors) == (TOTAL - PREFILL) * n_layers
    print("%s: fused attention vs float64 attention on the daemon's rows: max abs %.3g"
          % (name, max(errors)))
    assert max(errors) <= ATTENTION_TOLERANCE, (name, max(errors))
    if name == "streaming":
        return
    # End to end against dense mode: not bit-equal, because ~1e-6 differences in one step's
    # attention move the next tokens' K/V across fp16 and 2-bit rounding boundaries in the
    # daemon (dense mode at another thread count diverges the same way).
    with KvctlCache(model, daemon.endpoint, attention="dense") as cache:
        dense = forward_loop(model, cache, tokens, PREFILL)
    diff = (fused - dense).abs().max().item()
    agree = (fused.argmax(-1) == dense.argmax(-1)).float().mean().item()
    print("%s: fused vs dense logits: max abs diff %.3g, argmax agreement %.3f"
          % (name, diff, agree))
    assert diff <= LOGIT_TOLERANCE and agree >= 0.95, (name, diff, agree)


def test_hf_fused_per_head_widths(smollm2, tokens, daemon_factory, workdir, monkeypatch):
    """[[quant.override]] gives KV head 1 of layer 0 4-bit records (its own layout in the blocks
    reply): that head is attended in its own kernel call, still equal to the daemon's rows."""
    from helpers import kvctl_binary

    model, _ = smollm2
    config = os.path.join(workdir, "hf-override.toml")
    with open(config, "w") as f:
        f.write('[quant]\nmethod = "kvarn"\nblock_tokens = 32\nsink_tokens = 16\n'
                'flush_tokens = 32\n\n[[quant.override]]\nlayer = 0\nhead = 1\nk_bits = 4\n'
                'v_bits = 4\n')
    wrapper = os.path.join(workdir, "kvctl-hf-override.sh")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nexec "%s" --config "%s" "$@"\n' % (kvctl_binary(), config))
    os.chmod(wrapper, 0o755)
    monkeypatch.setenv("KVCTL_BIN", wrapper)
    daemon = daemon_factory(pool__bytes="64MiB")
    errors = []
    _check_against_daemon_state(monkeypatch, errors)
    with KvctlCache(model, daemon.endpoint, attention="fused") as cache:
        forward_loop(model, cache, tokens, PREFILL)
        blocks = cache.seqs[0].blocks
        widths = [blocks.layouts[i].k_bits for i in blocks.layout_index.tolist()[:4]]
        assert widths == [2, 4, 2, 2], widths
        assert cache.counters["flushes"] >= 2
    assert max(errors) <= ATTENTION_TOLERANCE, max(errors)


def test_hf_fused_multi_token_step_after_decode_refetches_dense(smollm2, tokens,
                                                                _shared_factory):
    """A chunk of several tokens after fused decode steps attends on a refetched dense mirror
    (the fused steps left it stale)."""
    model, _ = smollm2
    daemon = _shared_factory(pool__bytes="64MiB", **DAEMONS["kivi2"])
    with KvctlCache(model, daemon.endpoint, attention="fused") as cache, torch.no_grad():
        for a, b in [(0, 40), (40, 41), (41, 42), (42, 60)]:
            model(tokens[:, a:b], past_key_values=cache)
        assert cache.counters["fused_steps"] == 2 and cache.counters["fetches"] == 1
        res = cache.client.fetch(cache.sequence_id, dtype="float32", stacked=True)
        for layer in (0, model.config.num_hidden_layers - 1):
            held = cache.layers[layer].held
            assert held == 42
            mirror = cache.layers[layer].buf_k[0, :, :held].transpose(0, 1)
            assert torch.equal(mirror, torch.from_numpy(res[0][layer])), layer


def test_hf_fused_eviction_then_dense_chunk_refetches_what_changed(smollm2, tokens,
                                                                   _shared_factory):
    """Fused decode steps with eviction ask no STATS; the dense chunk after them learns which
    layers evicted in the meantime (one STATS against the counters read at the last dense
    fetch) and refetches those: every logit equals a cache that refetches everything."""
    model, _ = smollm2
    # fp16 rows: the adapter learns that they are stored as sent (rounded to fp16), so an APPEND
    # that evicts nowhere leaves the mirror valid and only evicted layers need a refetch.
    daemon = _shared_factory(pool__bytes="64MiB", quant__method="fp16", budget__mode="evict-only",
                             budget__token_fraction=0.5, evict__policy="snapkv", evict__sinks=4,
                             evict__window=32, evict__compression_period=8)
    fused_from, dense_from = PREFILL + 10, PREFILL + 14
    steps = [(0, PREFILL), (PREFILL, fused_from)]
    steps += [(i, i + 1) for i in range(fused_from, dense_from)]
    steps += [(dense_from, dense_from + 10), (dense_from + 10, dense_from + 11)]
    logits = {}
    for refetch in ("auto", "always"):
        with KvctlCache(model, daemon.endpoint, attention="fused", send_q=True,
                        refetch=refetch) as cache, torch.no_grad():
            stats_calls = []
            real_stats = cache.seqs[0].client.stats

            def counting_stats(*args, **kwargs):
                stats_calls.append(args)
                return real_stats(*args, **kwargs)

            cache.seqs[0].client.stats = counting_stats
            out = []
            for a, b in steps:
                before = len(stats_calls)
                out.append(model(tokens[:, a:b], past_key_values=cache).logits[0, -1])
                if refetch == "auto" and b - a == 1:
                    assert len(stats_calls) == before, (a, stats_calls)  # Fused: no STATS.
                if refetch == "auto" and a == dense_from:
                    assert len(stats_calls) == before + 1, stats_calls
            logits[refetch] = torch.stack(out)
            if refetch == "auto":
                assert cache.counters["fused_steps"] == dense_from - fused_from + 1
                assert cache.seqs[0].evicting
                seq = cache.stats(section="sequences")["sequences"]
                assert int(seq["tokens_evicted_total"]) > 0
    assert torch.equal(logits["auto"], logits["always"])


def test_hf_auto_attention_goes_fused_from_fused_min_tokens(smollm2, tokens, _shared_factory):
    """attention="auto" (the default) decodes dense below fused_min_tokens and fused from there
    on; a lossless daemon (no records) or a short context keeps it dense without an error."""
    model, _ = smollm2
    daemon = _shared_factory(pool__bytes="64MiB", **DAEMONS["kivi2"])
    switch = PREFILL + 20
    with KvctlCache(model, daemon.endpoint, fused_min_tokens=switch) as cache:
        assert cache.attention == "auto" and cache.fused_ok
        auto = forward_loop(model, cache, tokens, PREFILL)
        # Step i first appends tokens up to i - 1, so it is fused once i >= switch.
        assert cache.counters["fused_steps"] == TOTAL - switch, cache.counters
    with KvctlCache(model, daemon.endpoint, attention="dense") as cache:
        dense = forward_loop(model, cache, tokens, PREFILL)
        assert cache.counters["fused_steps"] == 0
    agree = (auto.argmax(-1) == dense.argmax(-1)).float().mean().item()
    assert (auto - dense).abs().max().item() <= LOGIT_TOLERANCE and agree >= 0.95, agree
    with KvctlCache(model, daemon.endpoint) as cache:  # The default threshold.
        assert cache.attention == "auto" and cache.fused_min_tokens == 2048
    lossless = _shared_factory(quant__lossless=True, pool__bytes="64MiB")
    with KvctlCache(model, lossless.endpoint, fused_min_tokens=1) as cache:
        assert not cache.fused_ok
        forward_loop(model, cache, tokens[:, :PREFILL + 4], PREFILL)
        assert cache.counters["fused_steps"] == 0
    with pytest.raises(ValueError, match="fused_min_tokens: got 0"):
        KvctlCache(model, "ipc:///nonexistent", fused_min_tokens=0)


def test_hf_fused_refusals(smollm2, _shared_factory):
    model, _ = smollm2
    with pytest.raises(ValueError, match="attention: got 'flash', expected"):
        KvctlCache(model, "ipc:///nonexistent", attention="flash")
    with pytest.raises(ValueError, match="needs the model"):
        KvctlCache(config=model.config, client="ipc:///nonexistent", attention="fused")
    lossless = _shared_factory(quant__lossless=True, pool__bytes="64MiB")
    with pytest.raises(kvctl.KvctlError, match="lossless"):
        KvctlCache(model, lossless.endpoint, attention="fused")
