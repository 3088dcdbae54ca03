# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""SharedPrefill: a batch-1 view of a batch-B KvctlCache, so one prefill forward fills every
daemon of a kveval batch.

A prefill attends only to its own K/V (the daemon holds nothing yet, and KvctlCache attends to
the step's fresh rows exactly), so its result is the same for every batch element whatever the
daemon does with the rows afterwards. Running it at batch 1 instead of B costs 1/B of the
compute; the K/V (and Q, for daemons that score with it) are APPENDed to each of the B
sequences at the next step (KvctlCache._sync sends pending rows of batch 1 to every sequence).

    view = SharedPrefill(cache)                      # cache: KvctlCache of batch B, empty
    logits = model(ids[:1], past_key_values=view, position_ids=pos, logits_to_keep=1).logits
    # then decode on `cache` itself at batch B

Only for the first forward of an empty cache: afterwards the elements' held rows differ.
It leans on KvctlLayer internals (returned_keys, pending_k/v) and is checked end to end by
`kveval --quick`: the lossless row decoded after a shared prefill equals DynamicCache.
"""

from __future__ import annotations

from transformers.cache_utils import Cache, CacheLayerMixin


class _SharedLayer(CacheLayerMixin):
    is_compileable = False

    def __init__(self, real, batch: int):
        super().__init__()
        self.real = real
        self.batch = batch
        self.is_sliding = real.is_sliding

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, cache_kwargs=None):
        if self.real.seen:
            raise RuntimeError("SharedPrefill: layer %d already holds %d tokens; a shared "
                               "prefill must be the cache's first forward"
                               % (self.real.index, self.real.seen))
        shape = (self.batch,) + tuple(key_states.shape[1:])
        keys, values = self.real.update(key_states.expand(shape), value_states.expand(shape),
                                        cache_kwargs)
        # Send the batch-1 rows (the expanded views would be copied B times by the APPEND).
        self.real.pending_k, self.real.pending_v = key_states.detach(), value_states.detach()
        k1, v1 = keys[:1], values[:1]
        # The "kvctl" attention recognises its layer by the returned keys (and records Q).
        self.real.returned_keys = k1
        self.is_initialized = True
        return k1, v1

    def get_mask_sizes(self, cache_position):
        return self.real.get_mask_sizes(cache_position)

    def get_seq_length(self) -> int:
        return self.real.get_seq_length()

    def get_max_cache_shape(self) -> int:
        return self.real.get_max_cache_shape()


class SharedPrefill(Cache):
    def __init__(self, cache):
        super().__init__(layers=[_SharedLayer(l, cache.batch) for l in cache.layers])
        self.cache = cache
