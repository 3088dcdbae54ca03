# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""KvctlCache: a transformers (5.x) Cache whose layers live in the kvctl daemon. Imported as
kvctl.hf.KvctlCache (kvctl/hf.py, which also runs the demo: kvctl/hf_cli.py).

Each forward step's new K/V (post-RoPE, and Q when asked) of every layer are APPENDed to a
daemon sequence in one request; attention reads what the daemon holds (dense FETCH,
dequantized) plus the step's own fresh K/V, so the model attends to the quantized (and, with an
evicting daemon, evicted) history as a serving engine would. `model.generate(...)` and a plain
forward loop work unchanged. Batch element b is its own daemon sequence (its own client, so
its own daemon or [[model]] settings): kveval runs several quantizers in one batched forward.

One step (layer l's update() runs right before layer l's attention):
- layer 0: the previous step's pending K/V/Q are APPENDed (Q of the last layer is only known
  after its attention, hence the deferral to the next step or sync()); rows that may have
  changed beyond the ones appended are FETCHed (dense, all layers, one request per sequence).
- every layer: the held rows sit in a buffer [batch, kv_heads, capacity, head_dim] indexed by
  token position; the step's K/V are written after them and a view is returned (no copy of
  the history per step): every row, or for a sliding-window layer (layer_types, as
  DynamicCache(config=...) builds them) the rows DynamicSlidingWindowLayer would return; the
  daemon still holds every row of every layer. Positions a head does not hold (eviction) are
  masked by the registered attention function "kvctl"; with nothing masked it is transformers'
  own SDPA path with the masks SDPA would get (its mask function is registered for "kvctl"
  too), so compression off reproduces DynamicCache (checked on Llama, Qwen2 and Gemma3 shapes:
  python/tests/test_hf_archs.py).
- Not refetching: a token's stored rows change only when a flush quantizes the tail (the APPEND
  reply's tokens_quantized moves) or eviction drops it. Otherwise an APPEND only adds the new
  rows, stored exactly (lossless) or rounded to fp16 (sink/tail rows of quantizing layers). The
  rule is learned on the first fetch by comparing the newest stored row with what was sent;
  until then, after flushes, and for evicting sequences (budget_mode in STATS, or fewer rows
  than appended) every step refetches. refetch="always" refetches every step (the reference).
- attention="fused" (and "auto" from fused_min_tokens on, batch 1, when the extension is
  built, the daemon quantizes and no layer slides): a decode step (one query token) does not touch the dense
  mirror. Layer 0
  APPENDs the previous step as above, then one blocks FETCH per sequence (all layers) returns
  page tables into the daemon's shm pool over its records and its sink/tail rows (no row travels
  in the reply); the daemon then holds exactly the tokens before this step, and both stay valid
  until the next step's APPEND. When an APPEND only added rows (no flush, eviction or width
  lowering; rows known to be stored as fp16) the cached reply is kept (the added rows went to new
  slots) and the rows sent are attended as extra window rows. Each layer's attention runs
  torch.ops.kvctl.paged_decode_attention on those records in place and on the window rows
  gathered from the pool once per reply (kvctl.pool_view.PoolView; GQA, per-head layouts,
  ragged evicted heads), the step's own K/V passed as one more fp32 window row per head.
  Multi-token steps (prefill) refetch the mirror and stay dense. Lossless daemons are refused (no
  block records). With eviction a fused step asks no STATS: which layers evicted (the per-layer
  eviction counters against their last read) is asked once, before the next dense step, whose
  refetch then covers every layer that changed in between.

A lost session (the daemon restarted, e.g. after kill -9, or the lease expired) is noticed at
the next request: the cache starts a new session and an empty daemon sequence on each client,
forgets every row it held, and raises kvctl.SessionLostError saying how many tokens were lost, so
the current generate()/forward fails cleanly instead of attending to missing or wrong rows. The
generation must be restarted from its prompt; the next use of the cache works (it is empty). If
the daemon is still down the cache retries at its next use. close() (and leaving a `with` block)
ends the sessions with BYE, so the daemon frees them at once.

Thread safety: one cache per batch of sequences, used by one thread (like any transformers
Cache). Beam search, crop and reset are not supported.

    from kvctl.hf import KvctlCache
    cache = KvctlCache(model, "ipc:///tmp/kvctl.sock")     # HELLO + OPEN; attention "kvctl"
    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=64, do_sample=False)
    cache.sync(); print(cache.stats_text(section="sequences")); cache.close()
