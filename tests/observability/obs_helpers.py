# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Real processes for the observability tests and the docs capture: a kvctl daemon on private
endpoints, the obs_traffic client, kvtop inside a private tmux server.

Binaries come from KVCTL_BIN, KVTOP_BIN, KVDEMO_BIN and OBS_TRAFFIC_BIN (CTest sets them), or else
from build/bin and build/tests of the source tree.
"""

import os
import re
import select
import shutil
import signal
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def binary(env, name, folder="bin"):
    path = os.environ.get(env) or os.path.join(ROOT, "build", folder, name)
    if not os.access(path, os.X_OK):
        raise RuntimeError("%s not found at %s (set %s or build it)" % (name, path, env))
    return path


def kvctl_bin():
    return binary("KVCTL_BIN", "kvctl")


def kvtop_bin():
    return binary("KVTOP_BIN", "kvtop")


def kvdemo_bin():
    return binary("KVDEMO_BIN", "kvdemo")


def traffic_bin():
    return binary("OBS_TRAFFIC_BIN", "obs_traffic", "tests")


def wait_until(predicate, timeout, what, poll=0.1):
    """Calls predicate() until it returns something truthy, which is returned; raises after
    `timeout` seconds naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError("timed out after %.1f s waiting for %s" % (timeout, what))
        time.sleep(poll)


class Daemon:
    """A kvctl daemon with its own socket files, shm name and loopback HTTP port."""

    def __init__(self, workdir, name="d", interval_ms=200, http=True, pool_bytes="64MiB",
                 pool_extra=""):
        self.dir = workdir
        self.endpoint = "ipc://%s/kvctl.sock" % workdir
        self.stats_endpoint = "ipc://%s/stats.sock" % workdir
        self.interval_ms = interval_ms
        self.shm_name = "/kvobs-%d-%s" % (os.getpid(), name)
        self.config = os.path.join(workdir, name + ".toml")
        self.log_path = os.path.join(workdir, name + ".log")
        self.proc = None
        self.http_port = None
        with open(self.config, "w") as f:
            f.write('[server]\nendpoint = "%s"\nstats_endpoint = "%s"\n' %
                    (self.endpoint, self.stats_endpoint))
            f.write('stats_interval_ms = %d\nlog_level = "info"\n' % interval_ms)
            if http:
                f.write('http_address = "127.0.0.1:0"\n')
            f.write('[pool]\nshm_name = "%s"\nbytes = "%s"\nunlink_stale = true\n%s\n' %
                    (self.shm_name, pool_bytes, pool_extra))

    def start(self, timeout=15, env=None):
        """Starts `kvctl --config FILE` (with `env` added to the environment) and waits until its
        log says it serves."""
        log = open(self.log_path, "a")
        start = log.tell()
        self.proc = subprocess.Popen([kvctl_bin(), "--config", self.config], stdout=log,
                                     stderr=subprocess.STDOUT, env=dict(os.environ, **(env or {})))
        log.close()

        def serving():
            if self.proc.poll() is not None:
                raise AssertionError("kvctl exited with %s at start:\n%s" %
                                     (self.proc.returncode, self.log()))
            text = self.log()[start:]
            return "serving on" in text and text
        text = wait_until(serving, timeout, "kvctl to serve (log %s)" % self.log_path)
        m = re.search(r"metrics on http://127\.0\.0\.1:(\d+)/metrics", text)
        self.http_port = int(m.group(1)) if m else None
        return self

    def log(self):
        with open(self.log_path) as f:
            return f.read()

    @property
    def pid(self):
        return self.proc.pid

    def stop(self, sig=signal.SIGTERM, timeout=10):
        """Signals the daemon and waits; returns its exit code."""
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        shm = "/dev/shm" + self.shm_name
        if os.path.exists(shm):
            os.unlink(shm)

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.http_port, path)


