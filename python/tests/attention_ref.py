# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""The fp64 softmax-attention reference the torch-op tests compare fused decode attention with.
Import after pytest.importorskip("torch")."""

import torch


def reference(q, k, v, heads, scale):
    """out, lse of softmax attention in fp64: q [H*g, D], k/v [T, H, D]; query rows h*g..h*g+g-1
    read KV head h."""
    d = q.shape[1]
    g = q.shape[0] // heads
    q4 = q.double().reshape(1, heads, g, d)
    k4 = k.double().permute(1, 0, 2).unsqueeze(0)
    v4 = v.double().permute(1, 0, 2).unsqueeze(0)
    out = torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, scale=scale)
    lse = torch.logsumexp(scale * q4 @ k4.transpose(-1, -2), dim=-1)
    return out.reshape(heads * g, d), lse.reshape(-1)
