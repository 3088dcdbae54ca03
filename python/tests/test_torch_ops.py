# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""torch.ops.kvctl (bindings/torch) through python/kvctl/torch_ops.py and pool_view.py:
records byte-identical to the daemon's, dequantize equal to the daemon's dense FETCH, fused
decode attention against torch's scaled_dot_product_attention on the dequantized tensors, views
of the real daemon's shm pool, argument errors, and the CUDA kernels against the CPU ones
(skipped without a CUDA device). Skipped when torch or the extension is missing (build target
kvctl_torch; CTest sets KVCTL_TORCH_LIB)."""

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed (python/requirements-model.txt)")

from kvctl import torch_ops as ops  # noqa: E402

if not ops.available():
    pytest.skip("kvctl torch extension not built (cmake -DKVCTL_TORCH=ON, target kvctl_torch, "
                "or set KVCTL_TORCH_LIB)", allow_module_level=True)

from attention_ref import reference  # noqa: E402
from kvctl.pool_view import PoolView  # noqa: E402

# Fused attention vs SDPA on the dequantized cache (fp64 reference): relative to max |out| for
# the output, to max(1, |lse|) for the log-sum-exp. The kernels' own bound against an fp64 oracle
# is 1e-4 (docs/attention.md); worst seen here is about 2e-5.
ATOL_REL = 1e-4

METHOD_BITS = [("fp16", 16, 16)] + [
    (m, kb, vb) for m in ("kivi", "quarot", "kvarn", "oscar")
    for kb, vb in ((2, 2), (3, 3), (4, 4), (8, 8), (4, 2))] + [
    ("turbo", kb, vb) for kb, vb in ((2, 2), (3, 3), (4, 4), (4, 2))]


def synthetic(tokens, heads, dim, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.rand(1, heads, dim, generator=g) * 1.5 + 0.5
    scale[..., 3] *= 8.0
    k = torch.randn(tokens, heads, dim, generator=g) * scale + 0.3
    v = torch.randn(tokens, heads, dim, generator=g)
    return k, v


def assert_close(out, lse, ref_out, ref_lse, tol=ATOL_REL, what=""):
    err = ((out.double() - ref_out).abs().max() / ref_out.abs().max()).item()
    lerr = ((lse.double() - ref_lse).abs() / ref_lse.abs().clamp(min=1)).max().item()
    assert err <= tol and lerr <= tol, "%s: out %.3g, lse %.3g (bound %g)" % (what, err, lerr, tol)


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("method,k_bits,v_bits", METHOD_BITS)
def test_torch_ops_fused_attention_matches_sdpa_on_dequantized(method, k_bits, v_bits, dim):
    heads, g = 2, 3
    lay = ops.layout(method, dim, k_bits, v_bits)
    G = lay["block_tokens"]
    # (records, window rows): window only (odd), one record, records + odd tail, record + 1 row.
    for blocks, window in ((0, 37), (1, 0), (3, 5), (1, 1)):
        k, v = synthetic(blocks * G + window, heads, dim, seed=blocks * 100 + window + dim)
        q = torch.randn(heads * g, dim, generator=torch.Generator().manual_seed(window))
        kq, vq = k[:blocks * G], v[:blocks * G]
        norms = ops.token_norms(kq) if method == "oscar" and blocks else None
        if blocks:
            rec = ops.quantize(kq, vq, method, k_bits, v_bits, token_norms=norms)
            assert rec.shape == (heads, blocks, lay["record_bytes"]) and rec.dtype == torch.uint8
            kd, vd = ops.dequantize(rec, method, dim, k_bits, v_bits, token_norms=norms)
        else:
            rec = torch.empty(heads, 0, lay["record_bytes"], dtype=torch.uint8)
            kd, vd = kq, vq
        wk, wv = k[blocks * G:], v[blocks * G:]
        scale = 1 / math.sqrt(dim)
        out, lse = ops.decode_attention(q, rec, wk if window else None, wv if window else None,
                                        method, k_bits, v_bits, token_norms=norms)
        ref_out, ref_lse = reference(q, torch.cat([kd, wk]), torch.cat([vd, wv]), heads, scale)
        assert out.shape == (heads * g, dim) and lse.shape == (heads * g,)
        assert_close(out, lse, ref_out, ref_lse,
                     what="%s k%dv%d D%d blocks %d window %d" % (method, k_bits, v_bits, dim,
                                                                 blocks, window))


def test_torch_ops_window_dtypes_strides_splits_and_threads():
    heads, g, dim = 3, 4, 64
    k, v = synthetic(20 * 32 + 7, heads, dim, seed=3)
    q = torch.randn(heads * g, dim)
    rec = ops.quantize(k[:640], v[:640], "kivi", 2, 2)
    kd, vd = ops.dequantize(rec, "kivi", dim, 2, 2)
    base = dict(method="kivi", k_bits=2, v_bits=2)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        wk, wv, qd = k[640:].to(dtype), v[640:].to(dtype), q.to(dtype)
        out, lse = ops.decode_attention(qd, rec, wk, wv, **base)
        ref = reference(qd.float(), torch.cat([kd, wk.float()]), torch.cat([vd, wv.float()]),
                        heads, 1 / 8)
        assert_close(out, lse, *ref, what=str(dtype))
        # A [H, Tw, D] cache read through a transposed (strided) view gives the same answer.
        strided_k = wk.permute(1, 0, 2).contiguous().permute(1, 0, 2)
        strided_v = wv.permute(1, 0, 2).contiguous().permute(1, 0, 2)
        assert strided_k.stride() != wk.stride()
        out2, lse2 = ops.decode_attention(qd, rec, strided_k, strided_v, **base)
        assert torch.equal(out2, out) and torch.equal(lse2, lse), dtype
    one, one_lse = ops.decode_attention(q, rec, k[640:], v[640:], splits=1, **base)
    for splits in (2, 5, 20):
        got, got_lse = ops.decode_attention(q, rec, k[640:], v[640:], splits=splits, **base)
        assert_close(got, got_lse, one.double(), one_lse.double(), tol=2e-5,
                     what="splits %d" % splits)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single, _ = ops.decode_attention(q, rec, k[640:], v[640:], splits=3, **base)
    finally:
        torch.set_num_threads(threads)
    multi, _ = ops.decode_attention(q, rec, k[640:], v[640:], splits=3, **base)
    assert torch.equal(single, multi)  # Same parts, same merge order: thread count is invisible.


def test_torch_ops_empty_cache_and_known_answer():
    dim = 64
    rec = torch.empty(1, 0, ops.layout("kivi", dim)["record_bytes"], dtype=torch.uint8)
    out, lse = ops.decode_attention(torch.ones(2, dim), rec, None, None, "kivi")
    assert torch.all(out == 0) and torch.all(torch.isneginf(lse))
    # Eight identical fp16-record keys: out = mean of V, lse = s + log 8.
    k = torch.full((32, 1, dim), 0.25)
    v = torch.randn(32, 1, dim).half().float()
    rec = ops.quantize(k, v, "fp16")
    q = torch.ones(1, dim)
    out, lse = ops.decode_attention(q, rec, None, None, "fp16", scale=0.5)
    assert torch.allclose(out[0], v[:, 0].mean(0), atol=1e-6)
    assert abs(lse.item() - (0.5 * 0.25 * dim + math.log(32))) < 1e-5


def test_torch_ops_paged_equals_dense_with_records_in_any_order():
    heads, g, dim = 2, 2, 128
    G = ops.layout("oscar", dim)["block_tokens"]
    k, v = synthetic(5 * G + 9, heads, dim, seed=9)
    norms = ops.token_norms(k[:5 * G])
    rec = ops.quantize(k[:5 * G], v[:5 * G], "oscar", 2, 2, token_norms=norms)
    q = torch.randn(heads * g, dim)
    dense = ops.decode_attention(q, rec, k[5 * G:], v[5 * G:], "oscar", token_norms=norms,
                                 splits=1)
    # Scatter the records (and norms) into a "pool" in a shuffled order, 8-byte padding between.
    rb = rec.shape[2]
    order = torch.randperm(heads * 5, generator=torch.Generator().manual_seed(1)).tolist()
    slot = rb + 8
    pool = torch.zeros(len(order) * slot + 5 * G * 4, dtype=torch.uint8)
    offsets = torch.empty(heads * 5, dtype=torch.int64)
    for i, where in enumerate(order):
        h, b = divmod(i, 5)
        pool[where * slot:where * slot + rb] = rec[h, b]
        offsets[i] = where * slot
    norm_base = len(order) * slot
    pool[norm_base:] = norms.view(torch.uint8)
    norm_offsets = torch.tensor([norm_base + (i % 5) * G * 4 for i in range(heads * 5)])
    window_k = k[5 * G:].permute(1, 0, 2).reshape(-1, dim)  # head 0's rows, then head 1's
    window_v = v[5 * G:].permute(1, 0, 2).reshape(-1, dim)
    paged = ops.paged_decode_attention(
        q, pool, offsets, torch.tensor([0, 5, 10]), window_k, window_v, torch.tensor([0, 9, 18]),
        "oscar", norm_offsets=norm_offsets, splits=1)
    assert torch.equal(paged[0], dense[0]) and torch.equal(paged[1], dense[1])


def test_torch_ops_errors_name_the_argument():
    dim = 64
    k, v = synthetic(128, 2, dim, seed=1)
    rec = ops.quantize(k, v, "kivi")
    q = torch.randn(4, dim)

    def raises(exc, text, fn, *args, **kwargs):
        with pytest.raises(exc) as info:
            fn(*args, **kwargs)
        assert text in str(info.value), str(info.value)

    raises(ValueError, "method", ops.quantize, k, v, "nope")
    raises(ValueError, "k_bits: got 5", ops.quantize, k, v, "kivi", 5, 2)
    raises(ValueError, "k: tokens must be a positive multiple of block_tokens 32",
           ops.quantize, k[:100], v[:100], "kivi")
    raises(ValueError, "v: shape", ops.quantize, k, v[:, :1], "kivi")
    raises(ValueError, "k: dtype", ops.quantize, k.double(), v, "kivi")
    raises(ValueError, "k: expected [tokens, heads, head_dim]", ops.quantize, k[0], v[0], "kivi")
    raises(ValueError, "token_norms: given", ops.quantize, k, v, "kivi",
           token_norms=torch.ones(128))
    raises(ValueError, "token_norms: required", ops.dequantize,
           ops.quantize(k, v, "oscar"), "oscar", dim)
    raises(ValueError, "records: dtype", ops.decode_attention, q, rec.float(), None, None, "kivi")
    raises(ValueError, "records: expected [heads, blocks, ", ops.decode_attention, q, rec, None,
           None, "kivi", 4, 4)
    raises(ValueError, "q: expected [q_heads, head_dim]", ops.decode_attention, q[0], rec, None,
           None, "kivi")
    raises(ValueError, "q: q_heads 5", ops.decode_attention, torch.randn(5, dim), rec, None, None,
           "kivi")
    raises(ValueError, "q: non-finite", ops.decode_attention, q * float("nan"), rec, None, None,
           "kivi")
    raises(ValueError, "window_k/window_v: give both", ops.decode_attention, q, rec, k, None,
           "kivi")
    raises(ValueError, "window_v: 3 tokens", ops.decode_attention, q, rec, k[:4], v[:3], "kivi")
    raises(ValueError, "window_k: head_dim", ops.decode_attention, q, rec, k[:4, :, :32],
           v[:4, :, :32], "kivi")
    raises(ValueError, "scale", ops.decode_attention, q, rec, None, None, "kivi", scale=-1.0)
    pool = rec.reshape(-1)
    raises(ValueError, "record_offsets[1]", ops.paged_decode_attention, q, pool,
           torch.tensor([0, pool.numel()]), torch.tensor([0, 1, 2]), method="kivi")
    raises(ValueError, "indptr[-1]", ops.paged_decode_attention, q, pool, torch.tensor([0]),
           torch.tensor([0, 1, 2]), method="kivi")
    raises(ValueError, "norm_offsets: required", ops.paged_decode_attention, q, pool,
           torch.tensor([0]), torch.tensor([0, 1, 1]), method="oscar")
    if torch.cuda.is_available() and not ops.has_cuda_kernels():  # Refused with a clear message.
        raises(RuntimeError, "CUDA tensors", ops.decode_attention, q.cuda(), rec, None, None,
               "kivi")


# --- CUDA kernels (bindings/torch/kvctl_torch_cuda.cc) against the CPU ones --------------------

CUDA_OPS = ("quantize", "dequantize", "decode_attention", "paged_decode_attention")


def test_torch_ops_cuda_kernels_registered_when_built():
    if not ops.has_cuda_kernels():
        pytest.skip("kvctl_torch was built without the CUDA kernels (KVCTL_CUDA=OFF, no nvcc, or "
                    "a CPU-only torch)")
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    for name in CUDA_OPS:
        assert has("kvctl::" + name, "CUDA"), name
        assert has("kvctl::" + name, "CompositeImplicitAutograd"), name  # The CPU kernel.
    for name in ("token_norms", "layout"):  # CPU-only by design.
        assert not has("kvctl::" + name, "CUDA"), name


def _skip_without_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (torch.cuda.is_available() is False)")
    if not ops.has_cuda_kernels():
        pytest.skip("kvctl_torch was built without the CUDA kernels")


CUDA_METHODS = [("fp16", 16, 16)] + [(m, 2, 2) for m in ("kivi", "quarot", "kvarn", "oscar",
                                                          "turbo")]
# (heads, query rows per KV head, head_dim, records per head, window rows)
CUDA_SHAPES = [(2, 3, 64, 3, 5), (4, 1, 128, 2, 0), (1, 4, 128, 0, 19)]


def _rel_rms(a, b):
    return ((a.double() - b.double()).pow(2).mean().sqrt() / b.double().pow(2).mean().sqrt()).item()


@pytest.mark.parametrize("shape", CUDA_SHAPES[:2])
@pytest.mark.parametrize("method,k_bits,v_bits", CUDA_METHODS)
def test_torch_ops_cuda_quantize_and_dequantize_match_cpu(method, k_bits, v_bits, shape):
    _skip_without_cuda()
    heads, _, dim, blocks, _ = shape
    G = ops.layout(method, dim, k_bits, v_bits)["block_tokens"]
    k, v = synthetic(blocks * G, heads, dim, seed=dim + blocks)
    norms = ops.token_norms(k) if method == "oscar" else None
    rec = ops.quantize(k, v, method, k_bits, v_bits, token_norms=norms)
    cuda_norms = None if norms is None else norms.cuda()
    rec_gpu = ops.quantize(k.cuda(), v.cuda(), method, k_bits, v_bits, token_norms=cuda_norms)
    assert rec_gpu.is_cuda and rec_gpu.shape == rec.shape and rec_gpu.dtype == torch.uint8
    kd, vd = ops.dequantize(rec, method, dim, k_bits, v_bits, token_norms=norms)
    # The CPU's records decoded on the GPU: plain IEEE ops on both sides, so exact.
    kg, vg = ops.dequantize(rec.cuda(), method, dim, k_bits, v_bits, token_norms=cuda_norms)
    assert kg.is_cuda and kg.shape == kd.shape
    assert torch.equal(kg.cpu(), kd) and torch.equal(vg.cpu(), vd), method
    if method != "kvarn":
        assert torch.equal(rec_gpu.cpu(), rec), method  # Bit-identical (kernels/cuda/quant_cuda.h)
    else:
        # Device logf/expf may differ from glibc by an ulp: compare what the records decode to.
        kgg, vgg = ops.dequantize(rec_gpu.cpu(), method, dim, k_bits, v_bits)
        assert _rel_rms(kgg, kd) < 1e-2 and _rel_rms(vgg, vd) < 1e-2
    if method == "oscar":  # Norms computed from a device K equal the CPU's.
        assert torch.equal(ops.quantize(k.cuda(), v.cuda(), method, k_bits, v_bits).cpu(), rec)


@pytest.mark.parametrize("shape", CUDA_SHAPES)
@pytest.mark.parametrize("method,k_bits,v_bits", CUDA_METHODS)
def test_torch_ops_cuda_decode_attention_matches_cpu(method, k_bits, v_bits, shape):
    _skip_without_cuda()
    heads, g, dim, blocks, window = shape
    G = ops.layout(method, dim, k_bits, v_bits)["block_tokens"]
    k, v = synthetic(blocks * G + window, heads, dim, seed=7 * dim + blocks + window)
    q = torch.randn(heads * g, dim, generator=torch.Generator().manual_seed(blocks))
    kq, vq = k[:blocks * G], v[:blocks * G]
    norms = ops.token_norms(kq) if method == "oscar" and blocks else None
    if blocks:
        rec = ops.quantize(kq, vq, method, k_bits, v_bits, token_norms=norms)
    else:
        rec = torch.empty(heads, 0, ops.layout(method, dim, k_bits, v_bits)["record_bytes"],
                          dtype=torch.uint8)
    for wdtype in (torch.float16, torch.float32):
        wk = k[blocks * G:].to(wdtype) if window else None
        wv = v[blocks * G:].to(wdtype) if window else None
        cpu = ops.decode_attention(q, rec, wk, wv, method, k_bits, v_bits, token_norms=norms)
        gpu = ops.decode_attention(
            q.cuda(), rec.cuda(), None if wk is None else wk.cuda(),
            None if wv is None else wv.cuda(), method, k_bits, v_bits,
            token_norms=None if norms is None else norms.cuda())
        assert gpu[0].is_cuda and gpu[1].is_cuda
        assert_close(gpu[0].cpu(), gpu[1].cpu(), cpu[0].double(), cpu[1].double(),
                     what="%s %s %s" % (method, shape, wdtype))


def test_torch_ops_cuda_paged_attention_side_stream_and_mixed_window_dtypes():
    _skip_without_cuda()
    heads, g, dim = 2, 2, 128
    G = ops.layout("oscar", dim)["block_tokens"]
    k, v = synthetic(5 * G + 9, heads, dim, seed=9)
    norms = ops.token_norms(k[:5 * G])
    rec = ops.quantize(k[:5 * G], v[:5 * G], "oscar", 2, 2, token_norms=norms)
    q = torch.randn(heads * g, dim)
    rb = rec.shape[2]
    pool = torch.cat([rec.reshape(-1), norms.view(torch.uint8)])
    offsets = torch.arange(heads * 5, dtype=torch.int64) * rb
    norm_offsets = torch.tensor([heads * 5 * rb + (i % 5) * G * 4 for i in range(heads * 5)])
    window_k = k[5 * G:].permute(1, 0, 2).reshape(-1, dim)
    window_v = v[5 * G:].permute(1, 0, 2).reshape(-1, dim).half()  # K fp32, V fp16.
    indptr, window_indptr = torch.tensor([0, 5, 10]), torch.tensor([0, 9, 18])
    args = (q, pool, offsets, indptr, window_k, window_v, window_indptr, "oscar")
    cpu = ops.paged_decode_attention(*args, norm_offsets=norm_offsets)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):  # The ops run on torch's current stream.
        gpu = ops.paged_decode_attention(*[a.cuda() if torch.is_tensor(a) else a for a in args],
                                         norm_offsets=norm_offsets.cuda())
        out, lse = gpu[0].cpu(), gpu[1].cpu()
    assert_close(out, lse, cpu[0].double(), cpu[1].double(), what="paged oscar")


def test_torch_ops_cuda_refuses_a_device_mix():
    _skip_without_cuda()
    dim = 64
    k, v = synthetic(64, 2, dim, seed=2)
    rec = ops.quantize(k, v, "kivi")
    q = torch.randn(4, dim)
    for fn, args, text in (
            (ops.quantize, (k.cuda(), v, "kivi"), "v: on device cpu, expected cuda"),
            (ops.decode_attention, (q.cuda(), rec, None, None, "kivi"),
             "records: on device cpu, expected cuda"),
            (ops.decode_attention, (q, rec.cuda(), None, None, "kivi"),
             "q: on device cpu, expected cuda"),
            (ops.paged_decode_attention, (q.cuda(), rec.reshape(-1).cuda(), torch.tensor([0]),
                                          torch.tensor([0, 1, 1]).cuda(), None, None, None,
                                          "kivi"),
             "record_offsets: on device cpu, expected cuda")):
        with pytest.raises(ValueError) as info:
            fn(*args)
        assert text in str(info.value), str(info.value)


# --- through the real daemon ---------------------------------------------------------------


def _daemon_for(daemon_factory, method, bits, **extra):
    return daemon_factory(quant__method=method, quant__k_bits=bits, quant__v_bits=bits,
                          pool__bytes="64MiB", **extra)


@pytest.mark.parametrize("method", ["kivi", "quarot", "kvarn", "oscar", "turbo", "fp16"])
def test_torch_ops_records_and_dequantize_equal_the_daemons(method, daemon_factory, connect):
    bits = 16 if method == "fp16" else 2
    layers, heads, dim = 2, 2, 64
    d = _daemon_for(daemon_factory, method, bits)
    c = connect(d)
    c.hello(layers, heads, dim, dtype="float16", q_heads=heads * 3)
    lay = ops.layout(method, dim, bits, bits)
    sinks, flush = lay["sink_tokens"], lay["flush_tokens"]
    total = sinks + 2 * flush + 5
    rng = np.random.default_rng(4)
    k = (rng.standard_normal((layers, total, heads, dim)) * 2 + 0.5).astype(np.float16)
    v = rng.standard_normal((layers, total, heads, dim)).astype(np.float16)
    c.open(1)
    c.append(1, k, v)
    blocks = c.fetch_blocks(1)
    fk, fv, pos = c.fetch(1, dtype="float32", stacked=True)
    assert pos.tolist() == list(range(total))
    span = slice(sinks, sinks + 2 * flush)
    with PoolView.from_client(c) as view:
        side = view.side_offsets(blocks)
        for layer in range(layers):
            kq = torch.from_numpy(k[layer, span].astype(np.float32))
            vq = torch.from_numpy(v[layer, span].astype(np.float32))
            norms = ops.token_norms(kq) if method == "oscar" else None
            ours = ops.quantize(kq, vq, method, bits, bits, token_norms=norms,
                                block_tokens=blocks.block_tokens)
            theirs = torch.stack([torch.stack(view.pair_records(blocks, layer * heads + h))
                                  for h in range(heads)])
            assert torch.equal(ours, theirs), (method, layer)
            if method == "oscar":
                pair = layer * heads
                a = int(blocks.indptr[pair])
                G = blocks.block_tokens
                stored = torch.cat([view.record(int(side[a + b]), G * 4).view(torch.float32)
                                    for b in range(ours.shape[1])])
                assert torch.equal(stored, norms)
            kd, vd = ops.dequantize(theirs, method, dim, bits, bits, token_norms=norms)
            assert torch.equal(kd, torch.from_numpy(fk[layer, span]))
            assert torch.equal(vd, torch.from_numpy(fv[layer, span]))


def test_torch_ops_pool_views_feed_fused_attention_without_copies(daemon_factory, connect):
    layers, heads, g, dim = 2, 3, 3, 64
    # 128 sinks set explicitly: the token counts and window checks below are laid out by them.
    d = _daemon_for(daemon_factory, "kvarn", 2, quant__sink_tokens=128)
    c = connect(d)
    c.hello(layers, heads, dim, dtype="float16", q_heads=heads * g)
    rng = np.random.default_rng(5)
    total = 128 + 256 + 11
    k = (rng.standard_normal((layers, total + 128, heads, dim)) * 2).astype(np.float16)
    v = rng.standard_normal((layers, total + 128, heads, dim)).astype(np.float16)
    c.open(1)
    c.append(1, k[:, :total], v[:, :total])
    view = PoolView.from_client(c)
    assert view.nbytes == c.session.pool_bytes
    q = torch.randn(heads * g, dim)
    for step in range(2):
        blocks = c.fetch_blocks(1)
        fk, fv, _ = c.fetch(1, dtype="float32", stacked=True)
        for layer in range(layers):
            out, lse = view.layer_attention(blocks, layer, q)
            ref = reference(q, torch.from_numpy(fk[layer]), torch.from_numpy(fv[layer]), heads,
                            1 / 8)
            assert_close(out, lse, *ref, what="layer %d step %d" % (layer, step))
        recs = view.pair_records(blocks, 0)
        assert len(recs) == (2 if step == 0 else 3)
        # Window rows come from the pool too: sinks, then tail, as the dense FETCH has them.
        for pair in range(layers * heads):
            layer, h = divmod(pair, heads)
            window = blocks.window_positions[layer][h].tolist()
            assert int(blocks.window_sinks[pair]) == 128 and window[:128] == list(range(128))
            wk, wv = view.window_rows(blocks, pair)
            assert wk.dtype == torch.float16
            assert torch.equal(wk.float(), torch.from_numpy(fk[layer, window, h]))
            assert torch.equal(wv.float(), torch.from_numpy(fv[layer, window, h]))
        # Views, not copies: every record tensor shares the pool mapping's storage.
        base = view.tensor.untyped_storage().data_ptr()
        assert all(r.untyped_storage().data_ptr() == base for r in recs)
        # The daemon writes new records into the same mapping: the old view sees them.
        if step == 0:
            c.append(1, k[:, total:], v[:, total:])
    c.close(1)
    view.close()


def test_kvbench_attention_json_smoke():
    """kvbench attention --quick --json (the kvbench next to the daemon under test): fused and
    both fp32 baselines ran, the baselines agree, every field is sane."""
    import json
    import os
    import subprocess

    from helpers import kvctl_binary

    kvbench = os.path.join(os.path.dirname(kvctl_binary()), "kvbench")
    if not os.access(kvbench, os.X_OK):
        pytest.skip("kvbench not built next to %s" % kvctl_binary())
    run = subprocess.run([kvbench, "attention", "--quick", "--json", "--threads", "1",
                          "--geometries", "smollm2", "--methods", "kivi,kvarn"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["threads"] == 1 and len(report["rows"]) == 1
    row = report["rows"][0]
    assert (row["tokens"], row["kv_heads"], row["q_heads"], row["head_dim"]) == (4096, 3, 9, 64)
    assert row["simd_fp32_us"] > 0
    if report["torch"] is not None:  # kvbench linked libtorch: the SDPA baseline ran and agrees.
        assert row["torch_sdpa_fp32_us"] > 0 and row["simd_vs_sdpa_max_rel_diff"] < 1e-3
    assert [f["method"] for f in row["fused"]] == ["kivi", "kvarn"]
    for f in row["fused"]:
        assert f["us"] > 0 and f["quantized_tokens"] + f["window_tokens"] == 4096
        assert 0 < f["max_rel_err_vs_fp32"] < 3  # 2-bit error on heavy-tailed V, not garbage.
    bad = subprocess.run([kvbench, "attention", "--bits", "5"], capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 1 and "--bits: got 5" in bad.stderr


def test_torch_ops_pool_views_with_per_head_layouts(daemon_factory, connect, workdir,
                                                    monkeypatch):
    """A [[quant.override]] gives head 1 of layer 0 its own widths (its own layout in the blocks
    reply): layer_attention attends that head separately and still matches SDPA, and every
    pair's records, read at the addresses its own layout's records_per_page gives, dequantize to
    the dense FETCH. When heads pack records per page by their own record size, the 4-bit and
    2-bit layouts also differ in records_per_page; the checks hold with one shared value too."""
    import os

    from helpers import kvctl_binary

    config = os.path.join(workdir, "override.toml")
    with open(config, "w") as f:
        f.write('[quant]\nmethod = "kvarn"\n\n[[quant.override]]\nlayer = 0\nhead = 1\n'
                'k_bits = 4\nv_bits = 4\n')
    wrapper = os.path.join(workdir, "kvctl-with-config.sh")
    with open(wrapper, "w") as f:
        f.write('#!/bin/sh\nexec "%s" --config "%s" "$@"\n' % (kvctl_binary(), config))
    os.chmod(wrapper, 0o755)
    monkeypatch.setenv("KVCTL_BIN", wrapper)
    layers, heads, g, dim = 2, 2, 2, 64
    c = connect(daemon_factory(pool__bytes="64MiB"))
    c.hello(layers, heads, dim, dtype="float16", q_heads=heads * g)
    rng = np.random.default_rng(6)
    total = 128 + 256 + 3
    k = (rng.standard_normal((layers, total, heads, dim)) * 2).astype(np.float16)
    v = rng.standard_normal((layers, total, heads, dim)).astype(np.float16)
    c.open(1)
    c.append(1, k, v)
    blocks = c.fetch_blocks(1)
    widths = [(blocks.layouts[i].k_bits, blocks.layouts[i].v_bits)
              for i in blocks.layout_index.tolist()]
    assert widths == [(2, 2), (4, 4), (2, 2), (2, 2)], widths
    page, widest = blocks.page_bytes, max(lay.record_bytes for lay in blocks.layouts)
    for lay in blocks.layouts:
        # Packed by the layout's own record size, or (one value for all) by the widest record.
        assert lay.records_per_page in (page // lay.record_bytes, page // widest), lay
    fk, fv, pos = c.fetch(1, dtype="float32", stacked=True)
    q = torch.randn(heads * g, dim)
    with PoolView.from_client(c) as view:
        for layer in range(layers):
            out, lse = view.layer_attention(blocks, layer, q)
            ref = reference(q, torch.from_numpy(fk[layer]), torch.from_numpy(fv[layer]), heads,
                            1 / 8)
            assert_close(out, lse, *ref, what="layer %d" % layer)
            for h in range(heads):
                pair = layer * heads + h
                lay = blocks.layouts[int(blocks.layout_index[pair])]
                recs = view.pair_records(blocks, pair)
                assert len(recs) * blocks.block_tokens == blocks.quantized_counts[pair] > 0
                window = blocks.window_positions[layer][h].tolist()
                quantized = [i for i, x in enumerate(pos.tolist()) if x not in set(window)]
                # The window rows, read from the pool, are the dense rows at their positions.
                wk, wv = view.window_rows(blocks, pair)
                assert torch.equal(wk.float(), torch.from_numpy(fk[layer, window, h]))
                assert torch.equal(wv.float(), torch.from_numpy(fv[layer, window, h]))
                kd, vd = ops.dequantize(torch.stack(recs).unsqueeze(0), "kvarn", dim,
                                        lay.k_bits, lay.v_bits,
                                        block_tokens=blocks.block_tokens)
                what = "layer %d head %d (records_per_page %d)" % (layer, h,
                                                                  lay.records_per_page)
                assert torch.equal(kd[:, 0], torch.from_numpy(fk[layer, quantized, h])), what
                assert torch.equal(vd[:, 0], torch.from_numpy(fv[layer, quantized, h])), what
    c.close(1)


@pytest.mark.parametrize("page_bytes", [4096, 4008])
def test_pool_view_window_rows_read_each_slot_at_its_layout_address(page_bytes):
    """Window rows are read at (id / rows_per_page) * page_bytes + (id % rows_per_page) *
    row_slot_bytes, K row then V row, in the layout's row dtype: PoolView (torch; a row-aligned
    fast path when page_bytes is a multiple of the row size, a byte gather otherwise) and
    BlocksTable.window_rows (numpy) agree with rows written there, for two pairs whose layouts
    differ in row dtype and slots per page. Runs without a daemon, on a shm object of its own."""
    import dataclasses
    import os

    from kvctl import protocol as proto
    from kvctl.client import BlocksTable

    dim, pages = 8, 4
    f16, f32 = proto.DTYPE_CODES["float16"], proto.DTYPE_CODES["float32"]
    base = proto.RecordLayout(0, 16, 16, f16, 32, 8, page_bytes // 4, *([0] * 8), 0, 4, 32, 16)
    # Pair 1: float32 rows in 72-byte slots (slack after V), never on row boundaries.
    lays = (base, dataclasses.replace(base, row_dtype=f32, row_slot_bytes=72, rows_per_page=40))
    ids = [[3, 17, 40], [121, 130]]  # Pair 1 on page 3 (slabs of one slot size own a page).
    rng = np.random.default_rng(7)
    raw = np.zeros(pages * page_bytes, dtype=np.uint8)
    want, offsets = [], []
    for pair, lay in enumerate(lays):
        dt = np.float16 if lay.row_dtype == f16 else np.float32
        rows_k = rng.standard_normal((len(ids[pair]), dim)).astype(dt)
        rows_v = rng.standard_normal((len(ids[pair]), dim)).astype(dt)
        want.append((rows_k, rows_v))
        for i, w in enumerate(ids[pair]):
            at = (w // lay.rows_per_page) * page_bytes + (w % lay.rows_per_page) * lay.row_slot_bytes
            offsets.append(at)
            raw[at:at + rows_k[i].nbytes] = rows_k[i].view(np.uint8)
            raw[at + rows_k[i].nbytes:at + 2 * rows_k[i].nbytes] = rows_v[i].view(np.uint8)
    name = "/kvctl-test-rows-%d-%d" % (os.getpid(), page_bytes)
    with open("/dev/shm" + name, "wb") as f:
        f.write(raw.tobytes())
    try:
        u32 = lambda *a: np.array(a, dtype=np.uint32)  # noqa: E731
        table = BlocksTable(
            0, 1, 2, dim, page_bytes, pages, 32, 0, lays, np.array([0, 1], dtype=np.uint16),
            u32(0, 0, 0), u32(), u32(0, 0), None, np.zeros(0, dtype=np.uint64),
            np.zeros(2, dtype=np.int64), u32(0, 3, 5), u32(*ids[0], *ids[1]), u32(0, 0),
            np.array(offsets, dtype=np.uint64), [[np.arange(3), np.arange(2)]])
        pool = np.memmap("/dev/shm" + name, dtype=np.uint8, mode="r")
        with PoolView(name) as view:
            for pair in range(2):
                k, v = view.window_rows(table, pair)
                nk, nv = table.window_rows(pool, pair)
                assert np.array_equal(k.numpy(), want[pair][0]), pair
                assert np.array_equal(v.numpy(), want[pair][1]), pair
                assert np.array_equal(nk, want[pair][0]) and np.array_equal(nv, want[pair][1])
            with pytest.raises(ValueError, match="pair: got 2"):
                view.window_rows(table, 2)
        del pool
    finally:
        os.unlink("/dev/shm" + name)