"""

from __future__ import annotations

import threading
import time
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from .client import BlocksTable, Client
from .hf_options import (ATTN_IMPLEMENTATION, check_options, fused_available, per_element,
                         read_geometry, take_attention)
from .hf_prefix import PrefixReuse
from .hf_sequence import CacheSequence, next_sequence_id
from .protocol import KvctlError, SessionLostError

# A replaced session is ended with BYE waiting at most this long (its daemon may be gone).
_BYE_TIMEOUT_MS = 2000

# One APPEND carries at most this many payload bytes (the daemon's default max message is
# 256 MiB); longer prefills are split. Every chunk of a split but the last is flagged
# APPEND_CONTINUES, so the daemon evicts once over the whole prefill, exactly as for one APPEND
# (ipc/PROTOCOL.md 4.4): the message size does not change what is kept. With a staging slot the
# chunks are sized to fit it instead: an 8K SmolLM2 prefill with queries (943 MB of float32)
# went through the socket in 2.0-2.5 s and through an 8 MiB slot in 114 chunks in 0.7 s
# (docs/kvbench_ipc.md "Prefill pieces through the staging slot").
_MAX_APPEND_BYTES = 64 << 20
# STATS budget modes under which the daemon keeps every token (anything else may evict).
_KEEPING_MODES = ("", "none", "quant-only", "quant_only")


class _Stash(threading.local):
    """The cache whose update() ran last in this thread, for the attention call after it."""

    cache: Optional["KvctlCache"] = None


_STASH = _Stash()


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
               is_causal=None, **kwargs):
    """Attention over a KvctlCache layer: masks positions the daemon does not hold and records
    Q when the cache sends it; otherwise exactly transformers' SDPA path."""
    cache = _STASH.cache
    layer = None
    if cache is not None:
        idx = getattr(module, "layer_idx", None)
        if idx is not None and idx < len(cache.layers):
            candidate = cache.layers[idx]
            if candidate.returned_keys is key:
                layer = candidate
    if layer is not None and cache.send_q:
        layer.pending_q = query.detach()
    if layer is not None and cache.fused_step:
        return cache._fused_attention(layer, query, key, value, attention_mask, scaling)
    if layer is None or layer.hold_bias is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    # Held positions (from layer.offset on: a sliding layer's window) then the step's n tokens,
    # under the model's mask (causal, window, padding), else causal. The g query heads of a KV
    # head are folded into the query axis ([B, H, g*n, D]), so K and V are read in place
    # instead of repeated g times.
    batch, kv_heads, n = key.shape[0], key.shape[1], query.shape[2]
    held = key.shape[2] - n
    groups = query.shape[1] // kv_heads
    q = query.reshape(batch, kv_heads, groups * n, query.shape[3])
    if attention_mask is None:
        mask = torch.cat([torch.zeros(n, held, dtype=query.dtype),
                          torch.full((n, n), float("-inf"), dtype=query.dtype).triu(1)], dim=-1)
    elif attention_mask.dtype == torch.bool:
        mask = torch.zeros(attention_mask.shape, dtype=query.dtype).masked_fill_(
            ~attention_mask, float("-inf"))
    else:
        mask = attention_mask.to(query.dtype)
    # Query rows are (group, token): the mask of the n tokens repeats for every group.
    mask = mask.reshape(-1, 1, n, held + n).repeat(1, 1, groups, 1)
    hold = layer.hold_bias[:, :, :, layer.offset:layer.offset + held].to(query.dtype)
    bias = torch.cat([hold, torch.zeros(batch, kv_heads, 1, n, dtype=query.dtype)], dim=-1) + mask
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=bias,
                                                           dropout_p=0.0, scale=scaling)
    out = out.reshape(batch, kv_heads * groups, n, query.shape[3])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTN_IMPLEMENTATION, _attention)
# The model builds the masks SDPA would get (causal with a past, sliding windows, padding); an
# attention implementation without a mask function gets none.
ALL_MASK_ATTENTION_FUNCTIONS.register(ATTN_IMPLEMENTATION, sdpa_mask)


