# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Observability end to end, with real processes: kvtop's screen under tmux, /metrics through
prometheus_client's parser, kvtop --once --json against the raw stats text, kvtop across a daemon
restart, and the stats PUB stream's timing."""

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import zmq

from obs_helpers import (Daemon, Tmux, Traffic, kvtop_bin, kvtop_command,
                         parse_stats, wait_until)

needs_tmux = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


@pytest.fixture
def cleanup():
    """Things to close at the end of the test, last first."""
    items = []
    yield items
    for item in reversed(items):
        item.close()


def sub_socket(endpoint):
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"stats")
    sub.connect(endpoint)
    return sub


def next_stats(sub, timeout_s):
    """The next PUB message's frames, or None after timeout_s."""
    if not sub.poll(int(timeout_s * 1000)):
        return None
    return sub.recv_multipart()


def layer_rows(screen):
    return [int(n) for n in re.findall(r"^[> ]L(\d+) ", screen, re.M)]


HEADER_FIELDS = ["kvctl 0.1.0", "up ", "pool ", "pages ", "bits/elt ", " vs fp16", "req/s ",
                 "append/s ", "fetch/s ", "p50 ", "p99 "]


@needs_tmux
@pytest.mark.parametrize("width,height", [(100, 30), (80, 24)])
def test_kvtop_screen_shows_header_layers_heads_and_sequences(daemon, cleanup, width, height):
    cleanup.append(Traffic(daemon, sequences=3, layers=12, heads=4, prefill=512, steps=3000,
                           step_interval_ms=2, hold_s=30).start())
    tmux = Tmux(kvtop_command(daemon), width, height)
    cleanup.append(tmux)
    # Rates need two snapshots; then the decode traffic shows as appends per second.
    screen = tmux.wait_screen(
        lambda s: "obs-traffic" in s and re.search(r"append/s [1-9]", s), 10, "live data")
    lines = screen.splitlines()
    assert len(lines) <= height and max(len(line) for line in lines) <= width
    for field in HEADER_FIELDS + [daemon.endpoint, "live"]:
        assert field in screen, field
    # 64MiB pool less 4 staging slots of 8MiB: 32MiB of pages.
    assert re.search(r"pool [0-9.]+[KMG]/32\.0M [0-9.]+%", screen), "pool used/total"
    layers = layer_rows(screen)
    assert layers[0] == 0 and layers == list(range(layers[0], layers[0] + len(layers)))
    assert len(layers) == 12 if height >= 30 else len(layers) >= 8
    assert re.search(r"^>L0 ", screen, re.M), "layer 0 is selected"
    # Heads heat map and quality panel of the selected layer: 4 heads, 2-bit kvarn.
    assert "Heads of layer 0" in screen
    assert re.search(r"head +h0 +h1 +h2 +h3", screen)
    assert re.search(r"kbit +2 +2 +2 +2", screen)
    assert re.search(r"tok +\d+ +\d+ +\d+ +\d+", screen)
    assert re.search(r"Quality 1/16: \d+ samples", screen)
    assert re.search(r"Kerr +\.\d{3} +\.\d{3}", screen)
    # The sequences table: three sequences of one session.
    assert re.search(r"SESS/SEQ +CLIENT +TOKENS +BYTES +EVICT +AGE", screen)
    rows = re.findall(r"^ ~?\d+/([123]) +obs-traffic +(\d+) ", screen, re.M)
    assert sorted(seq for seq, _ in rows) == ["1", "2", "3"]
    tokens = [int(t) for _, t in rows]
    assert tokens == sorted(tokens, reverse=True), "sorted by tokens"
    assert "q quit" in lines[-1] or "q quit" in screen.rstrip().splitlines()[-1]

    if width != 100:
        return
    tmux.keys("l")
    tmux.wait_screen(lambda s: "Heads of layer 1" in s and re.search(r"^>L1 ", s, re.M), 3,
                     "layer 1 selected")
    tmux.keys("Down")
    tmux.wait_screen(lambda s: "Heads of layer 2" in s, 3, "Down selects layer 2")
    tmux.keys("s")
    tmux.wait_screen(lambda s: "sort: bytes" in s, 3, "sort by bytes")
    tmux.keys("?")
    tmux.wait_screen(lambda s: "kvtop keys" in s, 3, "help")
    tmux.keys("x")
    tmux.wait_screen(lambda s: "kvtop keys" not in s and "SESS/SEQ" in s, 3, "help closed")
    tmux.keys("p")
    paused = tmux.wait_screen(lambda s: "PAUSED" in s, 3, "paused")
    time.sleep(1.0)
    assert tmux.screen().splitlines()[3] == paused.splitlines()[3], "rates frozen while paused"
    tmux.keys("p")
    tmux.wait_screen(lambda s: "live" in s.splitlines()[0], 3, "resumed")
    tmux.keys("q")
    status = wait_until(tmux.exit_status, 3, "kvtop to exit")
    assert status == "0"


