# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Prefix reuse for kvctl.hf_cache.KvctlCache through the daemon's cluster tier (PROTOCOL.md 4.9
SAVE_PREFIX, 4.10 OPEN_PREFIX; docs/tier.md): a prompt whose prefix an engine already saved, on
this daemon or any daemon sharing the Redis Cluster, is restored instead of prefilled.

With KvctlCache(..., prefix_reuse=True), batch 1:

    cache = KvctlCache(model, endpoint, prefix_reuse=True)
    restored = cache.open_prefix(input_ids)        # before generate: OPEN_PREFIX, then FETCH
    out = model.generate(input_ids, past_key_values=cache, ...)   # saves the prompt too
    cache.close()

- open_prefix(input_ids) sends OPEN_PREFIX with the prompt's ids minus the last one (the model
  must run at least the last token to get its logits). When the daemon restores M > 0 tokens,
  every layer's M rows are read back with one dense FETCH, so the cache has length M and
  transformers' generate() runs the model only on the prompt's remaining tokens (it slices
  input_ids by get_seq_length()). The restored rows are the saving sequence's own (exact for a
  lossless daemon, the same quantized records otherwise).
- The prefill's APPEND (at the next step, sync() or close()) is split where the sequence holds
  the prompt without its last token, and SAVE_PREFIX stores those ids there: a later engine with
  the same prompt asks OPEN_PREFIX for exactly them, and the daemon stores a prefix under its
  longest exact cut only (a cut at the full prompt would never be found by such an engine).
  Nothing is saved when the restore already reached the last multiple of the daemon's
  tier.prefix_block_tokens in those ids (nothing longer can be stored). The automatic save
  never fails the generation: a daemon without a tier, an unreachable or full cluster is
  recorded in prefix_error (and warned once per call site); a lost session is raised as for
  any step. save_prefix() saves explicitly and raises.
- The ids each forward on the cache runs are checked against the prompt's until it is saved
  (a forward pre-hook on the model): other ids, or inputs_embeds, cancel the save (recorded in
  prefix_error, warned), since every engine sharing the cluster would restore that prefix. A
  cache made with config= instead of the model cannot check and trusts the caller.
- Without open_prefix() the cache knows no token ids: it works as without prefix_reuse.

Refused with ValueError naming prefix_reuse: more than one batch element, open_prefix() on a
cache that already holds tokens (a saved or restored prefix starts at position 0).

Thread safety: as KvctlCache (one thread).
"""

from __future__ import annotations

import time
import warnings
import weakref
from typing import Optional, Tuple

import numpy as np

from . import protocol as p
from .hf_sequence import next_sequence_id
from .protocol import KvctlError, SessionLostError


def prompt_ids(input_ids, what: str = "input_ids") -> np.ndarray:
    """One prompt's token ids as int32 [P] from a tensor or array [1, P] or [P], or a list;
    ValueError naming `what` for a batch > 1, and the protocol's checks (token_frame)."""
    if hasattr(input_ids, "detach"):
        input_ids = input_ids.detach().cpu().numpy()
    arr = np.asarray(input_ids) if not isinstance(input_ids, (list, tuple)) else input_ids
    if isinstance(arr, np.ndarray) and arr.ndim == 2:
        if arr.shape[0] != 1:
            raise ValueError("prefix_reuse: %s has batch %d, expected 1 (one prompt per cache)"
                             % (what, arr.shape[0]))
        arr = arr[0]
    try:
        return p.token_frame(arr)
    except ValueError as e:
        raise ValueError("%s: %s" % (what, e)) from None


