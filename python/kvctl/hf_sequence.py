# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""CacheSequence: what kvctl.hf_cache.KvctlCache knows of one batch element's daemon sequence
(its client, session and sequence id, how the daemon stores its rows, what must be refetched, the
fused path's page tables). Internal to kvctl.hf_cache.

Thread safety: used by the cache's one thread.
"""

from __future__ import annotations

import itertools
from typing import List, Optional

import numpy as np

from .client import BlocksTable

_sequence_ids = itertools.count(1)


def next_sequence_id() -> int:
    """A daemon sequence id no other cache of this process uses (ids are per session; one
    counter keeps them unique across every cache and every replacement)."""
    return next(_sequence_ids)


class CacheSequence:
    """One batch element: its client, session and daemon sequence, and what is known of it."""

    def __init__(self, client, own: bool):
        self.client = client
        self.own = own            # The cache made the client (and disconnects it).
        self.session = None       # The client's Session from the cache's HELLO.
        self.sequence_id = 0
        self.attached = False     # Has a live session and daemon sequence (KvctlCache._attach).
        self.model_name = ""
        self.where = ""           # The endpoint, for messages.
        self.send_q = False
        self.evicting = False     # The daemon may drop tokens (budget_mode) or did.
        self.always = False       # refetch="always".
        self.pressure = False     # budget.pressure = requantize: an APPEND may move records.
        self.view = None          # PoolView of the daemon's shm pool (attention="fused").
        self.forget()

    def forget(self) -> None:
        """Drops what was learned of the daemon sequence (at start, and after it was lost)."""
        self.tokens_quantized = 0
        self.rounding: Optional[str] = None  # "exact" or "fp16" once learned.
        self.dirty = False        # Rows of `dirty_layers` (None = all) must be fetched.
        self.dirty_layers: Optional[set] = None
        self.layer_evictions: Optional[List[int]] = None  # STATS per-layer counters.
        # APPENDs of an evicting sequence since the counters were last read: which layers they
        # changed is asked (one STATS) only when a dense step needs the mirror.
        self.evictions_unchecked = False
        self.last_append = None
        self.sent_last_row: Optional[np.ndarray] = None
        if self.view is not None:  # It maps the pool of the daemon that lost the sequence.
            self.view.close()
            self.view = None
        self.blocks: Optional[BlocksTable] = None  # This step's blocks FETCH (valid until APPEND).
        # The cached blocks no longer match the daemon (flush, eviction, width lowering, or not
        # learned yet whether an APPEND just adds rows to the window).
        self.blocks_stale = True

    def mark_dirty(self, layers: Optional[set]) -> None:
        """Rows of `layers` (None = all) must be fetched before the next step."""
        if layers is None or (self.dirty and self.dirty_layers is None):
            self.dirty_layers = None
        else:
            self.dirty_layers = (self.dirty_layers or set()) | set(layers)
        self.dirty = True
