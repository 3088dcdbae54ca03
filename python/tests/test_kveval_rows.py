# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tools/kveval_rows.py: the rows issue #18's tight-budget measurements added (sinks/flush grid,
joint planner exchange rate and compression period) configure what their names say, and the
STATS summary counts re-quantized tokens per head, and RateQuant budgets over widths that do not
start at 2 bits (with the real kvcalib). No daemon, no model."""

import os
import sys
import tomllib
import types

import numpy as np
import pytest
from helpers import PYTHON_DIR

sys.path.insert(0, os.path.join(os.path.dirname(PYTHON_DIR), "tools"))
import kveval_calib  # noqa: E402
import kveval_rows  # noqa: E402


def test_sink_flush_grid_rows_set_sinks_and_a_multiple_of_the_block():
    rows = kveval_rows.all_rows()
    blocks = {"kivi": 32, "quarot": 32, "oscar": 32, "turbo": 32, "kvarn": 128}
    grid = [r for r in kveval_rows.sink_flush_rows()]
    # 6 sink counts x (4 flushes x 2 widths for KIVI and TurboQuant, 4 for QuaRot and OScaR, 2
    # for KVarN).
    assert len(grid) == 6 * (4 * 2 + 4 * 2 + 4 + 4 + 2)
    assert len({r.name for r in grid}) == len(grid)
    for r in grid:
        head, sinks, flush = r.name.split("_")
        method, bits = head[:-1], head[-1]  # "kvarn2" -> "kvarn", "2"
        assert rows[r.name] is not None
        assert r.settings["quant.method"] == method
        assert r.settings["quant.k_bits"] == r.settings["quant.v_bits"] == bits
        assert r.settings["quant.sink_tokens"] == sinks[1:]
        assert int(r.settings["quant.flush_tokens"]) % blocks[method] == 0
        assert r.settings["quant.flush_tokens"] == flush[1:]
    assert rows["turbo3_s32_f64"].settings["quant.k_bits"] == "3"
    # Named on purpose only: a default kveval run leaves the grid out.
    assert not set(r.name for r in grid) & set(kveval_rows.FULL_ROWS)
    assert "kivi2" in kveval_rows.FULL_ROWS
    assert rows["kvarn2_s16_f256"].settings["quant.sink_tokens"] == "16"


def test_joint_rows_carry_the_exchange_rate_and_period_they_name():
    rows = kveval_rows.all_rows()
    r = rows["joint_1of16_flush32_rho4_p128"]
    assert r.settings["budget.mode"] == "joint"
    assert float(r.settings["budget.fp16_fraction"]) == 1 / 16
    assert r.settings["budget.eviction_scale"] == "4"
    assert r.settings["evict.compression_period"] == "128"
    assert r.settings["quant.flush_tokens"] == "32"
    assert rows["joint_1of8_flush32_p128"].settings["budget.eviction_scale"] == "1"
    assert rows["joint_1of8_flush32_rho16"].settings.get("evict.compression_period") is None
    assert rows["rq_kvarn_2.5_b234"].ratequant["bits"] == "2,3,4"


def test_pressure_summary_counts_requantized_tokens_per_head():
    heads = {"head_0_0": {"k_bits": "2", "v_bits": "4", "requantized": "30"},
             "head_0_1": {"k_bits": "4", "v_bits": "4", "requantized": "10"},
             "layer_0": {"k_bits": "9"}}
    got = kveval_rows.pressure_summary(heads, {"seq_1": {"pressure_reliefs": "2"}})
    assert got["requantized_per_head"] == 20
    assert got["k_bits_mean"] == 3
    assert got["pressure_reliefs"] == 2


def test_ratequant_turbo_rows_plan_the_code_bits_they_name_over_turbo_widths():
    rows = kveval_rows.all_rows()
    rq = [r for r in kveval_rows.rq_turbo_rows() if r.ratequant]
    names = ["rq_turbo_2.97_b234", "rq_turbo_3.25_b234", "rq_turbo_3.3_b34",
             "rq_turbo_3.48_b34_f64"]
    assert [r.name for r in rq] == names + [n + "_att" for n in names]
    for r in rq:
        assert r.ratequant.get("target", "") == ("attention" if r.name.endswith("_att") else "")
        assert r.settings.get("quant.flush_tokens") == ("64" if "_f64" in r.name else None)
        assert rows[r.name].ratequant == r.ratequant
        # kveval_calib.ratequant_config plans code_bits over the widths of the [quant] method,
        # so the base method must be the one the profile was fitted for.
        assert r.settings["quant.method"] == r.ratequant["method"] == "turbo"
        assert r.ratequant["bits"] == ",".join(r.name.split("_")[3][1:])
        assert r.ratequant["code_bits"] == float(r.name.split("_")[2])
        assert r.name in kveval_rows.FULL_ROWS
    # The equal-memory row sits at turbo3's code width or below, the band-edge row above it.
    assert rq[0].ratequant["code_bits"] <= 3 < rq[1].ratequant["code_bits"]
    for name, k, v in (("turbo_k4v2", "4", "2"), ("turbo_k2v4", "2", "4"),
                       ("turbo_k4v3_f64", "4", "3"), ("turbo_k4v3_f32", "4", "3")):
        s = rows[name].settings
        assert (s["quant.method"], s["quant.k_bits"], s["quant.v_bits"]) == ("turbo", k, v)
        assert s.get("quant.flush_tokens") == (name.split("_f")[1] if "_f" in name else None)


def kvcalib_binary() -> str:
    return os.environ.get("KVCALIB_BIN") or os.path.join(os.path.dirname(PYTHON_DIR), "build",
                                                         "bin", "kvcalib")


def test_ratequant_budget_counts_code_bits_above_the_narrowest_fitted_width():
    # TurboQuant at head_dim 64: 2.25 / 3.25 b/e at 2 / 3 bits (a 16-bit scale per 64 elements).
    assert kveval_calib.ratequant_budget_bpe(2.25, 3.25, "2,3,4") == 3.5
    assert kveval_calib.ratequant_budget_bpe(2.25, 2.5, "") == 2.75
    assert kveval_calib.ratequant_budget_bpe(3.25, 3.25, "3,4") == 3.5
    with pytest.raises(kveval_rows.EvalError, match="code_bits: got 2.5, expected at least 3"):
        kveval_calib.ratequant_budget_bpe(3.25, 2.5, "3,4")


def test_ratequant_config_plans_turbo_over_widths_3_and_4(tmp_path):
    """The real kvcalib: a TurboQuant profile fitted over 3 and 4 bits only, planned at 3.25
    average code bits, gives overrides with widths 3 and 4 averaging 3.25 (before the budget
    counted code bits above 2 bits, kvcalib refused 4.5 b/e)."""
    binary = kvcalib_binary()
    if not os.access(binary, os.X_OK):
        pytest.fail("kvcalib binary not found at %s: build it (cmake --build build --target "
                    "kvcalib) or set KVCALIB_BIN" % binary, pytrace=False)
    profile = str(tmp_path / "profile-turbo-34.toml")
    kveval_calib.run_tool([binary, "fit", "--synthetic", "2", "--quick", "--method", "turbo",
                           "--bits", "3,4", "--out", profile])
    row = kveval_rows.Row("rq", "kvctl", kveval_rows.quant("turbo", 3, 3),
                          ratequant={"method": "turbo", "code_bits": 3.25, "bits": "3,4"})
    args = types.SimpleNamespace(kvcalib_bin=binary)
    config = kveval_calib.ratequant_config(args, row, {"turbo/3,4": profile}, [], str(tmp_path))
    with open(config, "rb") as f:
        overrides = tomllib.load(f)["quant"]["override"]
    widths = [o[kind] for o in overrides for kind in ("k_bits", "v_bits")]
    assert set(widths) == {3, 4}
    assert sum(widths) / len(widths) == 3.25
    assert "b/e 3.5000 (requested 3.5000)" in row.note


def test_profile_files_name_method_widths_and_target_both_ways():
    for key, name in (("kivi", "profile-kivi.toml"), ("kvarn/2,3,4", "profile-kvarn-234.toml"),
                      ("turbo/3,4", "profile-turbo-34.toml"),
                      ("turbo/2,3,4/attention", "profile-turbo-234-attention.toml")):
        assert kveval_calib.profile_file(key) == name
        assert kveval_calib.profile_key_of_file(name) == key
    assert kveval_calib.profile_key("turbo", "3,4", "attention") == "turbo/3,4/attention"
    with pytest.raises(kveval_rows.EvalError, match="overrides-x.toml is not a profile"):
        kveval_calib.profile_key_of_file("overrides-x.toml")


def test_fit_profile_with_target_attention_fits_the_attention_error(tmp_path):
    """fit_profile on dumps in kvcalib's layout (random K/V/Q, 2 layers, 256 tokens): target
    "attention" writes a profile whose curves are the attention error with uniform importance,
    kept apart from the default profile of the same widths."""
    binary = kvcalib_binary()
    if not os.access(binary, os.X_OK):
        pytest.fail("kvcalib binary not found at %s: build it (cmake --build build --target "
                    "kvcalib) or set KVCALIB_BIN" % binary, pytrace=False)
    rng = np.random.default_rng(3)
    seq = tmp_path / "seq_0"
    for layer in range(2):
        d = seq / ("layer_%d" % layer)
        d.mkdir(parents=True)
        for name, heads in (("k", 2), ("v", 2), ("q", 4)):
            np.save(d / (name + ".npy"), rng.standard_normal((256, heads, 64)).astype(np.float16))
    args = types.SimpleNamespace(kvcalib_bin=binary)
    profiles = {}
    att = kveval_calib.fit_profile(args, "turbo", profiles, [str(seq)], str(tmp_path), "3,4",
                                   "attention")
    mse = kveval_calib.fit_profile(args, "turbo", profiles, [str(seq)], str(tmp_path), "3,4")
    assert sorted(profiles) == ["turbo/3,4", "turbo/3,4/attention"]
    assert os.path.basename(att) == "profile-turbo-34-attention.toml"
    with open(att, "rb") as f:
        fit = tomllib.load(f)["ratequant"]
    assert (fit["target"], fit["importance"], fit["bits"]) == ("attention", "uniform", [3, 4])
    with open(mse, "rb") as f:
        assert tomllib.load(f)["ratequant"]["target"] == "mse"


def test_k4v3_rows_set_the_sinks_flush_and_pages_they_name():
    rows = kveval_rows.k4v3_rows()
    assert len(rows) == 11
    assert {"turbo_k4v3_f192", "turbo_k4v3_f256"} <= {r.name for r in rows}
    for r in rows:
        s = r.settings
        assert (s["quant.method"], s["quant.k_bits"], s["quant.v_bits"]) == ("turbo", "4", "3")
        parts = r.name.split("_")[2:]
        sinks = next((int(p[1:]) for p in parts if p.startswith("s")), 0)
        flush = next(int(p[1:]) for p in parts if p.startswith("f"))
        assert int(s["quant.sink_tokens"]) == sinks
        assert int(s["quant.flush_tokens"]) == flush
        # The daemon refuses a flush that is not a multiple of the record length.
        assert flush % int(s["quant.block_tokens"]) == 0
        assert s.get("pool.page_bytes") == ("16KiB" if r.name.endswith("_pg16k") else None)
        assert r.name in kveval_rows.FULL_ROWS


def test_pool_settings_size_one_segment_plus_staging():
    # SmolLM2-135M at 2048 tokens: 47,185,920 fp16 bytes (docs/quality.md: 153 / 99 MiB).
    lossless, other = kveval_rows.pool_settings(2 * 2 * 30 * 3 * 64 * 2048)
    assert lossless["pool.bytes"] == "153MiB" and other["pool.bytes"] == "99MiB"
    assert other["pool.staging_slots"] == "2"


def test_evict_turbo_rows_evict_and_quantize_what_they_name():
    rows = kveval_rows.evict_turbo_rows()
    n_token = len(kveval_rows.EVICT_TURBO_ROWS) + len(kveval_rows.EVICT_TURBO_ROWS_B)
    assert len(rows) == n_token + len(kveval_rows.MEMORY_AIMED_ROWS)
    # The memory-aimed rows budget a share of fp16 memory, never a token fraction.
    for r, (name, policy, share, k, v, flush, extra) in zip(rows[n_token:],
                                                            kveval_rows.MEMORY_AIMED_ROWS):
        s = r.settings
        assert r.name == name and "budget.token_fraction" not in s
        assert (s["budget.mode"], s["evict.policy"], s["budget.fp16_fraction"]) == (
            "evict-only", policy, "%g" % share)
        assert (s["quant.method"], s["quant.k_bits"], s["quant.v_bits"],
                s["quant.flush_tokens"]) == ("turbo", str(k), str(v), str(flush))
        assert all(s[key] == value for key, value in extra.items()) and r.send_q
    rows = rows[:n_token]
    for r in rows[len(kveval_rows.EVICT_TURBO_ROWS):]:
        # evict_<policy>_<keep %>_turbo<bits>_f<flush>[_suffix]: the extra settings and profile.
        policy, keep, k, v, flush, suffix, extra, profile = next(
            b for b in kveval_rows.EVICT_TURBO_ROWS_B if r.name == "evict_%s_%d_turbo%s_f%d%s"
            % (b[0], round(b[1] * 100), b[2] if b[2] == b[3] else "_k%dv%d" % b[2:4], b[4],
               b[5]))
        s = r.settings
        assert (s["budget.mode"], s["evict.policy"], s["budget.token_fraction"]) == (
            "evict-only", policy, str(keep))
        assert (s["quant.k_bits"], s["quant.v_bits"], s["quant.flush_tokens"]) == (
            str(k), str(v), str(flush))
        assert all(s[key] == value for key, value in extra.items()) and r.profile == profile
        assert r.send_q and r.name in kveval_rows.FULL_ROWS
    for r in rows[:len(kveval_rows.EVICT_TURBO_ROWS)]:
        s = r.settings
        # evict_snapkv_<keep %>_turbo<bits>_f<flush>: bits "3", "4" or "_k4v3".
        head, flush = r.name.rsplit("_f", 1)
        keep, bits = head[len("evict_snapkv_"):].split("_turbo")
        k, v = (bits[2], bits[4]) if bits.startswith("_k") else (bits, bits)
        assert (s["budget.mode"], s["evict.policy"], s["quant.method"]) == (
            "evict-only", "snapkv", "turbo")
        assert round(float(s["budget.token_fraction"]) * 100) == int(keep)
        assert (s["quant.k_bits"], s["quant.v_bits"], s["quant.flush_tokens"]) == (k, v, flush)
        # The daemon refuses a flush that is not a multiple of the record length (32 unless set).
        assert int(flush) % int(s.get("quant.block_tokens", "32")) == 0
        # SnapKV scores with the queries: the daemon refuses it without them.
        assert r.send_q and r.kind == "kvctl" and not r.profile
        assert kveval_rows.all_rows()[r.name] is not None and r.name in kveval_rows.FULL_ROWS
    assert kveval_rows.all_rows()["evict_snapkv_20_turbo_k4v3_f64"].settings[
        "budget.token_fraction"] == "0.205"


def test_first_scored_joint_rows_plan_for_the_first_scored_length():
    """The _ps joint rows are planned for --tokens - --scored tokens (the sequence at the first
    scored step), so the plan's bytes, fraction x fp16 of that length, are at most fraction x
    fp16 of the tokens held at every scored step; the other joint rows stay planned for the
    context length (their published figures)."""
    rows = kveval_rows.all_rows()
    for name, frac, method in (("joint_1of8_flush32_ps", 1 / 8, "kivi"),
                               ("joint_1of16_flush32_ps", 1 / 16, "kivi"),
                               ("joint_turbo_1of8_f8_ps", 1 / 8, "turbo"),
                               ("joint_turbo_1of16_f8_ps", 1 / 16, "turbo")):
        settings = dict(rows[name].settings)
        assert settings["budget.plan_tokens"] == kveval_rows.PLAN_FIRST_SCORED
        assert float(settings["budget.fp16_fraction"]) == pytest.approx(frac, abs=1e-6)
        assert settings["quant.method"] == method and rows[name].profile == method
        kveval_rows.resolve_plan_tokens(settings, 2048, 128)
        assert settings["budget.plan_tokens"] == "1920"
        base = dict(rows[name[:-3]].settings)
        for key in set(base) | set(settings):
            if key != "budget.plan_tokens":
                assert base.get(key) == settings.get(key), key
        kveval_rows.resolve_plan_tokens(base, 2048, 128)
        assert base["budget.plan_tokens"] == "2048"
    fixed = {"budget.plan_tokens": "512"}
    kveval_rows.resolve_plan_tokens(fixed, 2048, 128)
    assert fixed == {"budget.plan_tokens": "512"}
    with pytest.raises(kveval_rows.EvalError, match="--scored 2048, expected 1..2047"):
        kveval_rows.resolve_plan_tokens({"budget.plan_tokens": "PLAN_FIRST_SCORED"}, 2048, 2048)
