# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""KvctlCache (python/kvctl/hf_cache.py) on architectures other than SmolLM2: small random-weight
Llama, Qwen2 and Gemma3 models built from their transformers config classes (nothing is
downloaded), with GQA ratios 1, 2, 4 and 8, head_dim 64, 128 and 256 and sliding-window layers
(Qwen2's upper layers, Gemma3's local layers, window 16 under a 40-token prompt so they really
slide). On a lossless daemon every logit must equal DynamicCache(config=...)'s bit for bit, in
greedy generate() and in a teacher-forced loop whose second step is a multi-token chunk after
the prefill (masks with a past: causal offset and window).

Runs only with KVCTL_HF_TESTS=1 (the CTest "pytest: hf cache" sets it); skipped when torch or
transformers is not installed. Each case takes a second or two.
"""

import importlib.util
import os

import pytest

if os.environ.get("KVCTL_HF_TESTS") != "1":
    pytest.skip("HF cache tests run with KVCTL_HF_TESTS=1 (ctest -R 'hf cache')",
                allow_module_level=True)
if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers")):
    pytest.skip("torch/transformers not installed (python/requirements-model.txt)",
                allow_module_level=True)

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DynamicCache  # noqa: E402

from kvctl.hf import KvctlCache  # noqa: E402

VOCAB = 512
PROMPT = 40
NEW_TOKENS = 16
WINDOW = 16
SLIDING, FULL = "sliding_attention", "full_attention"

# name: (config class, model class, config arguments). hidden_size is independent of
# heads * head_dim in all three (o_proj maps back), so head_dim 128/256 stay cheap.
CASES = {
    "llama-mha-d64": ("LlamaConfig", "LlamaForCausalLM", dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=64)),
    "llama-gqa8-d128": ("LlamaConfig", "LlamaForCausalLM", dict(
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1, head_dim=128)),
    "qwen2-gqa2-d64": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64)),
    # Layers >= max_window_layers slide.
    "qwen2-gqa4-d128-sliding": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
        use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "gemma3-gqa2-d256-sliding": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=256,
        query_pre_attn_scalar=256, sliding_window=WINDOW,
        layer_types=[SLIDING, SLIDING, SLIDING, FULL])),
    "gemma3-gqa8-d256-sliding": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
        query_pre_attn_scalar=256, sliding_window=WINDOW, layer_types=[SLIDING, FULL])),
}


def build_model(name):
    """The case's model, float32, eval mode, weights from a fixed seed; attention "sdpa"."""
    config_cls, model_cls, shape = CASES[name]
    config = getattr(transformers, config_cls)(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=256, max_position_embeddings=256,
        # Larger than the usual 0.02 so attention is far from uniform: a wrong or missing
        # row moves the logits.
        initializer_range=0.1, bos_token_id=1, eos_token_id=None, pad_token_id=0,
        tie_word_embeddings=False, **shape)
    torch.manual_seed(1234)
    model = getattr(transformers, model_cls)(config).float().eval()
    model.set_attn_implementation("sdpa")
    return model


def sliding_layers(model):
    types = getattr(model.config, "layer_types", None) or []
    return [i for i, t in enumerate(types) if t == SLIDING]


def token_ids(length, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (1, length), generator=g)


def teacher_forced(model, cache, ids, steps):
    """Logits [tokens, vocab] of every position, fed in chunks of `steps` tokens."""
    out, at = [], 0
    with torch.no_grad():
        for n in steps:
            o = model(ids[:, at:at + n], past_key_values=cache, use_cache=True)
            out.append(o.logits[0])
            at += n
    assert at == ids.shape[1]
    return torch.cat(out)


@pytest.fixture(scope="module")
def archs_daemon(_shared_factory):
    """Lossless daemon (every row stored exactly as sent, float32)."""
    return _shared_factory(quant__lossless=True, pool__bytes="64MiB")


def check_daemon_held_every_token(cache, tokens):
    assert cache.seqs[0].rounding == "exact"
    stats = cache.stats(section="sequences")["sequences"]
    assert int(stats["tokens"]) == tokens


@pytest.mark.parametrize("name", list(CASES))
def test_lossless_generate_equals_dynamic_cache(name, archs_daemon):
    torch.set_num_threads(1)  # As conftest.smollm2 says why.
    model = build_model(name)
    prompt = token_ids(PROMPT, seed=7)
    args = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                return_dict_in_generate=True, pad_token_id=0)
    ref_cache = DynamicCache(config=model.config)
    ref = model.generate(prompt, past_key_values=ref_cache, **args)
    total = PROMPT + NEW_TOKENS - 1  # The last token is generated, never fed back.
    for i in sliding_layers(model):
        # The reference really slid: it keeps only the window's last rows.
        assert ref_cache.layers[i].is_sliding
        assert ref_cache.layers[i].keys.shape[2] == WINDOW - 1 < total
    with KvctlCache(model, archs_daemon.endpoint) as cache:
        got = model.generate(prompt, past_key_values=cache, **args)
        check_daemon_held_every_token(cache, total)
        sliding = [l.is_sliding for l in cache.layers]
    assert got.sequences.shape == (1, PROMPT + NEW_TOKENS)
    assert torch.equal(got.sequences, ref.sequences)
    assert len(got.logits) == len(ref.logits) == NEW_TOKENS
    for step, (a, b) in enumerate(zip(got.logits, ref.logits)):
        assert torch.equal(a, b), "step %d: max |diff| %g" % (step, (a - b).abs().max().item())
    assert sliding == [l.is_sliding for l in ref_cache.layers]