def _prefix_block_tokens(client) -> Optional[int]:
    """The daemon's tier.prefix_block_tokens (from STATS "config"), or None when it cannot be
    read: prefixes are stored at multiples of it, so a restore that reached the prompt's last
    multiple leaves nothing longer to save."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11: the prompt is saved again (the daemon's cut is the same).
        return None
    try:
        value = tomllib.loads(client.stats_text("config")).get("tier", {}).get(
            "prefix_block_tokens")
    except tomllib.TOMLDecodeError:
        return None
    return value if isinstance(value, int) and value > 0 else None


class PrefixReuse:
    """KvctlCache's prefix reuse (a mixin: the methods use the cache's layers, sequences and
    step protocol). State: prefix_ids (the prompt given to open_prefix, int32, or None),
    prefix_restored (M of the last open_prefix), prefix_saved ((saved_tokens, stored_bytes) of
    the last SAVE_PREFIX, or None), prefix_error (why the automatic save stored nothing, or
    None)."""

    def _init_prefix(self, prefix_reuse: bool, batch: int, model) -> None:
        if not isinstance(prefix_reuse, bool):
            raise ValueError("prefix_reuse: got %r, expected True or False" % (prefix_reuse,))
        if prefix_reuse and batch != 1:
            raise ValueError("prefix_reuse: needs batch 1 (one client), got %d clients; a stored "
                             "prefix belongs to one sequence" % batch)
        self.prefix_reuse = prefix_reuse
        # The model, to check the ids its forwards run against the prompt (weak: the cache
        # must not keep a model alive).
        self._model = weakref.ref(model) if model is not None else None
        self._prefix_check = None  # The forward pre-hook doing it.
        self._forget_prefix()

    def _forget_prefix(self) -> None:
        """No prompt known (at start, and when the cache lost its rows)."""
        self.prefix_ids: Optional[np.ndarray] = None
        self.prefix_restored = 0
        self.prefix_saved: Optional[Tuple[int, int]] = None
        self.prefix_error: Optional[str] = None
        # Held tokens at which the prompt is saved (its length - 1), None once done or never.
        self._save_at: Optional[int] = None
        self._drop_prefix_check()

    def _drop_prefix_check(self) -> None:
        hook = getattr(self, "_prefix_check", None)
        if hook is not None:
            hook.remove()
            self._prefix_check = None

    def _check_forward_ids(self, module, args, kwargs) -> None:
        """Forward pre-hook of the model while a save is pending: the ids a forward on this
        cache runs must be the prompt's at their positions, else nothing is saved (a prefix
        stored under the prompt's ids but holding other tokens' rows would be restored by every
        engine that shares the cluster)."""
        if kwargs.get("past_key_values") is not self:
            return  # Another cache's forward on the same model.
        if self._save_at is None:
            self._drop_prefix_check()
            return
        x = kwargs.get("input_ids", args[0] if args else None)
        start = self.get_seq_length()
        why = None
        if x is None:
            why = "a forward at position %d ran inputs_embeds, not ids" % start
        else:
            got = x.reshape(-1)[:max(0, len(self.prefix_ids) - start)].tolist()
            want = self.prefix_ids[start:start + len(got)].tolist()
            if got != want:
                i = next(j for j, (a, b) in enumerate(zip(got, want)) if a != b)
                why = ("position %d ran token id %d, the prompt given to open_prefix has %d"
                       % (start + i, got[i], want[i]))
        if why is not None:
            self._save_at = None
            self._drop_prefix_check()
            self.prefix_error = "prompt not saved: %s" % why
            warnings.warn("KvctlCache(prefix_reuse=True): %s" % self.prefix_error,
                          RuntimeWarning, stacklevel=2)

    def _require_prefix_reuse(self, what: str) -> None:
        if not self.prefix_reuse:
            raise ValueError("%s: needs KvctlCache(..., prefix_reuse=True)" % what)

    def open_prefix(self, input_ids) -> int:
        """Call before the prefill (generate) with the prompt's ids ([1, P] or [P]): opens the
        sequence from the longest stored prefix of the prompt without its last token and loads
        those M tokens of every layer; returns M (0: nothing stored, no tier, or an unreachable
        cluster: the cache is empty and prefills as usual). generate() must then be given the
        same prompt: its ids are what the automatic SAVE_PREFIX names the prefilled rows by
        (checked, see the module doc). Raises ValueError naming prefix_reuse when the cache already holds
        tokens, KvctlError from the daemon (the cache is then empty, as after any failed
        step)."""
        self._require_prefix_reuse("open_prefix")
        ids = prompt_ids(input_ids)
        self.sync()
        held = max([l.seen for l in self.layers] + [self.appended])
        if held:
            raise ValueError("prefix_reuse: open_prefix needs an empty cache (a prefix starts at "
                             "position 0), this one holds %d tokens; use a new KvctlCache per "
                             "prompt" % held)
        try:
            self._attach_detached()
            return self._open_from_tier(ids)
        except SessionLostError as e:
            raise self._session_lost(e) from None
        except KvctlError as e:
            raise self._step_failed(e) from None

    def _open_from_tier(self, ids: np.ndarray) -> int:
        seq = self.seqs[0]
        self._forget_prefix()
        self.prefix_ids = ids
        if len(ids) < 2:
            return 0  # The only token is the one whose logits the model must compute.
        self._save_at = len(ids) - 1
        model = self._model() if self._model is not None else None
        if model is not None:
            self._prefix_check = model.register_forward_pre_hook(self._check_forward_ids,
                                                                 with_kwargs=True)
        t0 = time.perf_counter()
        # The empty sequence _attach opened makes way for one opened from the tier.
        seq.client.close(seq.sequence_id)
        seq.sequence_id = next_sequence_id()
        restored = seq.client.open_prefix(seq.sequence_id, ids[:-1])
        if restored > len(ids) - 1:
            raise p.ProtocolError("OPEN_PREFIX_REPLY: restored_tokens %d, expected at most %d "
                                  "(the ids sent)" % (restored, len(ids) - 1))
        self.counters["prefix_open_s"] += time.perf_counter() - t0
        if restored:
            self._load_restored(restored)
            block = _prefix_block_tokens(seq.client)
            if restored == len(ids) - 1 or (block and (len(ids) - 1) // block * block <= restored):
                self._save_at = None  # Nothing longer than the restored prefix can be stored.
        self.prefix_restored = restored
        self.counters["prefix_restored_tokens"] += restored
        return restored

    def _load_restored(self, m: int) -> None:
        """The daemon sequence holds positions 0 .. m-1: every layer takes them (dense FETCH of
        all layers), so get_seq_length() is m and the next step starts at position m."""
        for layer in self.layers:
            layer._reserve(m)
            layer.held = layer.seen = m
        self.appended = m
        seq = self.seqs[0]
        # How the daemon stores appended rows is learned again from the first APPEND.
        seq.mark_dirty(None)
        self._fetch([0])

    def _append_chunks(self, n: int, step: int):
        """The [a, e) ranges the pending n tokens are APPENDed in: at most `step` each, and one
        ends where the sequence holds the prompt without its last token (the save point)."""
        cut = self._save_at - self.appended if self._save_at is not None else 0
        bounds = sorted(set(range(step, n, step)) | ({cut} if 0 < cut < n else set()))
        return list(zip([0] + bounds, bounds + [n]))

    def _after_append(self, held: int) -> None:
        """After an APPEND that left the sequence holding `held` tokens: at the save point,
        SAVE_PREFIX of the prompt without its last token. Failures other than a lost session
        are recorded, never raised (see the module doc)."""
        if held != self._save_at:
            return
        self._save_at = None
        self._drop_prefix_check()
        try:
            self._save(self.prefix_ids[:held])
        except SessionLostError:
            raise
        except KvctlError as e:  # The sequence is unchanged by SAVE_PREFIX: go on without it.
            self.prefix_error = str(e)
            warnings.warn("KvctlCache(prefix_reuse=True): the prompt's prefix was not saved: %s"
                          % e, RuntimeWarning, stacklevel=2)

    def _save(self, ids: np.ndarray) -> Tuple[int, int]:
        seq = self.seqs[0]
        t0 = time.perf_counter()
        saved = seq.client.save_prefix(seq.sequence_id, ids)
        self.counters["prefix_save_s"] += time.perf_counter() - t0
        self.counters["prefix_saved_tokens"] += saved[0]
        self.prefix_saved = saved
        self.prefix_error = None
        return saved

    def save_prefix(self, input_ids=None) -> Tuple[int, int]:
        """SAVE_PREFIX now (after sync()): input_ids are the ids of every token the sequence
        holds ([1, T] or [T], T = get_seq_length() after sync(); e.g. out.sequences[:, :T] after
        generate), default the prompt given to open_prefix. Returns (saved_tokens,
        stored_bytes). Raises ValueError naming input_ids for a wrong count, ServerError from the
        daemon (FAILED_PRECONDITION without a tier, UNAVAILABLE, RESOURCE_EXHAUSTED)."""
        self._require_prefix_reuse("save_prefix")
        self._save_at = None  # This call saves; sync() must not save the prompt first.
        self.sync()
        if input_ids is None:
            if self.prefix_ids is None:
                raise ValueError("save_prefix: input_ids not given and no prompt from "
                                 "open_prefix; pass the ids of the tokens the sequence holds")
            ids = self.prefix_ids
        else:
            ids = prompt_ids(input_ids)
        if len(ids) != self.appended:
            raise ValueError("input_ids: got %d ids, expected %d (every token the sequence "
                             "holds, in order)" % (len(ids), self.appended))
        try:
            return self._save(ids)
        except SessionLostError as e:
            raise self._session_lost(e) from None
