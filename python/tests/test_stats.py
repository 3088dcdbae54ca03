# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kvctl.parse_info / Client.stats(): the STATS text as nested dicts with typed values, checked
line by line against the text a real daemon sends (docs/stats.md)."""

import re

import numpy as np
import pytest

import kvctl
from helpers import random_kv

LAYERS, HEADS, DIM = 2, 2, 64
ENTITY = re.compile(r"(seq|layer|head)(_\d+)+")


def test_parse_info_entity_lines_become_typed_dicts():
    text = ("# Sequences\nsessions:2\nbits_per_element:6.25\n"
            "seq_1_2:client=kvdemo,tokens=350,bytes=11796480,age_s=0\n"
            "seq_2_7:client=7,tokens=1,bytes=0,age_s=3\n"
            "seq_3_1:client=,tokens=0,bytes=0,age_s=0\n"
            "# Layers\nlayer_0:tokens=1050,bits_per_element=11.0857,retained_mass=1\n"
            "# Heads\nhead_3_1:k_bits=2,k_rel_error=9.1e-02,v_rel_error=nan,evictions=-1\n"
            "# Server\nendpoint:tcp://127.0.0.1:5555\nodd_1:no pairs here\n")
    assert kvctl.parse_info(text) == {
        "sequences": {
            "sessions": 2, "bits_per_element": 6.25,
            "seq_1_2": {"client": "kvdemo", "tokens": 350, "bytes": 11796480, "age_s": 0},
            # A client name is text even when it looks like a number, or is empty.
            "seq_2_7": {"client": "7", "tokens": 1, "bytes": 0, "age_s": 3},
            "seq_3_1": {"client": "", "tokens": 0, "bytes": 0, "age_s": 0}},
        "layers": {"layer_0": {"tokens": 1050, "bits_per_element": 11.0857,
                               "retained_mass": 1}},
        "heads": {"head_3_1": {"k_bits": 2, "k_rel_error": 0.091,
                               "v_rel_error": pytest.approx(float("nan"), nan_ok=True),
                               "evictions": -1}},
        # Only "name_N...:key=value,..." lines are entities; other text stays text.
        "server": {"endpoint": "tcp://127.0.0.1:5555", "odd_1": "no pairs here"}}


def open_with_tokens(client, name, sequences):
    session = client.hello(LAYERS, HEADS, DIM, dtype="float16", client_name=name)
    for seq, tokens in sequences.items():
        k, v = random_kv(LAYERS, tokens, HEADS, DIM, seed=seq, dtype=np.float16)
        client.open(seq)
        client.append(seq, k, v)
    return session


def assert_parsed_like_text(text: str, parsed: dict) -> int:
    """Every line of `text` is in `parsed` with the same value, entity lines key by key in the
    daemon's order; returns the number of entity lines."""
    section, entities = "", 0
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# "):
            section = line[2:].lower()
            continue
        name, _, raw = line.partition(":")
        value = parsed[section][name]
        if ENTITY.fullmatch(name):
            entities += 1
            pairs = [item.split("=", 1) for item in raw.split(",")]
            assert isinstance(value, dict) and list(value) == [k for k, _ in pairs], (line, value)
            for key, item in pairs:
                assert_same(value[key], item, "%s %s" % (name, key), text_key=key == "client")
        else:
            assert_same(value, raw, name, text_key=False)
    return entities


def assert_same(parsed, raw: str, where: str, text_key: bool) -> None:
    """parsed is what Python's own int() or float() makes of raw, else raw itself."""
    for kind in (int, float):
        if text_key:
            break
        try:
            want = kind(raw)
        except ValueError:
            continue
        assert type(parsed) is kind and (parsed == want or want != want), (where, parsed, raw)
        return
    assert parsed == raw, (where, parsed, raw)