class KvctlLayer(CacheLayerMixin):
    """One decoder layer: rows by position in [batch, kv_heads, capacity, head_dim] buffers;
    hold_bias [batch, kv_heads, 1, capacity] (0 = held, -inf = not held) or None when every
    position is held. A sliding layer (sliding_window = W) attends like transformers'
    DynamicSlidingWindowLayer: update() returns the last W - 1 held rows and the step's; the
    daemon and the buffers still hold every row."""

    is_compileable = False

    def __init__(self, cache: "KvctlCache", index: int, sliding_window: Optional[int] = None):
        super().__init__()
        self.cache = cache
        self.index = index
        self.sliding_window = sliding_window
        self.is_sliding = sliding_window is not None
        self.offset = 0  # Position of the first row update() returned last.
        self.seen = 0   # Tokens given to update() so far.
        self.held = 0   # Positions [0, held) are in the daemon (or masked).
        self.buf_k: Optional[torch.Tensor] = None
        self.buf_v: Optional[torch.Tensor] = None
        self.hold_bias: Optional[torch.Tensor] = None
        self.pending_k: Optional[torch.Tensor] = None
        self.pending_v: Optional[torch.Tensor] = None
        self.pending_q: Optional[torch.Tensor] = None
        self.returned_keys: Optional[torch.Tensor] = None

    def lazy_initialization(self, key_states, value_states) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def _reserve(self, rows: int) -> None:
        cap = 0 if self.buf_k is None else self.buf_k.shape[2]
        if rows <= cap:
            return
        c = self.cache
        # A quarter more than asked: sized exactly, a prefill's buffers were reallocated and
        # copied by the first decode step (0.27 s of it at 8K on SmolLM2). Zeros, not garbage: a
        # restored prefix's positions the daemon no longer holds are masked but never written,
        # and a masked NaN would still reach SDPA's output (0 x NaN).
        new_cap = max(rows + rows // 4, 2 * cap, 256)
        k = torch.zeros(c.batch, c.kv_heads, new_cap, c.head_dim)
        v = torch.zeros_like(k)
        if self.held:
            k[:, :, :self.held] = self.buf_k[:, :, :self.held]
            v[:, :, :self.held] = self.buf_v[:, :, :self.held]
        self.buf_k, self.buf_v = k, v
        if self.hold_bias is not None:
            bias = torch.zeros(c.batch, c.kv_heads, 1, new_cap)
            bias[..., :cap] = self.hold_bias
            self.hold_bias = bias

    def update(self, key_states, value_states, cache_kwargs=None):
        c = self.cache
        if key_states.shape[1] != c.kv_heads or key_states.shape[3] != c.head_dim:
            raise ValueError("KvctlCache: layer %d gave K/V with %d heads of head_dim %d, expected "
                             "%d and %d (the config's; the daemon sequence has one geometry for "
                             "every layer)" % (self.index, key_states.shape[1],
                                               key_states.shape[3], c.kv_heads, c.head_dim))
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.cache._before_update(self.index, key_states)
        n = key_states.shape[2]
        self._reserve(self.held + n)
        self.buf_k[:, :, self.held:self.held + n] = key_states
        self.buf_v[:, :, self.held:self.held + n] = value_states
        self.pending_k, self.pending_v = key_states.detach(), value_states.detach()
        self.seen += n
        self.offset = max(0, self.held - self.sliding_window + 1) if self.is_sliding else 0
        keys = self.buf_k[:, :, self.offset:self.held + n]
        values = self.buf_v[:, :, self.offset:self.held + n]
        if self.dtype != torch.float32:
            keys, values = keys.to(self.dtype), values.to(self.dtype)
        self.returned_keys = keys
        _STASH.cache = self.cache
        return keys, values

    def load(self, b: int, k_rows, v_rows, positions) -> None:
        """Puts batch element b's rows of one FETCH reply (per head) at their positions."""
        held = self.held
        for h, (kr, vr, pos) in enumerate(zip(k_rows, v_rows, positions)):
            idx = torch.from_numpy(pos.astype(np.int64))
            if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= held):
                raise KvctlError("FETCH: layer %d head %d holds positions outside [0, %d)"
                                 % (self.index, h, held))
            if len(pos) == held:
                self.buf_k[b, h, :held] = torch.from_numpy(kr)
                self.buf_v[b, h, :held] = torch.from_numpy(vr)
                if self.hold_bias is not None:
                    self.hold_bias[b, h, 0, :held] = 0
                continue
            self.buf_k[b, h].index_copy_(0, idx, torch.from_numpy(kr))
            self.buf_v[b, h].index_copy_(0, idx, torch.from_numpy(vr))
            if self.hold_bias is None:
                self.hold_bias = torch.zeros(self.cache.batch, self.cache.kv_heads, 1,
                                             self.buf_k.shape[2])
            self.hold_bias[b, h, 0, :held] = float("-inf")
            self.hold_bias[b, h, 0].index_fill_(0, idx, 0.0)

    def commit(self, b: int, n: int, rounding: str) -> None:
        """Batch element b's last n rows are stored as sent (rounded to fp16 for "fp16")."""
        if rounding == "fp16":
            rows = slice(self.held - n, self.held)
            self.buf_k[b, :, rows] = self.buf_k[b, :, rows].half().float()
            self.buf_v[b, :, rows] = self.buf_v[b, :, rows].half().float()

    def forget(self) -> None:
        """Drops every row (the daemon lost them): the layer is empty again."""
        self.seen = self.held = self.offset = 0
        self.buf_k = self.buf_v = self.hold_bias = None
        self.pending_k = self.pending_v = self.pending_q = None
        self.returned_keys = None

    def get_mask_sizes(self, cache_position) -> Tuple[int, int]:
        """(kv_length, kv_offset) of the rows the next update() returns."""
        if not self.is_sliding:
            return self.seen + cache_position.shape[0], 0
        offset = max(0, self.seen - self.sliding_window + 1)
        return self.seen - offset + cache_position.shape[0], offset

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_cache_shape(self) -> int:
        return self.sliding_window if self.is_sliding else -1

    def reset(self) -> None:
        raise NotImplementedError("KvctlCache cannot be reset; open a new KvctlCache")

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("KvctlCache: beam search is not supported")

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("KvctlCache cannot drop tokens from the daemon sequence")


