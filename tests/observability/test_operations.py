# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""The operator's side of a real daemon process (docs/operations.md): the SIGHUP reload log, the
systemd notifications, `kvctl --dump-stats`, `kvtop --config`, the HELP text of /metrics, config
errors on the command line, and the shipped systemd unit."""

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import tomllib

import pytest

from obs_helpers import (ROOT, Daemon, Tmux, Traffic, kvctl_bin, kvtop_bin,
                         parse_stats, wait_until)

UNIT = os.path.join(ROOT, "tools", "systemd", "kvctl.service")


def reload_lines(daemon, since):
    """The messages of the "reload: ..." log lines written after byte offset `since`."""
    return [m.group(1) for m in re.finditer(r"\] (reload: .*)$", daemon.log()[since:], re.M)]


def hup(daemon, expect_last, timeout=30):
    """Sends SIGHUP and waits until the reload's last line, `expect_last`, is logged; returns the
    reload lines of this SIGHUP (the daemon writes all of them before that last one)."""
    mark = len(daemon.log())
    daemon.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: expect_last in reload_lines(daemon, mark), timeout,
               "the log line %r (log %s)" % (expect_last, daemon.log_path))
    return reload_lines(daemon, mark)


def append_config(daemon, text):
    with open(daemon.config, "a") as f:
        f.write(text)


def policy(daemon):
    out = subprocess.run([kvtop_bin(), "--config", daemon.config, "--once", "--json",
                          "--timeout-ms", "20000"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["policy"]


def test_sighup_logs_each_changed_key_with_old_and_new_value(daemon):
    assert hup(daemon, "reload: no change") == ["reload: no change"]

    append_config(daemon, "[limits]\nmax_sessions = 8\n[quant]\nk_bits = 4\n")
    lines = hup(daemon, "reload: quant.k_bits 2 -> 4 (applies to sequences opened from now)")
    assert lines == [
        "reload: limits.max_sessions 1024 -> 8 (applies to requests from now)",
        "reload: quant.k_bits 2 -> 4 (applies to sequences opened from now)",
    ]
    assert policy(daemon)["quant_k_bits"] == 4

    # A pool change refuses the whole reload; each key is named with its values.
    with open(daemon.config) as f:
        text = f.read()
    with open(daemon.config, "w") as f:
        f.write(text.replace('bytes = "64MiB"', 'bytes = "128MiB"').replace("k_bits = 4",
                                                                           "k_bits = 8"))
    lines = hup(daemon, "reload: refused; still serving with the previous config")
    assert lines == [
        'reload: refused: pool.bytes "64MiB" -> "128MiB" (fixed while the daemon runs; restart '
        "it to change this key)",
        "reload: not applied: quant.k_bits 4 -> 8 (the reload was refused)",
        "reload: refused; still serving with the previous config",
    ]
    assert policy(daemon)["quant_k_bits"] == 4

    # An invalid file names the key, the value and the allowed set, and nothing else.
    with open(daemon.config, "w") as f:
        f.write(text.replace("k_bits = 4", "k_bits = 5"))
    last = ("reload: refused; still serving with the previous config: quant.k_bits: got 5, "
            "expected one of {2, 3, 4, 8} for kvarn")
    assert hup(daemon, last) == [last]
    assert policy(daemon)["quant_k_bits"] == 4
    assert daemon.stop() == 0


def recv_notify(sock, timeout=30):
    sock.settimeout(timeout)
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.split("\n") if line)


@pytest.mark.parametrize("abstract", [True, False], ids=["abstract", "path"])
def test_sd_notify_ready_reloading_stopping(workdir, abstract):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = "@kvobs-notify-%d" % os.getpid()
        sock.bind("\0" + name[1:])
    else:
        name = os.path.join(workdir, "notify.sock")
        sock.bind(name)
    d = Daemon(workdir, http=False)
    try:
        d.start(env={"NOTIFY_SOCKET": name})
        ready = recv_notify(sock)
        assert ready["READY"] == "1"
        assert ready["STATUS"] == "serving on " + d.endpoint

        d.proc.send_signal(signal.SIGHUP)
        reloading = recv_notify(sock)
        assert reloading["RELOADING"] == "1"
        assert int(reloading["MONOTONIC_USEC"]) > 0
        again = recv_notify(sock)
        assert again["READY"] == "1"
        assert again["STATUS"] == "serving on %s; last reload 0 key(s) changed" % d.endpoint

        d.proc.send_signal(signal.SIGTERM)
        assert recv_notify(sock) == {"STOPPING": "1"}
        assert d.proc.wait(30) == 0
    finally:
        d.close()
        sock.close()


def test_logs_go_to_stderr_one_line_per_event(workdir):
    d = Daemon(workdir, http=False)
    out_path, err_path = os.path.join(workdir, "out.log"), os.path.join(workdir, "err.log")
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen([kvctl_bin(), "--config", d.config], stdout=out, stderr=err)

    def read(path):
        with open(path) as f:
            return f.read()
    try:
        wait_until(lambda: "serving on" in read(err_path) or proc.poll() is not None, 30,
                   "kvctl to serve")
        line = [x for x in read(err_path).split("\n") if "serving on" in x][0]
        assert re.fullmatch(r"\[[0-9-]+ [0-9:.]+\] \[info\] kvctl \S+ serving on %s .*"
                            % re.escape(d.endpoint), line)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
        assert read(out_path) == ""  # stdout stays free for --print-config and --dump-stats.
        assert read(err_path).endswith("[info] stopped cleanly\n")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        d.close()


def test_dump_stats_shows_the_daemons_own_config_and_one_snapshot(workdir):
    d = Daemon(workdir)
    try:
        # The environment only the daemon has: the dump must show the daemon's config, not its
        # own resolution of the file.
        d.start(env={"KVCTL_QUANT_K_BITS": "4"})
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVCTL_")}
        out = subprocess.run([kvctl_bin(), "--dump-stats", "--config", d.config,
                              "--timeout-ms", "20000"], capture_output=True, text=True, timeout=60,
                             env=env)
        assert out.returncode == 0, out.stderr
        assert out.stderr == ""
        head, config_part = out.stdout.split(
            "\n# ---- The daemon's effective config (STATS section \"config\")\n")
        config_text, stats_text = config_part.split("\n# ---- STATS\n")
        lines = head.split("\n")
        assert lines[0].startswith("# kvctl --dump-stats: a support snapshot of the daemon on %s, "
                                   "taken 20" % d.endpoint)
        assert lines[1] == "# this tool: kvctl 0.1.0, protocol 1"
        assert re.fullmatch(r"# daemon: kvctl 0\.1\.0, protocol 1, pid %d, up \d+ s" % d.pid,
                            lines[2])
        config = tomllib.loads(config_text)
        assert config["quant"]["k_bits"] == 4
        assert config["server"]["endpoint"] == d.endpoint
        assert re.search(r"^k_bits = 4 +# env$", config_text, re.M)
        stats = parse_stats(stats_text)
        assert stats["server"]["pid"] == str(d.pid)
        assert stats["policy"]["quant_k_bits"] == "4"
    finally:
        d.close()


def test_dump_stats_without_a_daemon_names_the_endpoint_and_what_to_check(workdir):
    missing = "ipc://%s/nobody.sock" % workdir
    out = subprocess.run([kvctl_bin(), "--dump-stats", "--set", "server.endpoint=" + missing,
                          "--timeout-ms", "300"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert out.stdout == ""
    assert out.stderr.startswith(
        "kvctl: --dump-stats: no kvctl daemon answered on %s within 300 ms: the socket file "
        "%s/nobody.sock does not exist" % (missing, workdir))
    assert "Check that the daemon runs" in out.stderr

    # A socket file nobody listens on (a daemon that died) is told apart.
    stale = os.path.join(workdir, "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)
    s.close()
    out = subprocess.run([kvctl_bin(), "--dump-stats", "--set", "server.endpoint=ipc://" + stale,
                          "--timeout-ms", "300"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert ("the socket file %s exists but nothing accepts connections on it" % stale
            in out.stderr)


def test_kvtop_config_reads_both_endpoints_from_the_daemons_file(daemon, workdir):
    out = subprocess.run([kvtop_bin(), "--config", daemon.config, "--once", "--json",
                          "--timeout-ms", "20000"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["server"]["pid"] == daemon.pid

    # A flag on the command line still wins over the file.
    nobody = "ipc://%s/nobody.sock" % workdir
    out = subprocess.run([kvtop_bin(), "--config", daemon.config, "--endpoint", nobody, "--once",
                          "--timeout-ms", "300"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert out.stderr.startswith("kvtop: kvctl not reachable at %s" % nobody)

    out = subprocess.run([kvtop_bin(), "--config", os.path.join(workdir, "none.toml"), "--once"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1
    assert out.stderr.startswith("kvtop: --config: ") and "none.toml" in out.stderr


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_kvtop_config_follows_the_stats_stream(daemon):
    tmux = Tmux("%s --config %s" % (kvtop_bin(), daemon.config), 100, 30, name="kvtop-config")
    try:
        screen = tmux.wait_screen(lambda s: "live" in s and "pid %d" % daemon.pid in s, 30,
                                  "kvtop --config to show the live stream")
        assert daemon.endpoint in screen
    finally:
        tmux.close()


def test_metrics_help_texts_are_sentences(daemon):
    pytest.importorskip("prometheus_client")
    from prometheus_client.parser import text_string_to_metric_families
    import urllib.request
    traffic = Traffic(daemon, sequences=1, layers=2, heads=2, prefill=256, hold_s=20)
    try:
        traffic.start()
        with urllib.request.urlopen(daemon.url("/metrics"), timeout=10) as r:
            text = r.read().decode()
    finally:
        traffic.close()
    families = list(text_string_to_metric_families(text))
    assert len(families) >= 100
    for family in families:
        help_line = re.search(r"^# HELP %s(?:_total)? (.*)$" % family.name, text, re.M).group(1)
        assert help_line == family.documentation
        assert family.documentation not in (family.name, family.name + "_total")
        assert len(family.documentation.split()) >= 4, family.name
        assert not re.match(r"kvctl \w+: ", family.documentation), family.name  # Placeholder.


def test_a_bad_width_on_the_command_line_names_only_what_is_known():
    for args in (["--k-bits", "5"], ["--set", "quant.k_bits=5"]):
        out = subprocess.run([kvctl_bin()] + args + ["--print-config"], capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 1
        assert out.stdout == ""
        assert out.stderr == "kvctl: quant.k_bits: got 5, expected one of {2, 3, 4, 8} for kvarn\n"


def test_the_systemd_unit_verifies_and_its_command_line_is_accepted(workdir):
    with open(UNIT) as f:
        unit = f.read()
    service = dict(re.findall(r"^(\w+)=(.*)$", unit.split("[Service]")[1].split("[Install]")[0],
                              re.M))
    assert service["Type"] == "notify"
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    argv = shlex.split(service["ExecStart"])
    assert argv[:2] == ["/usr/local/bin/kvctl", "--config"]
    # The same flags with the built binary and the default config (the install copies it).
    argv = [kvctl_bin()] + [os.path.join(ROOT, "configs", "default.toml") if a.endswith(".toml")
                            else a for a in argv[1:]]
    out = subprocess.run(argv + ["--print-config"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    copy = os.path.join(workdir, "kvctl.service")
    with open(copy, "w") as f:
        f.write(unit.replace("/usr/local/bin/kvctl", kvctl_bin()))
    out = subprocess.run(["systemd-analyze", "verify", copy], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and out.stderr == "" and out.stdout == "", out.stderr + out.stdout


def test_configs_readme_lists_the_short_flags_kvctl_has():
    out = subprocess.run([kvctl_bin(), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    flags = set(re.findall(r"^\s+(--[a-z-]+) \S+\s+Sets [a-z_]+\.[a-z_]+ ", out.stdout, re.M))
    with open(os.path.join(ROOT, "configs", "README.md")) as f:
        readme = f.read()
    bullet = re.search(r"have short flags too\s+\((.*?)\)", readme, re.S).group(1)
    listed = set(re.findall(r"`(--[a-z-]+)`", bullet))
    assert len(flags) == 9 and flags == listed, (flags, listed)


def test_under_the_journal_lines_carry_a_priority_instead_of_a_time(workdir):
    d = Daemon(workdir, http=False)
    err_path = os.path.join(workdir, "journal.log")
    with open(err_path, "w") as err:
        st = os.fstat(err.fileno())
        env = dict(os.environ, JOURNAL_STREAM="%d:%d" % (st.st_dev, st.st_ino))
        proc = subprocess.Popen([kvctl_bin(), "--config", d.config], stdout=subprocess.DEVNULL,
                                stderr=err, env=env)

    def read():
        with open(err_path) as f:
            return f.read()
    try:
        wait_until(lambda: "serving on" in read() or proc.poll() is not None, 30, "kvctl to serve")
        assert re.search(r"^<6>\[info\] kvctl \S+ serving on %s " % re.escape(d.endpoint), read(),
                         re.M)
        with open(d.config) as f:
            text = f.read()
        with open(d.config, "w") as f:
            f.write(text.replace('bytes = "64MiB"', 'bytes = "1GiB"'))
        proc.send_signal(signal.SIGHUP)
        wait_until(lambda: "<3>[error] reload: refused; still serving with the previous config\n"
                   in read(), 30, "the refused reload")
        assert '<3>[error] reload: refused: pool.bytes "64MiB" -> "1GiB"' in read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        d.close()