def test_stats_of_a_real_daemon_parse_to_nested_typed_dicts(daemon_factory, connect):
    daemon = daemon_factory(pool__bytes="64MiB")  # The default quantizer: KVarN k2 v2.
    a, b = connect(daemon), connect(daemon)
    session = open_with_tokens(a, "parser-test", {1: 300, 2: 5})
    open_with_tokens(b, "7", {3: 1})

    text = a.stats_text()
    parsed = kvctl.parse_info(text)
    # 3 sequences, 2 layers, 2 x 2 heads.
    assert assert_parsed_like_text(text, parsed) == 3 + LAYERS + LAYERS * HEADS

    seqs = parsed["sequences"]
    assert {n for n in seqs if n.startswith("seq_")} == {"seq_1_1", "seq_1_2", "seq_2_3"}, seqs
    assert seqs["seq_1_1"]["client"] == "parser-test" and seqs["seq_1_1"]["tokens"] == 300
    assert seqs["seq_1_2"]["tokens"] == 5
    assert seqs["seq_2_3"]["client"] == "7" and seqs["seq_2_3"]["tokens"] == 1
    assert seqs["seq_1_1"]["bytes"] > seqs["seq_2_3"]["bytes"] > 0
    assert seqs["tokens"] == 306 and isinstance(seqs["bits_per_element"], float)
    layers = parsed["layers"]
    for l in range(LAYERS):
        layer = layers["layer_%d" % l]
        assert layer["tokens"] == 306 * HEADS, layer  # Summed over heads and sequences.
        assert isinstance(layer["bits_per_element"], float) and layer["evictions"] == 0
    heads = parsed["heads"]
    assert heads["heads"] == LAYERS * HEADS
    for l in range(LAYERS):
        for h in range(HEADS):
            head = heads["head_%d_%d" % (l, h)]
            assert head["tokens"] == 306, head
            assert (head["k_bits"], head["v_bits"]) == (session.quant.k_bits,
                                                        session.quant.v_bits), head
            assert isinstance(head["k_rel_error"], float) and head["quality_samples"] >= 1, head

    # Client.stats() parses the same way, one section or all of them.
    only = a.stats("heads")
    assert list(only) == ["heads"] and only["heads"]["head_1_1"]["tokens"] == 306
    assert a.stats()["sequences"]["seq_2_3"]["client"] == "7"

    # Entities cover open sequences only.
    a.close(1)
    seqs = a.stats("sequences")["sequences"]
    assert "seq_1_1" not in seqs and seqs["seq_1_2"]["tokens"] == 5, seqs
    assert a.stats("layers")["layers"]["layer_0"]["tokens"] == 6 * HEADS


def test_kvctl_cache_reads_the_layer_eviction_counters(daemon_factory):
    """KvctlCache refetches only the layers whose STATS eviction counter moved: it reads them
    from the parsed layer dicts (unreadable counters would mean refetching every layer)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from kvctl.hf import KvctlCache

    config = transformers.LlamaConfig(num_hidden_layers=LAYERS, num_attention_heads=2 * HEADS,
                                      num_key_value_heads=HEADS, hidden_size=2 * HEADS * DIM,
                                      vocab_size=32)
    daemon = daemon_factory(quant__lossless=True, budget__mode="evict-only",
                            evict__policy="streaming", evict__sinks=4,
                            budget__tokens_per_head=16, evict__compression_period=1)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()  # Random weights: masking is ours.
    ids = torch.randint(0, 32, (1, 24))
    with KvctlCache(model, daemon.endpoint, keepalive=False) as cache, torch.no_grad():
        model(ids[:, :20], past_key_values=cache)
        for i in range(20, 24):  # Each step sends the one before it.
            model(ids[:, i:i + 1], past_key_values=cache)
        counts = cache.seqs[0].layer_evictions
        layers = cache.stats(section="layers")["layers"]
    assert cache.seqs[0].evicting
    # Known after the first FETCH and every APPEND since: the counters before the last sync().
    assert counts is not None and len(counts) == LAYERS, counts
    assert all(0 < c <= layers["layer_%d" % l]["evictions"] for l, c in enumerate(counts)), \
        (counts, layers)