class KvctlCache(PrefixReuse, Cache):
    """A transformers Cache backed by kvctl daemon sequences, one per batch element.

    model: the causal LM; its config gives the geometry and its attention implementation is
      set to "kvctl" (SDPA plus masks of positions the daemon does not hold). model=None with
      config=... leaves attention alone; then eviction and send_q are refused.
    client: an endpoint string (a Client is made and owned) or a kvctl.Client; a list of them
      for batch > 1 (element b uses client[b]: each needs its own Client, one session each).
    model_name: sent in HELLO (selects a daemon [[model]] table); one or one per element.
    send_q: also APPEND the post-RoPE queries (for eviction scorers); one bool or one per
      element.
    dtype: session dtype; "float32" keeps compression-off runs exact.
    refetch: "auto" (fetch only when rows may have changed, see the module doc) or "always".
    attention: "auto" (default), "dense" (attend over the fetched dense mirror) or "fused":
      decode steps (one query token) attend with the kvctl torch extension directly on the
      daemon's records and sink/tail rows (blocks FETCH, PoolView of the pool)
      and the step's own K/V; prefill and multi-token steps stay dense. "fused" needs the model
      and the extension (RuntimeError saying how to build it otherwise), a daemon that
      quantizes and a model without sliding-window layers. "auto" decodes fused when all of those hold, the batch is one sequence (a
      padded batch needs masks fused decode does not take) and at least fused_min_tokens
      tokens are held, else dense.
    fused_min_tokens: "auto" only: the context length from which decode steps go fused. The
      default 2048 is where fused stopped losing to dense on SmolLM2 on one CPU thread (measured
      in docs/attention.md "In the HF adapter").
    keepalive: PING every lease/3 from a background thread while the cache is open.
    prefix_reuse: batch 1 only; open_prefix(input_ids) before generate restores the prompt's
      stored prefix from the daemon's cluster tier, and the prompt is saved there once
      prefilled (kvctl/hf_prefix.py).
    Raises KvctlError / ServerError / Timeout from the daemon (e.g. Timeout when it is down).
    """

    def __init__(self, model=None, client: Union[str, Client, Sequence] = "ipc:///tmp/kvctl.sock",
                 *, config=None, model_name: Union[str, Sequence[str]] =
                 "HuggingFaceTB/SmolLM2-135M-Instruct",
                 send_q: Union[bool, Sequence[bool]] = False,
                 dtype: str = "float32", refetch: str = "auto", client_name: str = "kvctl.hf",
                 timeout_ms: int = 30000, use_staging: bool = True, keepalive: bool = True,
                 attention: str = "auto", fused_min_tokens: int = 2048,
                 prefix_reuse: bool = False):
        check_options(refetch, attention, fused_min_tokens)
        config = take_attention(model, config)
        self._read_geometry(config)
        # Whether decode steps may attend fused at all; "auto" also needs batch 1 and length.
        self.fused_ok = fused_available(attention, model, self.windows)
        self.attention = attention
        self.fused_min_tokens = fused_min_tokens
        self.fused_step = False  # This forward step attends fused (decode, attention="fused").
        clients, names, send_qs = per_element(client, model_name, send_q, model)
        self._init_prefix(prefix_reuse, len(clients), model)
        self.attn_ours = model is not None
        self.batch = len(clients)
        self.send_q = any(send_qs)
        self.refetch = refetch
        self.use_staging = use_staging
        self.dtype = dtype
        self.client_name = client_name
        self.seqs: List[CacheSequence] = []
        self._connect(clients, names, send_qs, timeout_ms)
        super().__init__(layers=[KvctlLayer(self, i, w) for i, w in enumerate(self.windows)])
        self.appended = 0  # Tokens appended to every sequence.
        self.sessions_lost = 0  # Times a lost session was replaced (SessionLostError raised).
        self._start_keepalive(keepalive)
        self.counters = {"appends": 0, "appends_continued": 0, "appends_staged": 0, "fetches": 0,
                         "fetched_layers": 0, "append_s": 0.0,
                         "fetch_s": 0.0,
                         "block_fetches": 0, "block_fetch_s": 0.0, "block_reuses": 0,
                         "fused_steps": 0, "flushes": 0, "prefix_restored_tokens": 0,
                         "prefix_saved_tokens": 0, "prefix_open_s": 0.0, "prefix_save_s": 0.0}

    def _read_geometry(self, config) -> None:
        g = read_geometry(config)
        self.n_layers, self.kv_heads, self.q_heads = g.n_layers, g.kv_heads, g.q_heads
        self.head_dim, self.windows = g.head_dim, g.windows

    def _connect(self, clients: list, names: List[str], send_qs: List[bool],
                 timeout_ms: int) -> None:
        """One CacheSequence per batch element, each attached (a session and an empty daemon
        sequence); on any failure the ones made so far are disconnected."""
        try:
            for c, name, want_q in zip(clients, names, send_qs):
                own = isinstance(c, str)
                cl = Client(c, timeout_ms=timeout_ms) if own else c
                seq = CacheSequence(cl, own)
                seq.send_q = want_q
                seq.model_name = name
                seq.where = c if own else "this client"
                self.seqs.append(seq)
                self._attach(seq)
        except BaseException:
            self._disconnect()
            raise

    def _start_keepalive(self, keepalive: bool) -> None:
        """A long prefill or a slow step can outlast the daemon's lease (10 s by default); a
        background PING every lease/3 renews it (Client calls are serialised by its lock)."""
        self._stop = threading.Event()
        self._keepalive = None
        leases = [s.session.lease_ms for s in self.seqs if s.session.lease_ms]
        if keepalive and leases:
            self._keepalive = threading.Thread(target=self._ping_loop,
                                               args=(min(leases) / 3000.0,), daemon=True)
            self._keepalive.start()

    def _attach(self, seq: CacheSequence) -> None:
        """A new session and an empty daemon sequence for batch element `seq`, and what the
        daemon's policy means for it (read again: a restarted daemon may have a new config)."""
        seq.attached = False
        cl = seq.client
        if seq.session is not None and cl.session is seq.session:
            try:
                cl.bye(timeout_ms=_BYE_TIMEOUT_MS)  # Free the old one now, if it still exists.
            except KvctlError:
                pass  # Lost with its daemon, or the daemon is slow: its lease frees it.
        seq.session = cl.hello(layers=self.n_layers, kv_heads=self.kv_heads,
                               head_dim=self.head_dim, dtype=self.dtype,
                               q_heads=self.q_heads if seq.send_q else 0,
                               client_name=self.client_name, model_name=seq.model_name)
        seq.sequence_id = next_sequence_id()
        cl.open(seq.sequence_id)
        policy = cl.stats("policy").get("policy", {})
        mode = str(policy.get("budget_mode", "none")).lower()
        seq.always = self.refetch == "always"
        seq.evicting = mode not in _KEEPING_MODES
        seq.pressure = str(policy.get("budget_pressure", "fail")).lower() != "fail"
        lossless = str(policy.get("quant_lossless", "0")) == "1"
        if self.attention == "auto" and lossless:
            self.fused_ok = False  # No block records to read: decode stays dense.
        if self.attention == "fused" and lossless:
            # Blocks FETCH has no record layout for full-precision rows (the daemon answers
            # INTERNAL), so there is nothing for the fused kernel to read.
            raise KvctlError("attention=\"fused\": the daemon at %s is lossless "
                             "(quant.lossless = true) and serves no block records; use "
                             "attention=\"dense\"" % seq.where)
        seq.attached = True

    def _forget(self) -> int:
        """Empties the cache (every layer's rows, every sequence's state) and detaches the
        sequences; returns how many tokens it held."""
        tokens = max([l.seen for l in self.layers] + [self.appended])
        for layer in self.layers:
            layer.forget()
        self.appended = 0
        self.fused_step = False
        self._forget_prefix()
        for seq in self.seqs:
            seq.forget()
            seq.attached = False
        return tokens

    def _session_lost(self, lost: SessionLostError) -> SessionLostError:
        """After a request found its session gone: empties the cache and starts new sessions,
        so the next use works; returns the error to raise. A daemon still down leaves the
        sequences detached, to attach at the next use."""
        tokens = self._forget()
        self.sessions_lost += 1
        retry = ""
        try:
            self._attach_detached()
        except KvctlError as e:
            retry = (" Starting a new session failed too (%s); the cache tries again at its next "
                     "use." % e)
        advice = ("The KvctlCache is empty again: restart the generation from its prompt (the "
                  "next generate() or forward with this cache starts a new sequence)." + retry)
        return SessionLostError(lost.code_value, lost.message, lost.request, lost.session_id,
                                tokens, len(self.seqs), advice)

    def _step_failed(self, e: KvctlError) -> KvctlError:
        """Any other failed request of a step (a timeout: the daemon is down or stuck): what the
        daemon holds is unknown (the APPEND may or may not have happened), so the cache empties
        itself and starts new sessions at its next use; returns `e` saying so."""
        tokens = self._forget()
        e.args = ("%s; KvctlCache: %d cached tokens dropped, restart the generation from its "
                  "prompt (the next use starts a new session)" % (e, tokens),)
        return e

    def _attach_detached(self) -> None:
        for seq in self.seqs:
            if not seq.attached:
                self._attach(seq)

    @property
    def client(self) -> Client:
        """Batch element 0's client."""
        return self.seqs[0].client

    @property
    def sequence_id(self) -> int:
        return self.seqs[0].sequence_id

    # ---- the step protocol ----------------------------------------------------------------

    def _before_update(self, layer_idx: int, key_states) -> None:
        if key_states.shape[0] != self.batch:
            raise ValueError("KvctlCache: batch size %d, expected %d (one daemon sequence per "
                             "element)" % (key_states.shape[0], self.batch))
        if layer_idx == 0:
            try:
                self._start_step(key_states)
            except SessionLostError as e:
                raise self._session_lost(e) from None
            except KvctlError as e:
                raise self._step_failed(e) from None

    def _start_step(self, key_states) -> None:
        """Layer 0 of a forward step: sends the previous step, fetches what changed."""
        self._attach_detached()
        self._sync()
        # Fused decode: the daemon now holds exactly the tokens before this step (the
        # previous step was APPENDed just above, this one is APPENDed at the next step), so
        # its records, valid until that APPEND, are what this step's query may attend to.
        # The dense mirror is left stale (dirty) and refetched when a dense step comes.
        self.fused_step = (self.fused_ok and key_states.shape[2] == 1 and self.appended > 0
                           and (self.attention == "fused"
                                or (self.batch == 1
                                    and self.appended >= self.fused_min_tokens)))
        if self.fused_step:
            self._fetch_blocks()
            return
        for seq in self.seqs:
            if seq.evictions_unchecked:
                # The counters moved for every layer that evicted since they were last read.
                seq.evictions_unchecked = False
                changed = self._changed_layers(seq)
                if changed is None or changed:
                    seq.mark_dirty(changed)
        dirty = [b for b, s in enumerate(self.seqs) if s.dirty]
        if dirty:
            self._fetch(dirty)

    def sync(self) -> None:
        """APPENDs the pending step (K/V of every layer, Q if sent) to every sequence. Runs
        by itself at the next step; call it before reading STATS after the last forward.
        Raises SessionLostError (the cache is then empty) when the daemon lost the session."""
        try:
            self._attach_detached()
            self._sync()
        except SessionLostError as e:
            raise self._session_lost(e) from None
        except KvctlError as e:
            raise self._step_failed(e) from None

    def _sync(self) -> None:
        layers = self.layers
        if layers[0].pending_k is None:
            return
        if any(l.pending_k is None for l in layers):
            raise KvctlError("KvctlCache: a forward step did not reach every layer")
        if self.send_q and any(l.pending_q is None for l in layers):
            raise KvctlError("KvctlCache: send_q needs the \"kvctl\" attention implementation")
        n = layers[0].pending_k.shape[2]
        t0 = time.perf_counter()
        # [layers, batch, n, heads, D] in one contiguous float32 array each.
        k = torch.stack([l.pending_k.transpose(1, 2) for l in layers]).float().numpy()
        v = torch.stack([l.pending_v.transpose(1, 2) for l in layers]).float().numpy()
        # Q is sent and never kept: each piece is stacked from the layers' [batch, n, heads, D]
        # views when it is sent (an 8K SmolLM2 prefill's Q is 566 MB; stacking it whole took
        # 0.35 s of the first step, and each piece was copied again to be contiguous).
        q_layers = [l.pending_q.transpose(1, 2) for l in layers] if self.send_q else None
        q_token_bytes = (len(layers) * q_layers[0].shape[2] * q_layers[0].shape[3] * 4
                         if self.send_q else 0)
        if k.shape[1] not in (self.batch, 1):
            raise KvctlError("KvctlCache: a step of batch %d for a cache of batch %d (expected "
                             "%d, or 1 for a step shared by every sequence)"
                             % (k.shape[1], self.batch, self.batch))
        for l in layers:
            l.pending_k = l.pending_v = l.pending_q = None
            l.held += n
        for b, seq in enumerate(self.seqs):
            # Pending rows of batch 1 with a larger batch: one step shared by every sequence
            # (a prefill the caller ran once for all of them, as kveval does); sent to each.
            src = b if k.shape[1] == self.batch else 0
            per_token = 2 * k[:, src, :1].nbytes + (q_token_bytes if seq.send_q else 0)
            step = max(1, _MAX_APPEND_BYTES // per_token)
            slot_tokens = seq.session.staging_tokens(per_token) if self.use_staging else 0
            if slot_tokens > 0:
                step = min(step, slot_tokens)
            for a, e in self._append_chunks(n, step):
                staging = e - a <= slot_tokens
                # The chunk that ends at the prefix save point is not flagged: SAVE_PREFIX
                # needs a sequence whose prefill has ended.
                continues = e < n and self.appended + e != self._save_at
                q = (torch.stack([x[src, a:e] for x in q_layers]).float().numpy()
                     if seq.send_q else None)
                seq.last_append = seq.client.append(
                    seq.sequence_id, k[:, src, a:e], v[:, src, a:e], q=q,
                    first_position=self.appended + a, use_staging=staging,
                    continues=continues)
                self.counters["appends_continued"] += int(continues)
                self.counters["appends_staged"] += int(staging)
                self.counters["appends"] += 1
                self._after_append(self.appended + e)
            seq.sent_last_row = k[0, src, -1, 0].copy()
            flushed = seq.last_append.tokens_quantized != seq.tokens_quantized
            self._advance_blocks(seq, k[:, src], v[:, src], flushed)
            seq.tokens_quantized = seq.last_append.tokens_quantized
            self.counters["flushes"] += int(flushed)
            if seq.always or flushed or seq.rounding is None:
                seq.mark_dirty(None)
            else:
                for l in layers:
                    l.commit(b, n, seq.rounding)
                # Which layers evicted is asked only before a dense step (_start_step): fused
                # decode steps read page tables and never the mirror, so they skip the STATS.
                seq.evictions_unchecked = seq.evictions_unchecked or seq.evicting
        self.appended += n
        self.counters["append_s"] += time.perf_counter() - t0

    def _changed_layers(self, seq: CacheSequence) -> Optional[set]:
        """Layers whose eviction counter (STATS "layers"; the daemon's sequences together)
        moved since the last call; None when unknown (then every layer is refetched)."""
        stats = seq.client.stats("layers").get("layers", {})
        counts = []
        for l in range(self.n_layers):
            fields = stats.get("layer_%d" % l)
            if not isinstance(fields, dict) or "evictions" not in fields:
                seq.layer_evictions = None
                return None
            counts.append(int(fields["evictions"]))
        old, seq.layer_evictions = seq.layer_evictions, counts
        if old is None:
            return None
        return {l for l in range(self.n_layers) if counts[l] != old[l]}

    def _fetch(self, batch_elements: List[int]) -> None:
        t0 = time.perf_counter()
        for b in batch_elements:
            seq = self.seqs[b]
            if seq.dirty_layers is None:
                begin, end = 0, self.n_layers
            else:
                begin, end = min(seq.dirty_layers), max(seq.dirty_layers) + 1
            res = seq.client.fetch(seq.sequence_id, layers=(begin, end), dtype="float32")
            self.counters["fetches"] += 1
            self.counters["fetched_layers"] += end - begin
            complete = True
            for i in range(end - begin):
                self.layers[begin + i].load(b, res.k[i], res.v[i], res.positions[i])
                complete = complete and all(len(p) == self.appended for p in res.positions[i])
            if not complete:
                seq.evicting = True
                if not self.attn_ours:
                    raise KvctlError("KvctlCache: the daemon holds fewer tokens than appended "
                                     "(eviction); pass the model so attention can mask them")
            if seq.rounding is None and seq.sent_last_row is not None and begin == 0:
                pos = res.positions[0][0]
                if len(pos) and int(pos[-1]) == self.appended - 1:
                    got, sent = res.k[0][0][-1], seq.sent_last_row
                    if np.array_equal(got, sent):
                        seq.rounding = "exact"
                    elif np.array_equal(got, sent.astype(np.float16).astype(np.float32)):
                        seq.rounding = "fp16"
            seq.dirty, seq.dirty_layers = False, None
            if seq.evicting and seq.layer_evictions is None:
                self._changed_layers(seq)  # The baseline the next APPENDs are compared with.
        self.counters["fetch_s"] += time.perf_counter() - t0

    # ---- fused decode attention (attention="fused") ---------------------------------------

    def _advance_blocks(self, seq: CacheSequence, k: np.ndarray, v: np.ndarray,
                        flushed: bool) -> None:
        """After an APPEND of k, v ([layers, n, heads, D] float32): the cached blocks FETCH
        stays valid when the APPEND only added rows: no flush, no eviction, no width lowering
        (pressure), and fp16 rows known to be stored as sent rounded to fp16 (learned from the
        first blocks FETCH). Its records and window row slots are untouched then (the new rows
        went to new slots), so the new rows, rounded to fp16 as the daemon stored them, are kept
        here and attended as extra window rows. Else it is refetched."""
        blocks = seq.blocks
        if (blocks is None or seq.blocks_stale or flushed or seq.evicting or seq.pressure
                or seq.always or seq.rounding != "fp16"):
            seq.blocks_stale = True
            return
        # [layers, heads, n, D] fp16: the rows appended since the FETCH.
        new_k = k.transpose(0, 2, 1, 3).astype(np.float16)
        new_v = v.transpose(0, 2, 1, 3).astype(np.float16)
        added = blocks.cache.get("added")
        if added is not None:
            new_k = np.concatenate([added[0], new_k], axis=2)
            new_v = np.concatenate([added[1], new_v], axis=2)
        blocks.cache["added"] = (new_k, new_v)
        self.counters["block_reuses"] += 1

    def _fetch_blocks(self) -> None:
        """Blocks FETCH of every layer of every sequence (page tables into the shm pool, over
        records and window rows alike), unless the cached one is still valid
        (_advance_blocks); with the previous table held, so only new records are listed."""
        from .pool_view import PoolView

        t0 = time.perf_counter()
        for seq in self.seqs:
            if seq.view is None:
                seq.view = PoolView.from_client(seq.client)
            if not seq.blocks_stale:
                continue
            # The table of the last FETCH goes along: the daemon lists only the records that
            # are new since it (a flush's), not every record of a long context again.
            blocks = seq.client.fetch_blocks(seq.sequence_id, held=seq.blocks)
            self.counters["block_fetches"] += 1
            seq.blocks = blocks
            seq.blocks_stale = False
            self._learn_rounding(seq, blocks)
        self.counters["fused_steps"] += 1
        self.counters["block_fetch_s"] += time.perf_counter() - t0

    def _learn_rounding(self, seq: CacheSequence, blocks: BlocksTable) -> None:
        """How the daemon stores window rows, from the newest row of layer 0, head 0 when it
        is the last token sent (the dense path learns the same from a dense FETCH)."""
        if seq.rounding is not None or seq.sent_last_row is None or blocks.layer_begin != 0:
            return
        pos = blocks.window_positions[0][0]
        if len(pos) == 0 or int(pos[-1]) != self.appended - 1:
            return
        got = seq.view.window_rows(blocks, 0)[0][-1].float().cpu().numpy()
        sent = seq.sent_last_row
        if np.array_equal(got, sent):
            seq.rounding = "exact"
        elif np.array_equal(got, sent.astype(np.float16).astype(np.float32)):
            seq.rounding = "fp16"

    def _fused_attention(self, layer: "KvctlLayer", query, key, value, attention_mask,
                         scaling):
        """One decode step of one layer: the fused kernel over what the daemon holds (records
        + sink/tail rows of the blocks FETCH) and the step's own K/V (the last row of key/value,
        one more window row per head). Returns [batch, 1, q_heads, D]."""
        if attention_mask is not None:
            allowed = (attention_mask if attention_mask.dtype == torch.bool
                       else attention_mask == 0)
            if not bool(allowed.all()):
                raise KvctlError("attention=\"fused\": the attention mask hides positions "
                                 "(padding); fused decode attends to every held token, use "
                                 "attention=\"dense\"")
        dim = query.shape[3]
        scale = float(scaling) if scaling is not None else dim ** -0.5
        k_new = key[:, :, -1].float()     # [B, kv_heads, D]: this step's token.
        v_new = value[:, :, -1].float()
        outs = []
        for b, seq in enumerate(self.seqs):
            # A device pool (pool.backend = "cuda") attends where its records are.
            dev = seq.view.tensor.device
            q = query[b, :, 0].float().to(dev)  # [q_heads, D]; rows h*g.. use KV head h.
            # Rows appended since the FETCH and the step's own token join each head's window as
            # more fp32 rows, so the kernel's softmax covers them (no log-sum-exp merge here).
            extra_k, extra_v = k_new[b, :, None].to(dev), v_new[b, :, None].to(dev)
            added = seq.blocks.cache.get("added")
            if added is not None:
                at = layer.index - seq.blocks.layer_begin
                extra_k = torch.cat([torch.from_numpy(added[0][at]).to(dev).float(), extra_k], 1)
                extra_v = torch.cat([torch.from_numpy(added[1][at]).to(dev).float(), extra_v], 1)
            out, _ = seq.view.layer_attention(seq.blocks, layer.index, q, scale=scale,
                                              extra_k=extra_k, extra_v=extra_v)
            outs.append(out.to(query.device))
        return torch.stack(outs).unsqueeze(1).to(query.dtype), None

    # ---- Cache API and lifetime -----------------------------------------------------------

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.layers[layer_idx].seen if layer_idx < len(self.layers) else 0

    def crop(self, max_length: int):
        raise NotImplementedError("KvctlCache cannot drop tokens from the daemon sequence")

    def stats(self, b: int = 0, section: str = ""):
        """Parsed STATS of batch element b's daemon (after sync())."""
        self.sync()
        return self.seqs[b].client.stats(section)

    def stats_text(self, b: int = 0, section: str = "") -> str:
        self.sync()
        return self.seqs[b].client.stats_text(section)

    def _ping_loop(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            for seq in self.seqs:
                try:
                    seq.client.ping()
                except KvctlError:
                    pass  # The next real request reports the problem.

    def _disconnect(self) -> None:
        self._drop_prefix_check()
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            if self._keepalive is not None:
                self._keepalive.join()
        for seq in self.seqs:
            seq.blocks = None
            if seq.view is not None:
                seq.view.close()
                seq.view = None
            if seq.own:
                seq.client.disconnect()

    def close(self) -> int:
        """Sends the pending step, then ends every session with BYE (the daemon frees the
        sequences and staging slots at once); returns the pool bytes freed. A session the
        daemon already lost has nothing left to free."""
        freed = 0
        try:
            try:
                self.sync()
            except SessionLostError:
                pass  # The cache is closing: nothing to restart.
            for seq in self.seqs:
                if not seq.attached or seq.client.session is None:
                    continue
                try:
                    freed += seq.client.bye().bytes_freed
                except SessionLostError:
                    pass
        finally:
            self._disconnect()
        return freed

    def __enter__(self) -> "KvctlCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

