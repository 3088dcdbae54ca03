# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tools/kveval_demote_sim.py without the model: the stand-in TurboQuant's distortion, bits
accounting and least-squares scale, the equal-memory shares, the tiers (nested, exact counts,
sinks and window first, the same high set as kveval_needed_sim's kept set) and which rows
demote_rows replaces. Pure numpy."""

import os
import sys

import numpy as np
import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "tools")
sys.path.insert(0, TOOLS)

import kveval_demote_sim as ds  # noqa: E402
import kveval_needed_sim as sim  # noqa: E402


def test_bits_per_element_counts_the_fp16_scale_per_row():
    assert ds.bits_per_element(1, 64) == 1.25
    assert ds.bits_per_element(2, 128) == 2.125
    # K4/V3 at head_dim 64: 3.75 b/e, 0.234 of fp16; 1 bit: 1.25 b/e.
    assert ds.memory_vs_fp16(1.0, 0.0, (4, 3), None, 64) == pytest.approx(3.75 / 16)
    assert ds.memory_vs_fp16(0.0, 1.0, (4, 3), (1, 1), 64) == pytest.approx(1.25 / 16)
    assert ds.memory_vs_fp16(0.5, 0.0, None, None, 64) == pytest.approx(0.5)


def test_equal_memory_shares():
    base = 871 / 1919
    f_hi = ds.solve_equal(base, (4, 3), (1, 1), 64)
    assert f_hi == pytest.approx((base * 3.75 - 1.25) / 2.5)
    assert ds.memory_vs_fp16(f_hi, 1 - f_hi, (4, 3), (1, 1), 64) == pytest.approx(
        ds.memory_vs_fp16(base, 0, (4, 3), None, 64))
    f_lo = ds.solve_equal(base, (4, 3), (2, 2), 64, f_hi=0.3)
    assert ds.memory_vs_fp16(0.3, f_lo, (4, 3), (2, 2), 64) == pytest.approx(base * 3.75 / 16)
    v = ds.parse_variant("hi=0.3,lo=eq@2/1", base, (4, 3), 64)   # K 2.25, V 1.25 b/e.
    assert v["lo_bits"] == (2, 1)
    assert v["f_lo"] == pytest.approx((base - 0.3) * 3.75 / 1.75)
    v = ds.parse_variant("hi=eq,lo=rest@1", base, (4, 3), 64)
    assert v["f_hi"] == pytest.approx(f_hi) and v["f_lo"] == pytest.approx(1 - f_hi)
    assert v["mem"] == pytest.approx(base * 3.75 / 16)
    with pytest.raises(ValueError):
        ds.parse_variant("hi=0.9,lo=0.5@1", base, (4, 3), 64)   # More than the prefix.


@pytest.mark.parametrize("bits,dmse", [(1, 0.36), (2, 0.117), (4, 0.009)])
def test_quantizer_distortion_matches_turboquant(bits, dmse):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4000, 64)) * np.exp(rng.uniform(-3, 3, (4000, 1)))
    xh = ds.turbo_qdq(x, bits)
    rel = (((x - xh) ** 2).sum(-1) / (x ** 2).sum(-1)).mean()
    assert 0.85 * dmse < rel < 1.05 * dmse
    # The stored scale is the least-squares one: the error is orthogonal to the decoded row
    # (up to the scale's fp16 rounding, <= 2^-11 relative).
    cos = ((x - xh) * xh).sum(-1) / (xh * xh).sum(-1)
    assert np.abs(cos).max() < 1e-3
    assert not ds.turbo_qdq(np.zeros((2, 64)), bits).any()


@pytest.mark.parametrize("bits,dmse", [(2, 0.117), (3, 0.0345), (4, 0.0095)])
def test_unbiased_scale_keeps_the_component_along_x(bits, dmse):
    # kTurbo's V rule (docs/algorithms.md §20.3): x . x_hat = |x|^2, the error orthogonal to x,
    # the squared error the least-squares one over cos^2: about D / (1 - D).
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4000, 64)) * np.exp(rng.uniform(-3, 3, (4000, 1)))
    xh = ds.turbo_qdq(x, bits, unbiased=True)
    along = (x * xh).sum(-1) / (x * x).sum(-1)
    assert np.abs(along - 1).max() < 1e-3
    rel = (((x - xh) ** 2).sum(-1) / (x ** 2).sum(-1)).mean()
    ls = (((x - ds.turbo_qdq(x, bits)) ** 2).sum(-1) / (x ** 2).sum(-1)).mean()
    assert rel == pytest.approx(ls / (1 - dmse), rel=0.03)
    assert not ds.turbo_qdq(np.zeros((2, 64)), bits, unbiased=True).any()


def test_one_bit_keeps_only_signs_in_the_rotated_frame():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((50, 64))
    y = (x * ds.signs(64)) @ ds.hadamard(64)
    yh = (ds.turbo_qdq(x, 1) * ds.signs(64)) @ ds.hadamard(64)
    assert (np.sign(yh) == np.sign(y)).all()
    assert np.allclose(np.abs(yh), np.abs(yh)[:, :1], rtol=1e-9)   # One magnitude per row.


def _obs(prefix=64, w=8, layers=2, heads=3, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random((layers, heads, w, prefix)).astype(np.float32)
    return a / a.sum(-1, keepdims=True)


def test_tiers_are_nested_exact_and_match_the_sims_kept_set():
    obs = _obs()
    r = ds.rank(obs, w=8, kernel=1)
    hi, lo = ds.tiers(r, 20, 15)
    assert (hi.sum(-1) == 20).all() and (lo.sum(-1) == 15).all() and not (hi & lo).any()
    assert hi[:, :, :4].all() and hi[:, :, 56:].all()
    assert (hi == sim.simulated_keep(obs, w=8, kernel=1, keep=20)).all()
    hi2, _ = ds.tiers(r, 35, 0)
    assert (hi2 == (hi | lo)).all()   # The demoted tier is what a larger kept set would add.


def test_demote_rows_replaces_hi_and_lo_and_masks_the_rest():
    L, H, T, d = 2, 3, 16, 8
    k = np.arange(L * H * T * d, dtype=np.float32).reshape(L, H, T, d)
    v = -k
    hi = np.zeros((L, H, T), bool)
    lo = np.zeros((L, H, T), bool)
    hi[:, :, :4] = True
    lo[:, :, 4:10] = True
    q = {"hi_k": k + 1, "hi_v": v + 1, "lo_k": k + 2, "lo_v": v + 2}
    k2, v2, kept = ds.demote_rows(k, v, hi, lo, q)
    assert (k2[:, :, :4] == k[:, :, :4] + 1).all() and (v2[:, :, :4] == v[:, :, :4] + 1).all()
    assert (k2[:, :, 4:10] == k[:, :, 4:10] + 2).all()
    assert (v2[:, :, 4:10] == v[:, :, 4:10] + 2).all()
    assert (k2[:, :, 10:] == k[:, :, 10:]).all()
    assert kept[:, :, :10].all() and not kept[:, :, 10:].any()
