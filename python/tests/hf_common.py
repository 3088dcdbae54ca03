# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""What the HF cache tests (test_hf.py, test_hf_fused.py) share: the text they feed SmolLM2 and
the teacher-forced forward loop. The model itself is the session fixture `smollm2` (conftest.py),
so one pytest run loads it once. Importing it skips the importing test module unless
KVCTL_HF_TESTS=1 and the model stack is installed."""

import importlib.util
import os

import pytest

if os.environ.get("KVCTL_HF_TESTS") != "1":
    pytest.skip("HF cache tests run with KVCTL_HF_TESTS=1 (ctest -R 'hf cache')",
                allow_module_level=True)
if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "gguf")):
    pytest.skip("torch/transformers/gguf not installed (python/requirements-model.txt)",
                allow_module_level=True)

import torch  # noqa: E402

TEXT = ("The GNU General Public License is a free, copyleft license for software and other "
        "kinds of works. The licenses for most software and other practical works are designed "
        "to take away your freedom to share and change the works. By contrast, the GNU General "
        "Public License is intended to guarantee your freedom to share and change all versions "
        "of a program--to make sure it remains free software for all its users. ")


def forward_loop(model, cache, ids, prefill):
    """Logits [steps + 1, vocab]: the prefill's last position, then one token at a time."""
    out = []
    with torch.no_grad():
        o = model(ids[:, :prefill], past_key_values=cache, use_cache=True)
        out.append(o.logits[0, -1])
        for i in range(prefill, ids.shape[1]):
            o = model(ids[:, i:i + 1], past_key_values=cache, use_cache=True)
            out.append(o.logits[0, -1])
    return torch.stack(out)
