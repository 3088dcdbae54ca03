# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""PyTorch ops over kvctl's kernels (bindings/torch, registered as torch.ops.kvctl.*).

Quantize K/V tensors into block records, dequantize them, and run fused decode attention that
reads the records in place (never a dequantized cache), on CPU tensors, and on CUDA tensors when
the library was built with the CUDA kernels (has_cuda_kernels(); docs/gpu.md). The records are
the daemon's bytes: a record written here equals the one the daemon stores for the same rows.
All tensor arguments of one call must be on one device (a CPU/CUDA mix is a ValueError); the
outputs are on that device. token_norms and layout are CPU-only.

The extension is a shared library built by CMake when torch is importable (KVCTL_TORCH=AUTO|ON):
<build>/lib/libkvctl_torch.so. It is found through $KVCTL_TORCH_LIB, else <repo>/build/lib; or
call load(path). Every function raises RuntimeError with the build instructions when it is
missing, ValueError naming the argument for bad input.

    from kvctl import torch_ops as ops
    rec = ops.quantize(k, v, "kvarn", k_bits=2, v_bits=2)        # uint8 [H, T/G, record_bytes]
    out, lse = ops.decode_attention(q, rec, window_k, window_v, "kvarn", k_bits=2, v_bits=2)
    k_hat, v_hat = ops.dequantize(rec, "kvarn", head_dim=128, k_bits=2, v_bits=2)

