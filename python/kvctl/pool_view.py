# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Zero-copy torch views of the daemon's shm pool, and fused attention over a blocks FETCH.

The daemon keeps every block record and every full-precision window row (sinks and tail) in one
POSIX shm object (/dev/shm/<pool.shm_name>, named in the HELLO reply). A blocks-mode FETCH
(Client.fetch_blocks) returns a page table only: byte offsets of each (layer, KV head) pair's
records and window row slots in that object. PoolView maps the object read-only and exposes it
as one uint8 tensor, so records feed torch_ops.paged_decode_attention without a copy; window rows
are gathered from it once per reply and layer (one index op; the kernel takes them dense).

    view = PoolView.from_client(client)            # after hello()
    blocks = client.fetch_blocks(seq)
    out, lse = view.layer_attention(blocks, layer=0, q=q)   # q [q_heads, head_dim]

Records are valid until the next APPEND or CLOSE of the sequence (PROTOCOL.md 4.5): attend
between a FETCH and the next APPEND. The mapping is read-only: writing to the tensor crashes.
"""

import mmap
import os
import warnings
from typing import List, Optional, Tuple

import numpy as np
import torch

from . import protocol as p
from . import torch_ops
from .client import BlocksTable

# Window row dtypes (wire code) as torch dtypes.
_ROW_DTYPES = {p.DTYPE_CODES["float32"]: torch.float32, p.DTYPE_CODES["float16"]: torch.float16,
               p.DTYPE_CODES["bfloat16"]: torch.bfloat16}


class PoolView:
    """A view of the pool; `tensor` is uint8 [pool_bytes] over it (no copy): a read-only mapping
    of the shm object of a host pool, or the CUDA IPC mapping of a device pool (from_cuda_handle,
    pool.backend = "cuda"; the attention then runs on that device and q must live there)."""

    def __init__(self, shm_name: str, pool_bytes: Optional[int] = None):
        if not shm_name or "/" in shm_name.lstrip("/"):
            raise ValueError("shm_name: got %r, expected a POSIX shm name like '/kvctl'" % shm_name)
        self.path = "/dev/shm/" + shm_name.lstrip("/")
        fd = os.open(self.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if pool_bytes is not None and pool_bytes > size:
                raise ValueError("pool_bytes: %d, but %s holds %d bytes" % (pool_bytes, self.path,
                                                                           size))
            self._mmap = mmap.mmap(fd, pool_bytes or size, flags=mmap.MAP_SHARED,
                                   prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        with warnings.catch_warnings():
            # frombuffer warns that the buffer is not writable: that is the point.
            warnings.simplefilter("ignore", UserWarning)
            self.tensor = torch.frombuffer(self._mmap, dtype=torch.uint8)

    @classmethod
    def from_cuda_handle(cls, handle: bytes, pool_bytes: int, device: int) -> "PoolView":
        """The device pool whose HELLO reply gave `handle` (cudaIpcMemHandle_t bytes), opened on
        CUDA device `device` with torch.ops.kvctl.open_cuda_pool (needs kvctl_torch with CUDA)."""
        view = cls.__new__(cls)
        view.path, view._mmap = None, None
        raw = torch.frombuffer(bytearray(handle), dtype=torch.uint8)
        view.tensor = torch_ops.open_cuda_pool(raw, pool_bytes, device)
        return view

    @classmethod
    def from_client(cls, client) -> "PoolView":
        """The pool of a client's session (after hello()), host or device."""
        s = client.session
        if s is None:
            raise ValueError("client: no session, call hello() first")
        if s.pool_on_device:
            return cls.from_cuda_handle(s.cuda_ipc_handle, s.pool_bytes, s.cuda_device)
        return cls(s.shm_name, s.pool_bytes)

    @property
    def nbytes(self) -> int:
        return self.tensor.numel()

    def record(self, offset: int, nbytes: int) -> torch.Tensor:
        """uint8 [nbytes] view of the pool at byte `offset`."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError("offset: [%d, %d) is outside the pool of %d bytes"
                             % (offset, offset + nbytes, self.nbytes))
        return self.tensor[offset:offset + nbytes]

    def pair_records(self, blocks: BlocksTable, pair: int) -> List[torch.Tensor]:
        """Views of the records of pair `pair` (layer-major index into the FETCH), oldest first."""
        n_pairs = len(blocks.indptr) - 1
        if not 0 <= pair < n_pairs:
            raise ValueError("pair: got %d, expected 0..%d" % (pair, n_pairs - 1))
        rb = blocks.layouts[int(blocks.layout_index[pair])].record_bytes
        a, b = int(blocks.indptr[pair]), int(blocks.indptr[pair + 1])
        return [self.record(int(o), rb) for o in blocks.record_offsets[a:b]]

    def side_offsets(self, blocks: BlocksTable) -> Optional[np.ndarray]:
        """Byte offsets (int64) of every record's side record (OScaR norms), or None."""
        side = blocks.side_indices
        if side is None:
            return None
        per_page = blocks.side_records_per_page
        out = np.full(len(side), -1, dtype=np.int64)
        for i, y in enumerate(side.tolist()):
            if y == 0xFFFFFFFF:
                continue
            lay = blocks.layouts[_layout_of_record(blocks, i)]
            out[i] = ((y // per_page) * blocks.page_bytes
                      + (y % per_page) * blocks.block_tokens * lay.side_bytes_per_token)
        return out

    def window_rows(self, blocks: BlocksTable, pair: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """(k, v) [rows, head_dim] of pair `pair`'s window (sinks, then tail; positions in
        blocks.window_positions), in the layout's row_dtype, read from the pool: exactly the
        rows a dense FETCH gives for those tokens (the daemon stores them so)."""
        n_pairs = len(blocks.window_indptr) - 1
        if not 0 <= pair < n_pairs:
            raise ValueError("pair: got %d, expected 0..%d" % (pair, n_pairs - 1))
        return self._gather_rows(blocks, [pair])

    def _gather_rows(self, blocks: BlocksTable, pairs: List[int]
                     ) -> Tuple[torch.Tensor, torch.Tensor]:
        """K and V rows of these pairs' windows, concatenated in pair order (one layout)."""
        lay = blocks.layouts[int(blocks.layout_index[pairs[0]])]
        dtype = _ROW_DTYPES[lay.row_dtype]
        row_bytes = blocks.head_dim * dtype.itemsize
        wi = blocks.window_indptr.astype(np.int64)
        offsets = np.concatenate([blocks.window_offsets[wi[q]:wi[q + 1]] for q in pairs]
                                 ).astype(np.int64)
        if offsets.size and int(offsets.max()) + 2 * row_bytes > self.nbytes:
            raise ValueError("window_offsets: a row slot ends past the pool of %d bytes"
                             % self.nbytes)
        dev = self.tensor.device
        if (offsets % row_bytes == 0).all():
            # Slots start on row boundaries (page_bytes a multiple of the row size, as with the
            # default 64 KiB pages and power-of-two rows): view the pool as rows and select them.
            usable = self.nbytes - self.nbytes % row_bytes
            rows = self.tensor[:usable].view(-1, row_bytes)
            index = torch.from_numpy(offsets // row_bytes).to(dev)
            k, v = rows.index_select(0, index), rows.index_select(0, index + 1)
        else:
            index = (torch.from_numpy(offsets).to(dev)[:, None]
                     + torch.arange(2 * row_bytes, dtype=torch.int64, device=dev))
            slots = self.tensor[index]  # [rows, 2 * row_bytes] uint8: K row, then V row.
            k, v = slots[:, :row_bytes], slots[:, row_bytes:]
        return k.view(dtype), v.view(dtype)

    def layer_attention(self, blocks: BlocksTable, layer: int, q: torch.Tensor,
                        scale: Optional[float] = None, extra_k: Optional[torch.Tensor] = None,
                        extra_v: Optional[torch.Tensor] = None
                        ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Fused decode attention of one layer of a blocks FETCH: q [q_heads, D] (q_heads a
        multiple of kv_heads; rows h*g..h*g+g-1 use KV head h) over every head's records and
        window rows (both read in this view), plus, when given, more rows per head (extra_k /
        extra_v [kv_heads, D] or [kv_heads, n, D], e.g. rows appended since the FETCH and the
        step's own token, attended in fp32). Returns (out fp32 [q_heads, D], lse fp32
        [q_heads]). Heads with different layouts (per-head bit widths) are attended
        separately."""
        first = blocks.layer_begin
        if not first <= layer < first + blocks.n_layers:
            raise ValueError("layer: got %d, the FETCH holds layers %d..%d"
                             % (layer, first, first + blocks.n_layers - 1))
        heads = blocks.kv_heads
        if q.dim() != 2 or q.shape[0] % heads != 0:
            raise ValueError("q: expected [q_heads, head_dim] with q_heads a multiple of %d, got "
                             "shape %s" % (heads, tuple(q.shape)))
        g = q.shape[0] // heads
        pair0 = (layer - first) * heads
        li = [int(blocks.layout_index[pair0 + h]) for h in range(heads)]
        extra = None
        if extra_k is not None or extra_v is not None:
            ok = (extra_k is not None and extra_v is not None and extra_v.shape == extra_k.shape
                  and extra_k.dim() in (2, 3) and extra_k.shape[0] == heads
                  and extra_k.shape[-1] == q.shape[1])
            if not ok:
                raise ValueError("extra_k/extra_v: expected both, [%d, %d] or [%d, n, %d] each"
                                 % (heads, q.shape[1], heads, q.shape[1]))
            if extra_k.dim() == 2:
                extra_k, extra_v = extra_k[:, None], extra_v[:, None]
            extra = (extra_k.float(), extra_v.float())
        if all(x == li[0] for x in li):
            return self._attend(blocks, layer - first, list(range(heads)), q, scale, extra)
        outs, lses = [], []
        for h in range(heads):
            o, l = self._attend(blocks, layer - first, [h], q[h * g:(h + 1) * g], scale, extra)
            outs.append(o)
            lses.append(l)
        return torch.cat(outs), torch.cat(lses)

    def _record_index(self, blocks, local_layer, heads):
        """(offsets, indptr, norm offsets or None) of these heads' records, as int64 tensors on
        the pool's device. A FETCH reply's records never change (a new FETCH is a new table), so
        they are computed once per reply and layer and kept in the table's cache (decode steps
        that reuse a reply only add window rows)."""
        cache = blocks.cache.setdefault("record_index", {})
        key = (local_layer, tuple(heads))
        if key in cache:
            return cache[key]
        pairs = [local_layer * blocks.kv_heads + h for h in heads]
        lay = blocks.layouts[int(blocks.layout_index[pairs[0]])]
        indptr = blocks.indptr.astype(np.int64)
        offsets = np.concatenate([blocks.record_offsets[indptr[p]:indptr[p + 1]]
                                  for p in pairs]).astype(np.int64)
        counts = [int(indptr[p + 1] - indptr[p]) for p in pairs]
        local_indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        dev = self.tensor.device
        norm_offsets = None
        if lay.side_bytes_per_token > 0:
            side = self.side_offsets(blocks)
            norm_offsets = torch.from_numpy(np.concatenate(
                [side[indptr[p]:indptr[p + 1]] for p in pairs]).astype(np.int64)).to(dev)
        cache[key] = (torch.from_numpy(offsets).to(dev), torch.from_numpy(local_indptr).to(dev),
                      norm_offsets)
        return cache[key]

    def _window(self, blocks, local_layer, heads):
        """These heads' window rows (K, V), gathered from the pool once per reply and layer: a
        reply's row slots do not change until the next APPEND or CLOSE, and an APPEND that only
        adds rows writes new slots (KvctlCache passes those rows as extra rows instead)."""
        cache = blocks.cache.setdefault("window", {})
        key = (local_layer, tuple(heads))
        if key not in cache:
            cache[key] = self._gather_rows(blocks,
                                           [local_layer * blocks.kv_heads + h for h in heads])
        return cache[key]

    def _attend(self, blocks, local_layer, heads, q, scale, extra=None):
        pairs = [local_layer * blocks.kv_heads + h for h in heads]
        lay = blocks.layouts[int(blocks.layout_index[pairs[0]])]
        offsets, local_indptr, norm_offsets = self._record_index(blocks, local_layer, heads)
        window_k, window_v = self._window(blocks, local_layer, heads)
        counts = [int(blocks.window_counts[p]) for p in pairs]
        # A device pool attends on its device: every index and window tensor goes there too.
        dev = self.tensor.device
        if extra is not None:
            # Each head's window gets its extra rows after its own rows, in fp32.
            ks, vs, at = [], [], 0
            n = extra[0].shape[1]
            for i, h in enumerate(heads):
                ks += [window_k[at:at + counts[i]].float(), extra[0][h]]
                vs += [window_v[at:at + counts[i]].float(), extra[1][h]]
                at += counts[i]
            window_k, window_v = torch.cat(ks), torch.cat(vs)
            counts = [c + n for c in counts]
        window_indptr = torch.tensor([0] + np.cumsum(counts).tolist(), dtype=torch.int64)
        return torch_ops.paged_decode_attention(
            q, self.tensor, offsets, local_indptr, window_k, window_v, window_indptr.to(dev),
            lay.method_name, lay.k_bits, lay.v_bits, scale=scale,
            block_tokens=blocks.block_tokens, k_group_tokens=lay.k_group_tokens,
            v_group_channels=lay.v_group_channels, norm_offsets=norm_offsets)

    def close(self) -> None:
        """Drops this view's tensor and unmaps when no other view of it is alive (otherwise the
        mapping goes with the last view)."""
        self.tensor = None
        if self._mmap is None:
            return  # A device pool: the IPC mapping closes when its last tensor goes.
        try:
            self._mmap.close()
        except BufferError:
            pass

    def __enter__(self) -> "PoolView":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _layout_of_record(blocks: BlocksTable, record: int) -> int:
    pair = int(np.searchsorted(blocks.indptr, record, side="right")) - 1
    return int(blocks.layout_index[pair])
