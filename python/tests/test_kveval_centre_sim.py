# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""tools/kveval_centre_sim.py without the model: variant parsing, the per-stream mean (fp16,
without the first tokens), centring around the stand-in TurboQuant, exact sinks, and the report's
pooled and paired figures. Pure numpy."""

import json
import os
import sys

import numpy as np
import pytest

TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))), "tools")
sys.path.insert(0, TOOLS)

import kveval_centre_sim as cs  # noqa: E402


def test_variants_parse_and_bad_ones_name_the_part():
    v = cs.parse_variant("4/3:c:s4")
    assert (v["k_bits"], v["v_bits"], v["centre_k"], v["centre_v"], v["sinks"]) == (4, 3, True,
                                                                                   True, 4)
    v = cs.parse_variant("2/2:ck")
    assert (v["centre_k"], v["centre_v"], v["sinks"]) == (True, False, 0)
    v = cs.parse_variant("4/3:uv:s4")
    assert (v["unbiased_k"], v["unbiased_v"], v["centre_k"], v["sinks"]) == (False, True, False, 4)
    assert cs.parse_variant("2/2:uk:uv")["unbiased_k"]
    for bad, what in (("4", "K/V bits"), ("5/3", "2-4"), ("4/3:x", "unknown part 'x'")):
        with pytest.raises(ValueError, match=what):
            cs.parse_variant(bad)


def test_stream_mean_skips_the_first_tokens_and_is_fp16():
    x = np.zeros((1, 1, 10, 8), np.float32)
    x[:, :, :cs.MEAN_FROM] = 1000.0          # A sink-like outlier the mean must not see.
    x[:, :, cs.MEAN_FROM:] = 0.1
    m = cs.stream_mean(x)
    assert m.shape == (1, 1, 1, 8)
    assert np.all(m == np.float32(np.float16(0.1)))


def test_centring_lowers_the_codes_error_when_rows_share_a_large_mean():
    rng = np.random.default_rng(0)
    mu = 4.0 * rng.standard_normal(64).astype(np.float32)
    x = (mu + rng.standard_normal((2, 3, 256, 64))).astype(np.float32)
    plain = cs.rel_error(x, cs.centred_qdq(x, 3, False, 0))
    centred = cs.rel_error(x, cs.centred_qdq(x, 3, True, 0))
    # The codes see rows of ~1/17 of the energy: the error relative to x falls by about that.
    assert centred < plain / 5
    # The mean is added back: the reconstruction is x's, not x - mean's.
    assert abs(float(cs.centred_qdq(x, 4, True, 0).mean()) - float(x.mean())) < 0.05


def test_sinks_stay_exact():
    x = np.random.default_rng(1).standard_normal((1, 2, 40, 16)).astype(np.float32)
    y = cs.centred_qdq(x, 2, True, 4)
    assert np.array_equal(y[:, :, :4], x[:, :, :4])
    assert not np.array_equal(y[:, :, 4:], x[:, :, 4:])


def test_report_pools_segments_and_pairs(tmp_path):
    ref = [2.0] * 64
    res = {"label": "t", "variants": [cs.parse_variant("4/3"), cs.parse_variant("4/3:c")],
           "segments": {"0": {"fp": ref, "4/3": [2.01] * 64, "4/3:c": [2.03] * 64}}}
    path = tmp_path / "t.json"
    path.write_text(json.dumps(res))
    out = cs.report([str(path)], "4/3")
    row = [ln for ln in out.splitlines() if ln.startswith("| 4/3:c |")][0]
    assert "+3.05" in row                     # 100 (e^0.03 - 1)
    assert "+2.02 [+2.02, +2.02]" in row      # Paired with 4/3: 100 (e^0.02 - 1), no spread.
