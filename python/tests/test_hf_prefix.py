# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""KvctlCache(prefix_reuse=True) (python/kvctl/hf_prefix.py) with SmolLM2-135M.

- Against daemons that keep no prefixes (no cluster tier, tier.local_prefix_fraction = 0):
  OPEN_PREFIX restores nothing and generation is unchanged; the automatic SAVE_PREFIX is refused
  (FAILED_PRECONDITION), recorded and warned, and save_prefix() raises it.
- One daemon without a tier (test_one_daemon_shares_a_prefix_in_its_pool): engine B restores
  engine A's prompt from the daemon's local prefix cache, sharing its pages, and generates what A
  generated, bit for bit.
- The cache's restore path, with the tier played by the test over a lossless daemon
  (EmulatedTierClient): engine B restores engine A's prompt prefix, prefills only the rest and
  generates what A generated.
- The real thing (test_two_daemons_share_a_prefix_through_a_redis_cluster): two daemons on one
  Redis Cluster, engine A saves on daemon 1, engine B restores on daemon 2. It runs when
  KVCTL_TEST_TIER_NODES names a running cluster (HOST:PORT,...) or tools/redis_cluster.sh and
  redis-server are there to start one, and is skipped when the daemon binary has no tier yet.

Runs only with KVCTL_HF_TESTS=1, as the other HF tests.
"""

import os
import shutil
import socket
import subprocess
import uuid

import numpy as np
import pytest

from hf_common import TEXT  # First: skips this module unless the HF tests run.

import torch  # noqa: E402

import kvctl  # noqa: E402
from helpers import REPO  # noqa: E402
from kvctl.hf import KvctlCache  # noqa: E402

NEW_TOKENS = 8


@pytest.fixture(scope="module")
def ids(smollm2):
    _, tok = smollm2
    out = tok(TEXT * 6, return_tensors="pt").input_ids
    assert out.shape[1] >= 301
    return out


@pytest.fixture(scope="module")
def plain_daemon(_shared_factory):
    return _shared_factory(quant__lossless=True, pool__bytes="64MiB",
                           tier__local_prefix_fraction=0)


def _generate(model, prompt, cache, new_tokens=NEW_TOKENS):
    return model.generate(prompt, attention_mask=torch.ones_like(prompt),
                          max_new_tokens=new_tokens, do_sample=False, past_key_values=cache,
                          output_logits=True, return_dict_in_generate=True, pad_token_id=0)


class _PrefillLengths:
    """Records the number of tokens of each forward call of the model (the first is the
    prefill)."""

    def __init__(self, model):
        self.lengths = []
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        x = kwargs.get("input_ids")
        if x is None and args:
            x = args[0]
        self.lengths.append(int(x.shape[1]))

    def remove(self):
        self._handle.remove()


def _max_diff(a, b):
    return max((x - y).abs().max().item() for x, y in zip(a, b))


# ---- Without a tier -----------------------------------------------------------------------


def test_prefix_reuse_without_a_tier_generates_as_before(smollm2, ids, plain_daemon):
    model, _ = smollm2
    prompt = ids[:, :60]
    with KvctlCache(model, plain_daemon.endpoint) as cache:
        ref = _generate(model, prompt, cache)
    with KvctlCache(model, plain_daemon.endpoint, prefix_reuse=True) as cache:
        assert cache.open_prefix(prompt) == 0
        assert cache.get_seq_length() == 0
        with pytest.warns(RuntimeWarning, match="FAILED_PRECONDITION"):
            got = _generate(model, prompt, cache)
        # The automatic save ran at the first decode step, was refused, and changed nothing.
        assert cache.prefix_saved is None
        assert "keeps no prefixes" in cache.prefix_error
        with pytest.raises(kvctl.ServerError) as e:
            cache.save_prefix(got.sequences[:, :cache.get_seq_length()])
        assert e.value.code == "FAILED_PRECONDITION" and "tier.nodes" in e.value.message
    assert torch.equal(got.sequences, ref.sequences)
    assert all(torch.equal(a, b) for a, b in zip(got.logits, ref.logits))


def test_prefix_reuse_refuses_what_it_cannot_do(smollm2, ids, plain_daemon):
    model, _ = smollm2
    ep = plain_daemon.endpoint
    with pytest.raises(ValueError, match="prefix_reuse: needs batch 1"):
        KvctlCache(model, [ep, ep], prefix_reuse=True)
    with pytest.raises(ValueError, match="prefix_reuse: got 'yes'"):
        KvctlCache(model, ep, prefix_reuse="yes")
    with KvctlCache(model, ep) as cache:
        with pytest.raises(ValueError, match=r"open_prefix: needs KvctlCache\(\.\.\., "
                                             r"prefix_reuse=True\)"):
            cache.open_prefix(ids[:, :10])
    with KvctlCache(model, ep, prefix_reuse=True) as cache:
        with pytest.raises(ValueError, match="prefix_reuse: input_ids has batch 2"):
            cache.open_prefix(ids[:, :10].expand(2, -1))
        with torch.no_grad():
            model(ids[:, :10], past_key_values=cache)
        with pytest.raises(ValueError, match="prefix_reuse: open_prefix needs an empty cache"):
            cache.open_prefix(ids[:, :10])
        with pytest.raises(ValueError, match="input_ids: got 9 ids, expected 10"):
            cache.save_prefix(ids[:, :9])


def test_forward_of_other_ids_than_the_prompt_cancels_the_save(smollm2, ids, plain_daemon):
    model, _ = smollm2
    prompt = ids[:, :30]
    other = prompt.clone()
    other[0, 17] += 1
    with KvctlCache(model, plain_daemon.endpoint, prefix_reuse=True) as cache:
        assert cache.open_prefix(prompt) == 0
        with pytest.warns(RuntimeWarning, match="position 17 ran token id"):
            _generate(model, other, cache, new_tokens=2)
        assert cache.prefix_saved is None
        assert cache.prefix_error.startswith("prompt not saved: position 17 ran token id %d, "
                                             "the prompt given to open_prefix has %d"
                                             % (other[0, 17], prompt[0, 17]))
        assert cache._prefix_check is None  # The hook is gone with the pending save.
    # The same prompt in two forwards (a chunked prefill) is the prompt: checked, then saved
    # (refused here: this daemon keeps no prefixes).
    with KvctlCache(model, plain_daemon.endpoint, prefix_reuse=True) as cache:
        assert cache.open_prefix(prompt) == 0
        with torch.no_grad():
            model(prompt[:, :12], past_key_values=cache)
        with pytest.warns(RuntimeWarning, match="FAILED_PRECONDITION"):
            _generate(model, prompt, cache, new_tokens=2)
        assert "keeps no prefixes" in cache.prefix_error


# ---- The restore path, the tier played by the test ---------------------------------------


class EmulatedTierClient(kvctl.Client):
    """A Client whose SAVE_PREFIX and OPEN_PREFIX are played here over a lossless daemon, as a
    daemon with a tier answers them for a lossless sequence: save keeps the rows of the longest
    multiple of `block` tokens (a dense FETCH), open OPENs and APPENDs the longest stored prefix
    of the ids. The stored rows are shared by every instance (`store`)."""

    block = 16
    store = {}
    saves = []  # The id count of every save_prefix.

    def save_prefix(self, seq, tokens):
        tokens = np.asarray(tokens)
        self.saves.append(len(tokens))
        m = len(tokens) // self.block * self.block
        if not m:
            return 0, 0
        rows = self.fetch(seq, stacked=True)
        k, v = rows.k[:, :m].copy(), rows.v[:, :m].copy()
        self.store[tuple(tokens[:m].tolist())] = (k, v)
        return m, k.nbytes + v.nbytes

    def open_prefix(self, seq, tokens):
        self.open(seq)
        tokens = tuple(np.asarray(tokens).tolist())
        best = max((key for key in self.store if tokens[:len(key)] == key), key=len,
                   default=())
        if best:
            k, v = self.store[best]
            self.append(seq, k, v, first_position=0)
        return len(best)


def test_restored_prefix_skips_its_prefill_and_generates_what_the_saver_did(smollm2, ids,
                                                                             plain_daemon):
    model, _ = smollm2
    prompt = ids[:, :121]  # 120 ids sent: the longest stored prefix is 112 tokens.
    EmulatedTierClient.store.clear()
    EmulatedTierClient.saves.clear()
    a_client = EmulatedTierClient(plain_daemon.endpoint, timeout_ms=30000)
    b_client = EmulatedTierClient(plain_daemon.endpoint, timeout_ms=30000)
    try:
        with KvctlCache(model, a_client, prefix_reuse=True) as a:
            assert a.open_prefix(prompt) == 0
            want = _generate(model, prompt, a)
            assert a.prefix_saved == (112, 2 * 112 * a.n_layers * a.kv_heads * a.head_dim * 4)
            assert a.prefix_error is None
        with KvctlCache(model, b_client, prefix_reuse=True) as b:
            assert b.open_prefix(prompt) == 112
            assert b.get_seq_length() == 112 and b.counters["fetches"] == 1
            lengths = _PrefillLengths(model)
            try:
                got = _generate(model, prompt, b)
            finally:
                lengths.remove()
            assert lengths.lengths[0] == 121 - 112  # Only the rest of the prompt ran.
            b.sync()
            assert b.appended == 121 + NEW_TOKENS - 1
            # The daemon's tier.prefix_block_tokens is 16, as the emulation's: 112 is the
            # longest prefix of the 120 ids that can be stored, and it is stored.
            assert b.prefix_saved is None and b.prefix_error is None
        # A saved its prompt without the last token: what an engine with it asks for.
        assert EmulatedTierClient.saves == [120]
        # A longer prompt whose stored prefix can grow is saved again.
        with KvctlCache(model, b_client, prefix_reuse=True) as c:
            assert c.open_prefix(ids[:, :140]) == 112
            _generate(model, ids[:, :140], c, new_tokens=2)
            assert c.prefix_saved == (128, 2 * 128 * c.n_layers * c.kv_heads * c.head_dim * 4)
        assert EmulatedTierClient.saves == [120, 139]
    finally:
        a_client.disconnect()
        b_client.disconnect()
    assert torch.equal(got.sequences, want.sequences)
    # Lossless: the same rows; only the prefill's split (9 query rows instead of 121) moves the
    # last bits of the logits, as between KvctlCache and DynamicCache (test_hf.py).
    diff = _max_diff(got.logits, want.logits)
    assert diff <= 1e-4, diff


# ---- The real tier: two daemons on one Redis Cluster ---------------------------------------


def _free_base_port(count: int) -> int:
    """A base port with `count` free ports from it and their cluster bus ports (+10000)."""
    rng = np.random.default_rng(os.getpid())
    for _ in range(50):
        base = int(rng.integers(20000, 30000))
        ports = [base + i for i in range(count)] + [base + 10000 + i for i in range(count)]
        ok = True
        for port in ports:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    pytest.skip("no free port range for a Redis Cluster")


@pytest.fixture(scope="module")
def tier_nodes(workdir):
    """HOST:PORT,... of a Redis Cluster: KVCTL_TEST_TIER_NODES, else one started here with
    tools/redis_cluster.sh (3 masters, bounded start, stopped at teardown)."""
    nodes = os.environ.get("KVCTL_TEST_TIER_NODES")
    if nodes:
        yield nodes
        return
    script = os.path.join(REPO, "tools", "redis_cluster.sh")
    if not os.path.exists(script) or shutil.which("redis-server") is None:
        pytest.skip("no Redis Cluster: set KVCTL_TEST_TIER_NODES=HOST:PORT,... or install "
                    "redis-server (tools/redis_cluster.sh starts one)")
    base = _free_base_port(3)
    folder = os.path.join(workdir, "redis-%d" % base)
    try:
        run = subprocess.run([script, "start", folder, str(base), "3", "0"],
                             capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        subprocess.run([script, "stop", folder, str(base)], timeout=60)
        pytest.fail("tools/redis_cluster.sh start did not finish within 120 s")
    if run.returncode != 0:
        subprocess.run([script, "stop", folder, str(base)], timeout=60)
        pytest.fail("tools/redis_cluster.sh start failed (%d):\n%s%s"
                    % (run.returncode, run.stdout, run.stderr))
    try:
        yield ",".join("127.0.0.1:%d" % (base + i) for i in range(3))
    finally:
        subprocess.run([script, "stop", folder, str(base)], timeout=60)


class SnapshotClient(kvctl.Client):
    """A Client that reads its sequence's rows (dense FETCH) right after each successful
    SAVE_PREFIX: what was stored, before later steps flush the tail into records."""

    saved_rows = None

    def save_prefix(self, seq, tokens):
        reply = super().save_prefix(seq, tokens)
        self.saved_rows = self.fetch(seq, stacked=True)
        return reply


def _skip_without_tier_support(daemon):
    """SAVE_PREFIX of a 16-token sequence: a daemon built before the tier answers
    FAILED_PRECONDITION "no cluster tier" even with tier.nodes set."""
    with kvctl.Client(daemon.endpoint, timeout_ms=10000) as c:
        c.hello(layers=1, kv_heads=1, head_dim=64, dtype="float32")
        c.open(1)
        c.append(1, np.zeros((1, 16, 1, 64), np.float32), np.zeros((1, 16, 1, 64), np.float32))
        try:
            c.save_prefix(1, np.arange(16) + 7 * 10**6)
        except kvctl.ServerError as e:
            if e.code == "FAILED_PRECONDITION" and "no cluster tier" in e.message:
                pytest.skip("the kvctl binary has no cluster tier yet (%s)" % e.message)
            raise


# Quantizer settings of the two daemons: lossless, and KVarN (default method and widths) with
# short sinks and blocks so a 301-token prompt holds quantized records: 16 fp16 sinks, records of
# 32 tokens from position 16, so after 288 tokens positions 16..271 are records and 272..287 the
# fp16 tail, and 288 is an exact cut (a multiple of tier.prefix_block_tokens = 16 splitting no
# record) in both cases.
TIER_CASES = {
    "lossless": {"quant__lossless": True},
    "kvarn": {"quant__method": "kvarn", "quant__sink_tokens": 16, "quant__block_tokens": 32,
              "quant__flush_tokens": 32},
}
PROMPT, CUT = 301, 288  # OPEN_PREFIX gets 300 ids: its longest multiple of 16 is 288.


@pytest.mark.parametrize("case", sorted(TIER_CASES))
def test_two_daemons_share_a_prefix_through_a_redis_cluster(smollm2, ids, daemon_factory,
                                                            tier_nodes, case):
    """Engine A on daemon 1 prefills the prompt's first CUT tokens, then generate() runs the
    rest and A's prompt is saved; engine B on daemon 2 restores those CUT tokens from the
    cluster, generate() runs only the rest, and B's logits and tokens are A's bit for bit: the
    same records and rows (checked directly too), the same remaining forward. (An engine that
    prefilled the whole prompt at once attended to it unquantized, which a restore of quantized
    records cannot reproduce; for lossless it agrees to 1e-4, checked here too.)"""
    model, _ = smollm2
    settings = dict(TIER_CASES[case], pool__bytes="128MiB", tier__nodes=tier_nodes,
                    # A key prefix of its own: an earlier run's prefixes are not found.
                    tier__key_prefix="kvpy-%s" % uuid.uuid4().hex[:12],
                    tier__prefix_block_tokens=16)
    d1 = daemon_factory(**settings)
    d2 = daemon_factory(**settings)
    _skip_without_tier_support(d1)
    _share_and_compare(model, ids, d1, d2, case)


@pytest.mark.parametrize("case", sorted(TIER_CASES))
def test_one_daemon_shares_a_prefix_in_its_pool(smollm2, ids, daemon_factory, case):
    """As above on one daemon without a tier: B's sequence is opened from the prefix A's save
    left in the daemon's local prefix cache, reading its pages in place (kv_shared_bytes), with
    the same rows, logits and tokens as A's."""
    model, _ = smollm2
    d = daemon_factory(**dict(TIER_CASES[case], pool__bytes="128MiB", tier__prefix_block_tokens=16))
    _share_and_compare(model, ids, d, d, case)
    with kvctl.Client(d.endpoint, timeout_ms=10000) as c:
        stats = c.stats("prefix")["prefix"]
    assert stats["prefix_cache_hits_total"] == 1 and stats["prefix_cache_entries"] == 1


