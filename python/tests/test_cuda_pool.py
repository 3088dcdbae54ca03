# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""pool.backend = "cuda" through the real daemon: refused by name where this machine cannot serve
it; with a device, engines open the pool by CUDA IPC and fused attention reads the records in
device memory (compared with the daemon's own dense FETCH). The device tests skip without one."""

import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (python/requirements-model.txt)")

from attention_ref import reference  # noqa: E402
from helpers import kvctl_binary  # noqa: E402
from kvctl import torch_ops as ops  # noqa: E402
from kvctl.pool_view import PoolView  # noqa: E402

if not ops.available():
    pytest.skip("kvctl_torch is not built (cmake --build build --target kvctl_torch)",
                allow_module_level=True)


def _device_ready() -> bool:
    return torch.cuda.is_available() and ops.has_cuda_kernels()


def test_cuda_pool_is_refused_by_name_where_it_cannot_run(workdir):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the device tests below cover this backend")
    sock = os.path.join(workdir, "cuda-refused.sock")
    run = subprocess.run([kvctl_binary(), "--set", "pool.backend=cuda", "--set",
                          "server.endpoint=ipc://" + sock],
                         capture_output=True, text=True, timeout=30)
    assert run.returncode != 0
    assert 'pool.backend: got "cuda"' in run.stderr
    assert ("built without CUDA" in run.stderr or "no CUDA device is visible" in run.stderr), \
        run.stderr


def test_cuda_pool_open_refuses_a_bad_handle():
    with pytest.raises(ValueError):  # Too short, or this build or machine has no CUDA.
        ops.open_cuda_pool(torch.zeros(10, dtype=torch.uint8), 1 << 20, 0)
    if not _device_ready():
        with pytest.raises(ValueError):
            ops.open_cuda_pool(torch.zeros(64, dtype=torch.uint8), 1 << 20, 0)
    else:
        with pytest.raises(RuntimeError, match="cudaIpcOpenMemHandle"):
            ops.open_cuda_pool(torch.zeros(64, dtype=torch.uint8), 1 << 20, 0)


@pytest.mark.parametrize("method", ["kivi", "kvarn"])
def test_cuda_pool_device_views_feed_fused_attention(method, daemon_factory, connect):
    if not _device_ready():
        pytest.skip("needs a CUDA device and kvctl_torch built with CUDA")
    layers, heads, g, dim = 2, 2, 4, 128
    d = daemon_factory(pool__backend="cuda", pool__bytes="64MiB", quant__method=method,
                       quant__k_bits=2, quant__v_bits=2)
    c = connect(d)
    session = c.hello(layers, heads, dim, dtype="float16", q_heads=heads * g)
    assert session.pool_on_device and session.shm_name == ""
    lay = ops.layout(method, dim, 2, 2)
    total = lay["sink_tokens"] + 3 * lay["flush_tokens"] + 7
    rng = np.random.default_rng(11)
    k = (rng.standard_normal((layers, total, heads, dim)) * 2).astype(np.float16)
    v = rng.standard_normal((layers, total, heads, dim)).astype(np.float16)
    c.open(1)
    c.append(1, k[:, :total - 40], v[:, :total - 40])
    c.append(1, k[:, total - 40:], v[:, total - 40:])  # A second request publishes more pages.
    blocks = c.fetch_blocks(1)
    fk, fv, _ = c.fetch(1, dtype="float32", stacked=True)
    view = PoolView.from_client(c)
    assert view.tensor.is_cuda and view.nbytes == session.pool_bytes
    q = torch.randn(heads * g, dim)
    for layer in range(layers):
        out, lse = view.layer_attention(blocks, layer, q.cuda())
        want_out, want_lse = reference(q, torch.from_numpy(fk[layer]),
                                        torch.from_numpy(fv[layer]), heads, dim ** -0.5)
        torch.testing.assert_close(out.cpu(), want_out.float(), atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(lse.cpu(), want_lse.float(), atol=2e-4, rtol=2e-4)
    if method == "kivi":  # Bit-identical encoders (kernels/cuda/quant_cuda.h): CPU records.
        sinks, flush = lay["sink_tokens"], lay["flush_tokens"]
        span = slice(sinks, sinks + 3 * flush)
        for h in range(heads):
            kq = torch.from_numpy(k[0, span, h:h + 1].astype(np.float32))
            vq = torch.from_numpy(v[0, span, h:h + 1].astype(np.float32))
            ours = ops.quantize(kq, vq, method, 2, 2, block_tokens=blocks.block_tokens)[0]
            theirs = torch.stack([r.cpu() for r in view.pair_records(blocks, h)])
            assert torch.equal(ours, theirs), h
    c.close(1)
    view.close()