Threads: torch.set_num_threads (the CPU ops run on torch's intra-op pool). CUDA: the ops run on
torch's current stream of the tensors' device (dequantize: the default stream) and return with
their results complete.
"""

import os
from typing import Optional, Tuple

import torch

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIB_NAME = "libkvctl_torch.so"
_loaded_from: Optional[str] = None
_load_error: Optional[str] = None


def _candidates():
    env = os.environ.get("KVCTL_TORCH_LIB")
    if env:
        return [env]
    return [os.path.join(_REPO, "build", "lib", _LIB_NAME)]


def load(path: Optional[str] = None) -> str:
    """Loads the extension (once per process) from `path` or the default places; returns the path.
    Raises RuntimeError saying how to build it when it cannot be found or loaded."""
    global _loaded_from, _load_error
    if _loaded_from is not None:
        return _loaded_from
    tried = [path] if path else _candidates()
    errors = []
    for p in tried:
        if not os.path.exists(p):
            errors.append("%s: not found" % p)
            continue
        try:
            torch.ops.load_library(p)
        except OSError as e:
            errors.append("%s: %s" % (p, e))
            continue
        _loaded_from = p
        return p
    _load_error = "; ".join(errors)
    raise RuntimeError(
        "kvctl torch extension not available (%s). Build it with `cmake -S . -B build "
        "-DKVCTL_TORCH=ON && cmake --build build --target kvctl_torch` (needs an importable torch), "
        "or point KVCTL_TORCH_LIB at libkvctl_torch.so" % _load_error)


def available() -> bool:
    """True when the extension loads (it is then loaded)."""
    try:
        load()
        return True
    except RuntimeError:
        return False


def has_cuda_kernels() -> bool:
    """True when the loaded extension was built with the CUDA kernels of quantize, dequantize,
    decode_attention and paged_decode_attention (KVCTL_CUDA on and a CUDA build of torch)."""
    return bool(_ops().has_cuda_kernels())


def open_cuda_pool(handle: torch.Tensor, pool_bytes: int, device: int) -> torch.Tensor:
    """The daemon's device pool (pool.backend = "cuda") as a CUDA uint8 tensor of pool_bytes,
    opened from HELLO's cuda_ipc_handle (CPU uint8 [64]) with cudaIpcOpenMemHandle; no copy.
    ValueError when this extension has no CUDA or the handle tensor is wrong; RuntimeError with
    CUDA's words when the handle cannot be opened."""
    return _ops().open_cuda_pool(handle, int(pool_bytes), int(device))


def _ops():
    load()
    return torch.ops.kvctl


def _bits(method: str, k_bits: Optional[int], v_bits: Optional[int]) -> Tuple[int, int]:
    if method == "fp16":
        return (16 if k_bits is None else k_bits), (16 if v_bits is None else v_bits)
    return (2 if k_bits is None else k_bits), (2 if v_bits is None else v_bits)


def _opt(value: Optional[int]) -> int:
    return -1 if value is None else int(value)


def layout(method: str, head_dim: int, k_bits: Optional[int] = None,
           v_bits: Optional[int] = None, *, block_tokens: Optional[int] = None,
           k_group_tokens: Optional[int] = None, v_group_channels: Optional[int] = None) -> dict:
    """The record geometry of a spec: record_bytes, block_tokens, k_group_tokens,
    v_group_channels, side_bytes_per_token (OScaR's fp32 norm), sink_tokens, flush_tokens,
    k_bits, v_bits (the registry defaults the daemon streams with)."""
    kb, vb = _bits(method, k_bits, v_bits)
    values = _ops().layout(method, head_dim, kb, vb, _opt(block_tokens), _opt(k_group_tokens),
                           _opt(v_group_channels))
    keys = ("record_bytes", "block_tokens", "k_group_tokens", "v_group_channels",
            "side_bytes_per_token", "sink_tokens", "flush_tokens", "k_bits", "v_bits")
    return dict(zip(keys, values))


def token_norms(k: torch.Tensor) -> torch.Tensor:
    """OScaR's side record: fp32 [T], the L2 norm of each token's K over all heads of the layer
    (k: [T, H, D], every KV head of the layer)."""
    return _ops().token_norms(k)


def quantize(k: torch.Tensor, v: torch.Tensor, method: str = "kvarn",
             k_bits: Optional[int] = None, v_bits: Optional[int] = None, *,
             block_tokens: Optional[int] = None, k_group_tokens: Optional[int] = None,
             v_group_channels: Optional[int] = None,
             token_norms: Optional[torch.Tensor] = None) -> torch.Tensor:
    """K, V [T, H, D] (float32/16, bfloat16; T a multiple of block_tokens) -> uint8 records
    [H, T / block_tokens, record_bytes], record (h, b) = tokens [b*G, (b+1)*G) of head h, byte for
    byte what kernels/quantize.h (and the daemon) write. Bits default to 2 (16 for fp16). OScaR:
    token_norms [T] defaults to token_norms(k), so k must then hold every KV head of the layer."""
    kb, vb = _bits(method, k_bits, v_bits)
    return _ops().quantize(k, v, method, kb, vb, _opt(block_tokens), _opt(k_group_tokens),
                           _opt(v_group_channels), token_norms)


def dequantize(records: torch.Tensor, method: str, head_dim: int, k_bits: Optional[int] = None,
               v_bits: Optional[int] = None, *, block_tokens: Optional[int] = None,
               k_group_tokens: Optional[int] = None, v_group_channels: Optional[int] = None,
               token_norms: Optional[torch.Tensor] = None
               ) -> Tuple[torch.Tensor, torch.Tensor]:
    """uint8 records [H, N, record_bytes] -> fp32 K, V [N*G, H, D] in the engine's frame (views of
    [H, N*G, D] buffers). OScaR needs the norms [N*G] its records were written with."""
    kb, vb = _bits(method, k_bits, v_bits)
    return _ops().dequantize(records, method, head_dim, kb, vb, _opt(block_tokens),
                             _opt(k_group_tokens), _opt(v_group_channels), token_norms)


def decode_attention(q: torch.Tensor, records: torch.Tensor,
                     window_k: Optional[torch.Tensor] = None,
                     window_v: Optional[torch.Tensor] = None, method: str = "kvarn",
                     k_bits: Optional[int] = None, v_bits: Optional[int] = None, *,
                     scale: Optional[float] = None, block_tokens: Optional[int] = None,
                     k_group_tokens: Optional[int] = None, v_group_channels: Optional[int] = None,
                     token_norms: Optional[torch.Tensor] = None, splits: int = 0
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Fused single-query attention of one layer.

    q: [Hq, D] (any float dtype; after RoPE), Hq = H * g; query rows h*g .. h*g+g-1 share KV head h
    (the GQA order of HF models). records: uint8 [H, N, record_bytes] (N may be 0).
    window_k/window_v: the full-precision rows (sinks + fp16 tail, engine frame) [Tw, H, D] in
    float32/16 or bfloat16, read in place; None for none. scale defaults to 1/sqrt(D).
    Returns out fp32 [Hq, D] = softmax(scale q K^T) V over records and window, and lse fp32 [Hq]
    (natural log of the softmax denominator; -inf with no tokens at all). splits: split-K parts
    per head (0: enough for torch.get_num_threads())."""
    kb, vb = _bits(method, k_bits, v_bits)
    return _ops().decode_attention(q, records, window_k, window_v, method, kb, vb,
                                   0.0 if scale is None else float(scale), _opt(block_tokens),
                                   _opt(k_group_tokens), _opt(v_group_channels), token_norms,
                                   int(splits))


def paged_decode_attention(q: torch.Tensor, pool: torch.Tensor, record_offsets: torch.Tensor,
                           indptr: torch.Tensor, window_k: Optional[torch.Tensor] = None,
                           window_v: Optional[torch.Tensor] = None,
                           window_indptr: Optional[torch.Tensor] = None, method: str = "kvarn",
                           k_bits: Optional[int] = None, v_bits: Optional[int] = None, *,
                           scale: Optional[float] = None, block_tokens: Optional[int] = None,
                           k_group_tokens: Optional[int] = None,
                           v_group_channels: Optional[int] = None,
                           norm_offsets: Optional[torch.Tensor] = None, splits: int = 0
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
    """decode_attention over records that live anywhere in `pool` (uint8 1-D, e.g. the daemon's
    shm pool from kvctl.pool_view.PoolView): head h's records start at the byte offsets
    record_offsets[indptr[h]:indptr[h+1]] (int64), its window rows are
    window_k[window_indptr[h]:window_indptr[h+1]] ([rows, D]). OScaR: norm_offsets gives each
    record's side record (block_tokens fp32). Nothing is copied."""
    kb, vb = _bits(method, k_bits, v_bits)
    return _ops().paged_decode_attention(
        q, pool, record_offsets, indptr, window_k, window_v, window_indptr, method, kb, vb,
        0.0 if scale is None else float(scale), _opt(block_tokens), _opt(k_group_tokens),
        _opt(v_group_channels), norm_offsets, int(splits))