@needs_tmux
def test_kvtop_no_color_and_ascii(daemon, cleanup):
    tmux = Tmux("env LANG=C LC_ALL=C " + kvtop_command(daemon, "--no-color"), 80, 24)
    cleanup.append(tmux)
    cleanup.append(Traffic(daemon, sequences=1, layers=4, heads=2, prefill=300, hold_s=20).start())
    # The sequence's row can show before its first append lands; the layer bars fill after it.
    screen = tmux.wait_screen(
        lambda s: "obs-traffic" in s and re.search(r"^[> ]L0 +[#+]", s, re.M), 8, "a filled bar")
    assert "█" not in screen and "░" not in screen, "ASCII bars in the C locale"
    colored = tmux.screen(escapes=True)
    assert not re.search(r"\x1b\[[0-9;]*(3[0-7]|4[0-7])m", colored), "no color escapes"
    assert "█" not in colored, "ASCII bars in the C locale"


@needs_tmux
def test_kvtop_survives_a_daemon_restart(workdir, cleanup):
    daemon = Daemon(workdir).start()
    cleanup.append(daemon)
    tmux = Tmux(kvtop_command(daemon), 100, 30)
    cleanup.append(tmux)
    tmux.wait_screen(lambda s: "pid %d" % daemon.pid in s and "live" in s, 8, "live data")

    assert daemon.stop(signal.SIGTERM) == 0
    screen = tmux.wait_screen(lambda s: "not reachable" in s, 10, "the not-reachable message")
    assert "kvctl not reachable at %s; retrying" % daemon.stats_endpoint in screen
    assert "last data at" in screen
    dead, kvtop_pid = tmux.pane()
    assert not dead and tmux.exit_status() is None, "kvtop still runs while the daemon is down"

    daemon.start()
    tmux.wait_screen(lambda s: "pid %d" % daemon.pid in s and "not reachable" not in s and
                     "live" in s, 10, "data from the restarted daemon")
    dead, pid_after = tmux.pane()
    assert not dead and tmux.exit_status() is None and pid_after == kvtop_pid


def scrape(daemon):
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(daemon.url("/metrics"), timeout=5) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = r.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    return families, samples


def test_metrics_parse_with_labels_and_counters_only_grow(daemon, cleanup):
    pytest.importorskip("prometheus_client")
    traffic = Traffic(daemon, sequences=2, layers=4, heads=2, prefill=512, steps=400,
                      step_interval_ms=3, hold_s=20)
    cleanup.append(traffic.start())
    families, before = scrape(daemon)

    types = {"kvctl_pool_bytes": "gauge", "kvctl_pages_used": "gauge",
             "kvctl_requests": "counter", "kvctl_append_requests": "counter",
             "kvctl_append_latency_p99_us": "gauge", "kvctl_bits_per_element": "gauge",
             "kvctl_layer_tokens": "gauge", "kvctl_head_k_bits": "gauge",
             "kvctl_head_k_rel_error": "gauge", "kvctl_sequence_tokens": "gauge",
             "kvctl_server_info": "gauge", "kvctl_quality_samples": "counter"}
    for name, kind in types.items():
        assert name in families, name
        assert families[name].type == kind, name
    layers = {s.labels["layer"] for s in families["kvctl_layer_tokens"].samples}
    assert layers == {"0", "1", "2", "3"}
    heads = {(s.labels["layer"], s.labels["head"]) for s in families["kvctl_head_k_bits"].samples}
    assert heads == {(str(l), str(h)) for l in range(4) for h in range(2)}
    assert all(s.value == 2 for s in families["kvctl_head_k_bits"].samples)
    seqs = families["kvctl_sequence_tokens"].samples
    assert {s.labels["sequence"] for s in seqs} == {"1", "2"}
    assert all(s.labels["client"] == "obs-traffic" for s in seqs)
    assert families["kvctl_server_info"].samples[0].labels["kvctl_version"] == "0.1.0"
    assert before[("kvctl_sequences", ())] == 2

    # Counters never go down while traffic runs (sequences stay open), and requests grow.
    wait_until(lambda: scrape(daemon)[1][("kvctl_append_requests_total", ())] >
               before[("kvctl_append_requests_total", ())] + 50, 10, "more appends")
    _, after = scrape(daemon)
    counters = [(f.name, s) for f in families.values() if f.type == "counter" for s in f.samples]
    assert len(counters) >= 20
    for _, s in counters:
        key = (s.name, tuple(sorted(s.labels.items())))
        assert after[key] >= before[key], key
    assert after[("kvctl_requests_total", ())] > before[("kvctl_requests_total", ())]

    with urllib.request.urlopen(daemon.url("/healthz"), timeout=5) as r:
        assert r.status == 200 and r.read() == b"ok\n"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(daemon.url("/nope"), timeout=5)
    assert e.value.code == 404


def test_quality_samples_counter_survives_a_closed_sequence(daemon, cleanup):
    pytest.importorskip("prometheus_client")
    traffic = Traffic(daemon, sequences=1, layers=2, heads=1, prefill=512, hold_s=1, close=True)
    cleanup.append(traffic.start())
    _, before = scrape(daemon)
    assert before[("kvctl_quality_samples_total", ())] > 0
    traffic.wait_for("done")
    _, after = scrape(daemon)
    assert after[("kvctl_quality_samples_total", ())] >= before[("kvctl_quality_samples_total", ())]


