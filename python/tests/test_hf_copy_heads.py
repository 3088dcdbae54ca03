# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kvctl.copy_heads on real models: on a small random-weight Llama (GQA 2) the chunked scores
through a DynamicCache equal those of one uncached forward pass computed here independently; the
command line names its pairs; on SmolLM2-135M and Apache-2.0 its top nine are the pairs
configs/smollm2-copy-heads-1of8.toml and -1of16.toml ship.

Runs only with KVCTL_HF_TESTS=1 (the CTest "pytest: hf cache" sets it); skipped when torch or
transformers is not installed. The SmolLM2 case reads 2,225 tokens in eager attention (~30 s).
"""

import json
import os
import re

import numpy as np
import pytest

import hf_common  # noqa: F401  Skips this module unless KVCTL_HF_TESTS=1 and torch is installed.
import torch  # noqa: E402
import transformers  # noqa: E402

from kvctl import copy_heads  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_llama():
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
        initializer_range=0.1, tie_word_embeddings=False)
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(config).float().eval()
    model.set_attn_implementation("sdpa")
    return model


def repeating_ids(n=300, seed=3):
    """Random tokens of a small vocabulary with a 40-token passage repeated: many copy events."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 64, n)
    ids[200:240] = ids[80:120]
    return ids


def test_chunked_scores_equal_one_uncached_pass():
    model = tiny_llama()
    ids = repeating_ids()
    scores, events = copy_heads.copy_scores(model, ids, start=64, chunk=48)
    assert model.config._attn_implementation == "sdpa"  # Restored.
    # Independently: every attention matrix of one forward pass over the whole text.
    expected_events = copy_heads.copy_events(ids, 64)
    assert events == len(expected_events) > 40
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(torch.from_numpy(ids.astype(np.int64))[None], output_attentions=True)
    expected = np.zeros((2, 2))
    for layer, a in enumerate(out.attentions):
        per_kv = a[0].reshape(2, 2, len(ids), len(ids)).mean(1).numpy()  # [kv, t, s]
        for t, sources in expected_events.items():
            expected[layer] += per_kv[:, t, sources].sum(-1)
    expected /= events
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    assert (scores > 0).all() and (scores <= 1).all()


def test_a_text_without_repetition_is_refused():
    # 0, 1, ..., 63, then 0, 3, 6, ... mod 64: steps of 1, then of 3, so no pair repeats.
    ids = list(range(64)) + [3 * k % 64 for k in range(64)]
    with pytest.raises(copy_heads.CopyHeadsError, match="no token pair"):
        copy_heads.copy_scores(tiny_llama(), np.array(ids), start=64)


def test_command_line_on_a_local_model_folder(tmp_path, capsys):
    model = tiny_llama()
    model.save_pretrained(tmp_path / "m")
    # A character-level tokenizer is enough: the text repeats itself.
    from tokenizers import Tokenizer, models, pre_tokenizers
    vocab = {c: i for i, c in enumerate("abcdefghijklmnopqrstuvwxyz .")}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="."))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token=".").save_pretrained(
        tmp_path / "m")
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 8)
    assert copy_heads.main(["--model", str(tmp_path / "m"), "--text", str(text), "--top", "3",
                            "--threads", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["layers"] == 2 and r["kv_heads"] == 2 and r["events"] > 100
    assert re.fullmatch(r"[01]:[01],[01]:[01],[01]:[01]", r["full_heads"])
    assert [p["score"] for p in r["top"]] == sorted([p["score"] for p in r["top"]], reverse=True)
    # --top must leave a pair to evict.
    assert copy_heads.main(["--model", str(tmp_path / "m"), "--text", str(text), "--top", "4",
                            "--threads", "1"]) == 2
    assert "--top: got 4, expected 1..3" in capsys.readouterr().err


def test_smollm2_top_nine_are_the_shipped_recipes_pairs(smollm2):
    model, tok = smollm2
    with open(copy_heads.DEFAULT_TEXT, encoding="utf-8") as f:
        r = copy_heads.rank(model, tok, f.read(), 9, 8192)
    assert r["tokens"] == 2225 and r["events"] == 703
    for recipe in ("smollm2-copy-heads-1of8.toml", "smollm2-copy-heads-1of16.toml"):
        with open(os.path.join(REPO, "configs", recipe)) as f:
            shipped = re.search(r'^full_heads = "([^"]*)"', f.read(), re.M).group(1)
        assert r["full_heads"] == shipped, recipe
    assert model.config._attn_implementation != "eager"
