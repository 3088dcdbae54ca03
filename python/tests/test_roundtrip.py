# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Data through the real daemon: lossless exactness per dtype, KVarN streaming (sinks, records,
tail; batching-independent), staging vs inline, layer ranges and the blocks page table."""

import numpy as np
import pytest

import kvctl
from helpers import random_kv, relative_mse

LAYERS, HEADS, DIM = 2, 2, 64


def test_lossless_float32_round_trip_is_exact(lossless_daemon, connect):
    c = connect(lossless_daemon)
    s = c.hello(LAYERS, HEADS, DIM, dtype="float32", model_name="exact")
    assert s.dtype == "float32" and s.session_id != 0
    assert s.quant.method_name == "fp16"  # Lossless sessions report no quantizer.
    c.open(1)
    k, v = random_kv(LAYERS, 37, HEADS, DIM, seed=1)
    k[0, 5, 1, 7] = 1e30  # Beyond fp16: lossless float32 keeps it.
    first = c.append(1, k[:, :30], v[:, :30])
    assert (first.tokens_total, first.tokens_quantized) == (30, 0)
    second = c.append(1, k[:, 30:], v[:, 30:])  # first_position tracked by the client: 30.
    assert second.tokens_total == 37
    fk, fv, pos = c.fetch(1)
    assert len(fk) == LAYERS and all(len(layer) == HEADS for layer in fk)
    for layer in range(LAYERS):
        for head in range(HEADS):
            assert fk[layer][head].dtype == np.float32
            assert np.array_equal(fk[layer][head], k[layer, :, head])
            assert np.array_equal(fv[layer][head], v[layer, :, head])
            assert pos[layer][head].tolist() == list(range(37))
    sk, sv, spos = c.fetch(1, stacked=True)
    assert sk.shape == (LAYERS, 37, HEADS, DIM)
    assert np.array_equal(sk, k) and np.array_equal(sv, v)
    assert spos.tolist() == list(range(37))
    # One layer, and a non-zero first position on a fresh sequence.
    c.open(2)
    c.append(2, k[:, :4], v[:, :4], first_position=1000)
    c.append(2, k[:, 4:6], v[:, 4:6])
    one_k, one_v, one_pos = c.fetch(2, layers=1, stacked=True)
    assert one_k.shape == (1, 6, HEADS, DIM)
    assert np.array_equal(one_k[0], k[1, :6]) and np.array_equal(one_v[0], v[1, :6])
    assert one_pos.tolist() == list(range(1000, 1006))
    assert c.close(1) > 0 and c.close(2) > 0


def test_lossless_blocks_fetch_has_no_records_and_every_row_in_the_window(lossless_daemon,
                                                                         connect):
    # A lossless sequence holds no records: blocks FETCH answers with a placeholder layout and
    # every row in the window, read from the pool exactly as sent (float32 rows), instead of
    # failing inside the daemon.
    c = connect(lossless_daemon)
    s = c.hello(LAYERS, HEADS, DIM, dtype="float32", model_name="exact-blocks")
    c.open(1)
    k, v = random_kv(LAYERS, 41, HEADS, DIM, seed=5)
    c.append(1, k, v)
    b = c.fetch_blocks(1)
    pairs = LAYERS * HEADS
    assert b.indptr.tolist() == [0] * (pairs + 1)
    assert b.quantized_counts.tolist() == [0] * pairs
    assert b.window_counts.tolist() == [41] * pairs
    assert b.layouts[0].method_name == "fp16"
    assert b.layouts[0].row_dtype == kvctl.protocol.DTYPE_CODES["float32"]
    pool = np.memmap("/dev/shm/" + s.shm_name.lstrip("/"), dtype=np.uint8, mode="r")
    for layer in range(LAYERS):
        for head in range(HEADS):
            wk, wv = b.window_rows(pool, layer * HEADS + head)
            assert wk.dtype == np.float32
            assert np.array_equal(wk, k[layer, :, head])
            assert np.array_equal(wv, v[layer, :, head])
            assert b.window_positions[layer][head].tolist() == list(range(41))
    assert b.window_sinks.tolist() == [0] * pairs
    del pool
    assert c.close(1) > 0


def test_lossless_float16_round_trip_is_exact(lossless_daemon, connect):
    c = connect(lossless_daemon)
    c.hello(LAYERS, HEADS, DIM, dtype=np.float16)
    c.open(7)
    k, v = random_kv(LAYERS, 50, HEADS, DIM, seed=2, dtype=np.float16)
    c.append(7, k, v)
    fk, fv, pos = c.fetch(7, dtype="float16", stacked=True)
    assert fk.dtype == np.float16
    assert np.array_equal(fk, k) and np.array_equal(fv, v)
    assert pos.tolist() == list(range(50))
    wide_k, _, _ = c.fetch(7, dtype="float32", stacked=True)
    assert np.array_equal(wide_k, k.astype(np.float32))
    # float32 input to a float16 session is rounded by the client, as numpy rounds.
    k32, v32 = random_kv(LAYERS, 3, HEADS, DIM, seed=3)
    c.append(7, k32, v32)
    tail_k, _, _ = c.fetch(7, dtype="float16", stacked=True)
    assert np.array_equal(tail_k[:, 50:], k32.astype(np.float16))


def test_lossless_bfloat16_round_trip_is_exact(lossless_daemon, connect):
    # numpy has no bfloat16: bf16 data travels as uint16 bit patterns.
    c = connect(lossless_daemon)
    c.hello(LAYERS, HEADS, DIM, dtype="bfloat16")
    c.open(3)
    k32, v32 = random_kv(LAYERS, 20, HEADS, DIM, seed=4)
    k_bits, v_bits = kvctl.float32_to_bf16(k32), kvctl.float32_to_bf16(v32)
    c.append(3, k_bits, v_bits)
    c.append(3, k32[:, :5], v32[:, :5])  # float input is rounded to bf16 by the client.
    fk, fv, pos = c.fetch(3, dtype="bfloat16", stacked=True)
    assert fk.dtype == np.uint16
    assert np.array_equal(fk[:, :20], k_bits) and np.array_equal(fv[:, :20], v_bits)
    assert np.array_equal(fk[:, 20:], k_bits[:, :5])
    assert pos.tolist() == list(range(25))
    wide_k, _, _ = c.fetch(3, dtype="float32", stacked=True)
    assert np.array_equal(wide_k[:, :20], kvctl.bf16_to_float32(k_bits))


def test_kvarn_float16_prefill_then_decode(kvarn_daemon, connect):
    c = connect(kvarn_daemon)
    s = c.hello(LAYERS, HEADS, DIM, dtype="float16", model_name="synthetic")
    q = s.quant
    assert (q.method_name, q.k_bits, q.v_bits) == ("kvarn", 2, 2)
    assert (q.block_tokens, q.sink_tokens, q.flush_tokens) == (128, 128, 128)
    prefill, decode = 300, 60
    total = prefill + decode
    k, v = random_kv(LAYERS, total, HEADS, DIM, seed=5, dtype=np.float16)
    c.open(1)
    r = c.append(1, k[:, :prefill], v[:, :prefill])
    # Sinks 0..127 stay fp16; the tail 128..299 flushed one 128-token record when it reached
    # flush_tokens, leaving 44 tail tokens.
    assert (r.tokens_total, r.tokens_quantized) == (300, 128)
    for t in range(prefill, total):
        r = c.append(1, k[:, t:t + 1], v[:, t:t + 1])
    assert (r.tokens_total, r.tokens_quantized) == (360, 128)

    fk, fv, pos = c.fetch(1, stacked=True)
    assert fk.shape == (LAYERS, total, HEADS, DIM) and fk.dtype == np.float32
    assert pos.tolist() == list(range(total))
    sinks = slice(0, 128)
    assert np.array_equal(fk[:, sinks], k[:, sinks].astype(np.float32))
    assert np.array_equal(fv[:, sinks], v[:, sinks].astype(np.float32))
    tail = slice(256, total)
    assert np.array_equal(fk[:, tail], k[:, tail].astype(np.float32))
    assert np.array_equal(fv[:, tail], v[:, tail].astype(np.float32))
    quantized = slice(128, 256)
    err_k = relative_mse(fk[:, quantized], k[:, quantized])
    err_v = relative_mse(fv[:, quantized], v[:, quantized])
    # 2-bit min-max codes on Gaussian rows: step ~1.6 sigma, so ~0.21 relative MSE is expected on
    # the quantized span itself; the whole sequence (sinks and tail exact) stays under 0.2.
    assert 0 < err_k < 0.3 and 0 < err_v < 0.3, (err_k, err_v)
    assert relative_mse(fk, k) < 0.2 and relative_mse(fv, v) < 0.2

    # The same tokens all at once and one at a time give bit-identical reads.
    c.open(2)
    c.append(2, k, v)
    c.open(3)
    for t in range(total):
        c.append(3, k[:, t:t + 1], v[:, t:t + 1])
    for seq in (2, 3):
        ok, ov, opos = c.fetch(seq, stacked=True)
        assert np.array_equal(ok, fk) and np.array_equal(ov, fv), seq
        assert np.array_equal(opos, pos)

    # Blocks mode: records cover 128..255 of every pair; sinks and tail are row slots in the
    # pool, their positions two runs.
    b = c.fetch_blocks(1)
    pairs = LAYERS * HEADS
    assert b.n_layers == LAYERS and b.kv_heads == HEADS and b.block_tokens == 128
    assert b.quantized_counts.tolist() == [128] * pairs
    assert b.window_counts.tolist() == [total - 128] * pairs
    assert b.window_sinks.tolist() == [128] * pairs
    assert b.indptr.tolist() == list(range(pairs + 1))
    lay = b.layouts[0]
    assert lay.method_name == "kvarn" and (lay.k_bits, lay.v_bits) == (2, 2)
    assert np.all(b.record_offsets + lay.record_bytes <= s.pool_bytes)
    assert len(set(b.record_offsets.tolist())) == pairs
    assert np.all(b.window_offsets + 2 * DIM * 2 <= s.pool_bytes)
    pool = np.memmap("/dev/shm/" + s.shm_name.lstrip("/"), dtype=np.uint8, mode="r")
    for layer in range(LAYERS):
        for head in range(HEADS):
            rows_pos = b.window_positions[layer][head]
            assert rows_pos.tolist() == list(range(128)) + list(range(256, total))
            wk, wv = b.window_rows(pool, layer * HEADS + head)
            assert wk.dtype == np.float16
            assert np.array_equal(wk, np.concatenate([k[layer, :128, head], k[layer, 256:, head]]))
            assert np.array_equal(wv, np.concatenate([v[layer, :128, head], v[layer, 256:, head]]))
    del pool
    # With the table held, the daemon lists no record again (PROTOCOL.md 4.5 "Only what is
    # new"); a flush later it lists only the new records, and the merged table is the whole one.
    assert b.table_tags.shape == (pairs,)
    same = c.fetch_blocks(1, held=b)
    assert same.indices.tolist() == b.indices.tolist()
    assert same.record_offsets.tolist() == b.record_offsets.tolist()
    assert same.table_tags.tolist() == b.table_tags.tolist()
    c.append(1, k[:, :128], v[:, :128])
    grown = c.fetch_blocks(1, held=b)
    fresh = c.fetch_blocks(1)
    assert grown.quantized_counts.tolist() == [256] * pairs
    for name in ("indptr", "indices", "record_offsets", "table_tags", "window_ids"):
        assert getattr(grown, name).tolist() == getattr(fresh, name).tolist(), name
    with pytest.raises(ValueError, match="held: a table of layers"):
        c.fetch_blocks(1, layers=1, held=b)
    # A blocks FETCH carries no rows: fetch() reads dense only.
    with pytest.raises(ValueError, match="fetch_blocks"):
        c.fetch(1, mode="blocks")
    for seq in (1, 2, 3):
        c.close(seq)


@pytest.mark.parametrize("daemon_name", ["lossless_daemon", "kvarn_daemon"])
def test_staging_path_equals_inline_path(daemon_name, request, connect):
    daemon = request.getfixturevalue(daemon_name)
    c = connect(daemon)
    s = c.hello(LAYERS, HEADS, DIM, dtype="float16", q_heads=4)
    assert s.has_staging and s.staging_bytes > 0 and s.shm_name == daemon.shm_name
    k, v = random_kv(LAYERS, 200, HEADS, DIM, seed=6, dtype=np.float16)
    q, _ = random_kv(LAYERS, 200, 4, DIM, seed=7, dtype=np.float16)
    c.open(1)
    c.open(2)
    for lo, hi in ((0, 150), (150, 151), (151, 200)):
        inline = c.append(1, k[:, lo:hi], v[:, lo:hi], q=q[:, lo:hi])
        staged = c.append(2, k[:, lo:hi], v[:, lo:hi], q=q[:, lo:hi], use_staging=True)
        assert (inline.tokens_total, inline.tokens_quantized) == (
            staged.tokens_total, staged.tokens_quantized)
    for dtype in ("float16", "float32"):
        a = c.fetch(1, dtype=dtype, stacked=True)
        b = c.fetch(2, dtype=dtype, stacked=True)
        for x, y in zip(a, b):
            assert x.tobytes() == y.tobytes()
    too_big = s.staging_bytes // (2 * LAYERS * HEADS * DIM * 2) + 1
    kb, vb = random_kv(LAYERS, too_big, HEADS, DIM, seed=8, dtype=np.float16)
    with pytest.raises(ValueError, match="exceeds the staging slot"):
        c.append(2, kb, vb, use_staging=True)
    c.close(1)
    c.close(2)


def test_fetch_of_an_empty_sequence_and_an_empty_layer_range(lossless_daemon, connect):
    c = connect(lossless_daemon)
    c.hello(1, 1, 8, dtype="float32")
    c.open(1)
    with pytest.raises(ValueError, match="layers: got \\[1, 1\\)"):
        c.fetch(1, layers=(1, 1))
    k, v, pos = c.fetch(1, stacked=True)  # An empty sequence stacks to zero tokens.
    assert k.shape == (1, 0, 1, 8) and pos.tolist() == []


class _TensorLike:
    """What the client needs of a torch.Tensor (torch is not a dependency): detach(), cpu(),
    numpy(), dtype; numpy() of a bfloat16 tensor fails in torch, so float() must be used."""

    def __init__(self, data, dtype="torch.float32"):
        self.data, self.dtype = data, dtype

    def detach(self):
        return self

    def cpu(self):
        return self

    def float(self):
        return _TensorLike(kvctl.bf16_to_float32(self.data))

    def numpy(self):
        if self.dtype == "torch.bfloat16":
            raise TypeError("Got unsupported ScalarType BFloat16")
        return self.data


def test_tensors_and_lists_are_accepted(lossless_daemon, connect):
    c = connect(lossless_daemon)
    c.hello(1, 1, 8, dtype="bfloat16")
    c.open(1)
    bits = kvctl.float32_to_bf16(np.linspace(-3, 3, 16, dtype=np.float32).reshape(1, 2, 1, 8))
    c.append(1, _TensorLike(bits, "torch.bfloat16"), _TensorLike(bits, "torch.bfloat16"))
    c.append(1, kvctl.bf16_to_float32(bits).tolist(), _TensorLike(kvctl.bf16_to_float32(bits)))
    k, v, _ = c.fetch(1, dtype="bfloat16", stacked=True)
    assert np.array_equal(k, np.concatenate([bits, bits], axis=1)) and np.array_equal(k, v)
    with pytest.raises(ValueError, match="dtype <U1"):
        c.append(1, np.full((1, 1, 1, 8), "x"), np.zeros((1, 1, 1, 8)))


def test_turbo_float16_round_trip_and_blocks_layout(daemon_factory, connect):
    # TurboQuant k3v3 (docs/algorithms.md §20): no sinks, 32-token records, flush at 128, set
    # explicitly (the split below assumes them, whatever the registry defaults are).
    d = daemon_factory(quant__method="turbo", quant__k_bits=3, quant__v_bits=3,
                       quant__sink_tokens=0, quant__flush_tokens=128, pool__bytes="64MiB")
    c = connect(d)
    s = c.hello(LAYERS, HEADS, DIM, dtype="float16", model_name="synthetic")
    q = s.quant
    assert (q.method_name, q.k_bits, q.v_bits) == ("turbo", 3, 3)
    assert (q.block_tokens, q.sink_tokens, q.flush_tokens) == (32, 0, 128)
    total = 300
    k, v = random_kv(LAYERS, total, HEADS, DIM, seed=9, dtype=np.float16)
    c.open(1)
    r = c.append(1, k, v)
    assert (r.tokens_total, r.tokens_quantized) == (300, 256)
    fk, fv, _ = c.fetch(1, stacked=True)
    tail = slice(256, total)
    assert np.array_equal(fk[:, tail], k[:, tail].astype(np.float32))
    quantized = slice(0, 256)
    # 3-bit Lloyd-Max codes of a uniform direction: ~0.034 relative MSE (docs/algorithms.md §20.2).
    err_k = relative_mse(fk[:, quantized], k[:, quantized])
    err_v = relative_mse(fv[:, quantized], v[:, quantized])
    assert 0.02 < err_k < 0.05 and 0.02 < err_v < 0.05, (err_k, err_v)
    b = c.fetch_blocks(1)
    lay = b.layouts[0]
    assert lay.method_name == "turbo" and (lay.k_bits, lay.v_bits) == (3, 3)
    # Per record: 32 rows of DIM 3-bit codes and 32 fp16 norms, for K and for V.
    assert lay.record_bytes == 2 * (32 * DIM * 3 // 8 + 64)
    c.close(1)