def test_json_snapshot_matches_the_stats_text(daemon, cleanup):
    cleanup.append(Traffic(daemon, sequences=2, layers=4, heads=2, prefill=640, hold_s=20).start())
    sub = sub_socket(daemon.stats_endpoint)
    frames = next_stats(sub, 3)
    frames = next_stats(sub, 3)  # Published after the prefill for sure.
    sub.close()
    assert frames is not None and frames[0] == b"stats"
    raw = parse_stats(frames[1].decode())

    out = subprocess.run([kvtop_bin(), "--once", "--json", "--endpoint", daemon.endpoint],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    snap = json.loads(out.stdout)
    assert list(snap) == ["server", "pool", "sequences", "layers", "heads", "policy", "ipc",
                          "quality", "tier", "prefix"]
    assert snap["tier"] == {"tier_enabled": 0}
    assert snap["prefix"]["prefix_cache_enabled"] == 1 and snap["prefix"]["prefix_cache_entries"] == 0
    assert isinstance(snap["pool"]["pool_bytes"], int)
    assert isinstance(snap["sequences"]["bits_per_element"], float)
    assert snap["server"]["kvctl_version"] == "0.1.0"

    def same(section, key):
        assert str(snap[section][key]) == raw[section][key] or \
            float(snap[section][key]) == float(raw[section][key]), (section, key)
    for key in ["pool_bytes", "page_bytes", "pages", "pages_used", "bytes_used", "staging_slots"]:
        same("pool", key)
    for key in ["sessions", "sequences", "tokens", "tokens_quantized", "kv_payload_bytes",
                "kv_pool_bytes", "bits_per_element", "compression_vs_fp16"]:
        same("sequences", key)
    same("server", "pid")
    same("server", "endpoint")
    # Configured as 127.0.0.1:0: STATS names the port the daemon actually bound.
    assert raw["server"]["http_address"] == "127.0.0.1:%d" % daemon.http_port
    same("layers", "layers")
    same("heads", "heads")
    same("quality", "quality_samples_total")
    for key in raw["policy"]:
        same("policy", key)
    assert snap["sequences"]["tokens"] == 640 + 704
    entities = [k for k in raw["sequences"] if k.startswith("seq_")]
    entities += [k for k in raw["layers"] if k.startswith("layer_")]
    entities += [k for k in raw["heads"] if k.startswith("head_")]
    assert len(entities) == 2 + 4 + 8
    for name in entities:
        section = "sequences" if name.startswith("seq_") else \
            "layers" if name.startswith("layer_") else "heads"
        for key, value in raw[section][name].items():
            if key == "age_s":
                continue
            got = snap[section][name][key]
            assert str(got) == value or float(got) == float(value), (name, key)
    assert [snap["sequences"][k]["client"] for k in entities if k.startswith("seq_")] == \
        ["obs-traffic"] * 2

    plain = subprocess.run([kvtop_bin(), "--once", "--endpoint", daemon.endpoint],
                           capture_output=True, text=True, timeout=10)
    assert plain.returncode == 0, plain.stderr
    assert "kvctl 0.1.0" in plain.stdout and "Layers 4" in plain.stdout
    assert len(re.findall(r"^  ~?\d+/[12] +obs-traffic +(640|704) ", plain.stdout, re.M)) == 2


def test_once_against_no_daemon_fails_with_one_line(workdir):
    endpoint = "ipc://%s/nobody.sock" % workdir
    for extra in ([], ["--json"]):
        out = subprocess.run([kvtop_bin(), "--once", "--endpoint", endpoint, "--timeout-ms", "300"]
                             + extra, capture_output=True, text=True, timeout=10)
        assert out.returncode == 1
        assert out.stdout == ""
        assert out.stderr.count("\n") == 1
        assert out.stderr.startswith("kvtop: kvctl not reachable at %s" % endpoint)


def test_pub_stream_delivers_within_two_intervals(workdir, cleanup):
    daemon = Daemon(workdir, interval_ms=300, http=False).start()
    cleanup.append(daemon)
    interval = daemon.interval_ms / 1000
    sub = sub_socket(daemon.stats_endpoint)
    try:
        start = time.monotonic()
        frames = next_stats(sub, 2 * interval)
        assert frames is not None, "no stats message within 2 intervals"
        assert time.monotonic() - start <= 2 * interval
        assert len(frames) == 2 and frames[0] == b"stats"
        text = frames[1].decode()
        assert text.startswith("# Server\n") and "# Quality\n" in text
        assert parse_stats(text)["server"]["pid"] == str(daemon.pid)
        # Each next message within 2 intervals too; on average one per interval (single gaps
        # jitter with scheduling on a busy machine).
        first = time.monotonic()
        for _ in range(4):
            assert next_stats(sub, 2 * interval) is not None, "a gap of more than 2 intervals"
        assert time.monotonic() - first >= 2.5 * interval, "published faster than the interval"
    finally:
        sub.close()