def _share_and_compare(model, ids, d1, d2, case):
    """Engine A on d1 saves its prompt, engine B on d2 restores it: what both tests check."""
    prompt = ids[:, :PROMPT]
    a_client = SnapshotClient(d1.endpoint, timeout_ms=60000)
    try:
        with KvctlCache(model, a_client, prefix_reuse=True) as a:
            assert a.open_prefix(prompt) == 0
            with torch.no_grad():
                model(prompt[:, :CUT], past_key_values=a, use_cache=True)
            want = _generate(model, prompt, a)  # Runs the last PROMPT - CUT tokens, then decodes.
            assert a.prefix_error is None, a.prefix_error
            saved, stored_bytes = a.prefix_saved
            assert saved == CUT and stored_bytes > 0
        a_rows = a_client.saved_rows  # When A's prompt was saved (the first decode step).
    finally:
        a_client.disconnect()
    with KvctlCache(model, d2.endpoint, prefix_reuse=True, timeout_ms=60000) as b:
        assert b.open_prefix(prompt) == CUT
        b_rows = b.client.fetch(b.sequence_id, stacked=True)
        lengths = _PrefillLengths(model)
        try:
            got = _generate(model, prompt, b)
        finally:
            lengths.remove()
        assert lengths.lengths[0] == PROMPT - CUT
        assert b.prefix_saved is None  # 288 is all a 300-id prefix can store: not again.
        if d1 is d2:  # One daemon: B reads the cached prefix's pages, no copy.
            assert b.client.stats("sequences")["sequences"]["kv_shared_bytes"] > 0
    # The restored rows are the saving sequence's, bit for bit (records and fp16 rows alike).
    assert b_rows.positions.tolist() == list(range(CUT))
    np.testing.assert_array_equal(b_rows.k, a_rows.k[:, :CUT])
    np.testing.assert_array_equal(b_rows.v, a_rows.v[:, :CUT])
    assert torch.equal(got.sequences, want.sequences)
    assert all(torch.equal(x, y) for x, y in zip(got.logits, want.logits))
    if case == "lossless":
        with KvctlCache(model, d1.endpoint) as whole:
            once = _generate(model, prompt, whole)
        assert torch.equal(got.sequences, once.sequences)
        assert _max_diff(got.logits, once.logits) <= 1e-4