class Traffic:
    """obs_traffic against a daemon; start() returns once its sequences hold their prefill."""

    def __init__(self, daemon, **options):
        args = [traffic_bin(), "--endpoint", daemon.endpoint]
        for key, value in options.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                args.append(flag)
            elif value is not False:
                args += [flag, str(value)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)

    def _line(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        return self.proc.stdout.readline()

    def wait_for(self, word, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self._line(max(0.0, deadline - time.monotonic()))
            if line is None:
                break
            if line == "" and self.proc.poll() is not None:
                raise AssertionError("obs_traffic exited %s: %s" %
                                     (self.proc.returncode, self.proc.stderr.read()))
            if line.startswith(word):
                return line
        raise AssertionError("obs_traffic did not print %r within %s s" % (word, timeout))

    def start(self, timeout=20):
        self.wait_for("ready", timeout)
        return self

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.proc.stdout.close()
        self.proc.stderr.close()


class Tmux:
    """One command in a detached pane of a private tmux server (its own socket, no config). The
    pane's shell writes the command's exit status to a file: tmux itself can take seconds to reap
    a pane's process and report it."""

    def __init__(self, command, width, height, name="kvtop"):
        if shutil.which("tmux") is None:
            raise RuntimeError("tmux is not installed (tools/setup.sh installs it)")
        self.socket = "kvobs-%d-%s" % (os.getpid(), name)
        env = dict(os.environ, LANG="C.UTF-8", LC_ALL="C.UTF-8")
        env.pop("TMUX", None)
        self.env = env
        self.status_file = tempfile.mktemp(prefix="kvobs-status-", dir="/tmp")
        self._tmux("-f", "/dev/null", "new-session", "-d", "-s", "main", "-x", str(width), "-y",
                   str(height), "%s; echo $? > %s" % (command, self.status_file))
        self._tmux("set-option", "-t", "main", "remain-on-exit", "on")

    def _tmux(self, *args):
        return subprocess.run(["tmux", "-L", self.socket] + list(args), env=self.env, check=True,
                              capture_output=True, text=True).stdout

    def screen(self, escapes=False):
        args = ["capture-pane", "-p", "-t", "main"] + (["-e"] if escapes else [])
        return self._tmux(*args)

    def keys(self, *keys):
        self._tmux("send-keys", "-t", "main", *keys)

    def wait_screen(self, predicate, timeout, what):
        """Waits until predicate(screen text) holds; returns the screen. On timeout the error
        shows the last screen."""
        last = [""]

        def check():
            last[0] = self.screen()
            return predicate(last[0])
        try:
            wait_until(check, timeout, what, poll=0.2)
        except AssertionError as e:
            raise AssertionError("%s; screen:\n%s" % (e, last[0])) from None
        return last[0]

    def pane(self):
        """(dead, pid) of the pane's shell, which lives exactly as long as the command."""
        out = self._tmux("list-panes", "-t", "main", "-F", "#{pane_dead} #{pane_pid}").split()
        return out[0] == "1", int(out[1])

    def exit_status(self):
        """The command's exit status as text ("0"), or None while it runs."""
        try:
            with open(self.status_file) as f:
                return f.read().strip() or None
        except FileNotFoundError:
            return None

    def close(self):
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], env=self.env,
                       capture_output=True)
        if os.path.exists(self.status_file):
            os.unlink(self.status_file)


def kvtop_command(daemon, *extra):
    return " ".join([kvtop_bin(), "--stats-endpoint", daemon.stats_endpoint, "--endpoint",
                     daemon.endpoint] + list(extra))


def make_workdir():
    # Short paths: ipc:// socket paths are limited to about 100 bytes.
    return tempfile.mkdtemp(prefix="kvobs-", dir="/tmp")


def parse_stats(text):
    """The daemon's STATS text as {section: {field: value}}, entity lines as {k: v} dicts; an
    implementation separate from kvtop's so the tests compare two readings of the same text."""
    out, section = {}, None
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("#"):
            section = out.setdefault(line.lstrip("# ").lower(), {})
            continue
        key, _, value = line.partition(":")
        if re.fullmatch(r"[a-z]+(_\d+)+", key) and "=" in value:
            section[key] = dict(kv.split("=", 1) for kv in value.split(","))
        else:
            section[key] = value
    return out