@pytest.mark.parametrize("name", list(CASES))
def test_lossless_teacher_forced_chunks_equal_dynamic_cache(name, archs_daemon):
    """Prefill, then a 12-token chunk (a multi-token step with a past, across the window
    boundary), then one token at a time: every position's logits equal DynamicCache's."""
    torch.set_num_threads(1)  # As conftest.smollm2 says why.
    model = build_model(name)
    steps = [24, 12] + [1] * 16
    ids = token_ids(sum(steps), seed=11)
    ref = teacher_forced(model, DynamicCache(config=model.config), ids, steps)
    with KvctlCache(model, archs_daemon.endpoint) as cache:
        got = teacher_forced(model, cache, ids, steps)
        check_daemon_held_every_token(cache, ids.shape[1])
    # The random model is not degenerate: positions disagree on their argmax.
    assert ref.argmax(-1).unique().numel() > 4
    for pos in range(ids.shape[1]):
        assert torch.equal(got[pos], ref[pos]), \
            "position %d: max |diff| %g" % (pos, (got[pos] - ref[pos]).abs().max().item())


@pytest.mark.parametrize("name", ["llama-gqa8-d128", "gemma3-gqa2-d256-sliding"])
def test_masked_path_with_nothing_visible_masked_matches_dynamic_cache(name, archs_daemon):
    """The attention path for heads that miss positions (evicting daemons: hold_bias, GQA
    folded into the query axis) under the model's masks. Every layer gets a hold bias after
    the prefill (all held: the chunk step combines it with the causal and window masks); after
    the chunk, sliding layers' biases also mask the rows their window has left (a wrong window
    offset would hide visible rows). The logits must stay DynamicCache's, to rounding (SDPA
    called in another shape)."""
    torch.set_num_threads(1)  # As conftest.smollm2 says why.
    model = build_model(name)
    steps = [24, 12] + [1] * 8
    ids = token_ids(sum(steps), seed=13)
    ref = teacher_forced(model, DynamicCache(config=model.config), ids, steps)
    got, at = [], 0
    with KvctlCache(model, archs_daemon.endpoint) as cache, torch.no_grad():
        for i, n in enumerate(steps):
            got.append(model(ids[:, at:at + n], past_key_values=cache).logits[0])
            at += n
            if i == 0:
                for layer in cache.layers:
                    layer.hold_bias = torch.zeros(1, cache.kv_heads, 1, layer.buf_k.shape[2])
            if i == 1:
                # Lossless: no FETCH after the first one (step 1), which reset the biases.
                assert cache.counters["fetches"] == 1
                for layer in cache.layers:
                    if layer.is_sliding:
                        layer.hold_bias[..., :at - WINDOW + 1] = float("-inf")
        assert cache.counters["fetches"] == 1
    got = torch.cat(got)
    assert (got - ref).abs().max().item() <= 1e-4
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_layers_of_another_geometry_or_type_are_refused(archs_daemon):
    """One geometry per daemon sequence: K/V of another shape than the config says are refused
    before anything is sent; so are layer types the cache cannot stand in for."""
    model = build_model("llama-gqa8-d128")
    wrong = transformers.LlamaConfig(**{**model.config.to_dict(), "head_dim": 64})
    with KvctlCache(config=wrong, client=archs_daemon.endpoint) as cache:
        with pytest.raises(ValueError, match="layer 0 gave K/V with 1 heads of head_dim 128, "
                                             "expected 1 and 64"):
            with torch.no_grad():
                model(token_ids(8, seed=3), past_key_values=cache)
        assert cache.appended == 0
    hybrid = transformers.LlamaConfig(**model.config.to_dict())
    hybrid.layer_types = ["full_attention", "linear_attention"]
    with pytest.raises(ValueError, match=r"layer_types\[1\] is 'linear_attention'"):
        KvctlCache(config=hybrid, client=archs_daemon.endpoint)
    gemma = build_model("gemma3-gqa8-d256-sliding")
    with pytest.raises(ValueError, match=r"fused.*layers \[0\] are sliding-window layers"):
        KvctlCache(gemma, archs_daemon.endpoint, attention="fused")
