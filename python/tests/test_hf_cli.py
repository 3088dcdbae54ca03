# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kvctl.hf_cli helpers that need no model: the per-thread CPU clock bench_decode reads."""

import os
import threading
import time

import pytest

torch = pytest.importorskip("torch")
from kvctl.hf_cli import process_cpu_seconds  # noqa: E402


def _spin(seconds: float) -> None:
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        pass


def test_process_cpu_seconds_counts_every_thread():
    before = process_cpu_seconds(os.getpid())
    assert before is not None
    worker = threading.Thread(target=_spin, args=(0.05,))
    worker.start()
    _spin(0.05)
    worker.join()
    after = process_cpu_seconds(os.getpid())
    # Both threads' 50 ms; the worker has ended, so only about the main thread's share is sure.
    assert after - before >= 0.045


def test_process_cpu_seconds_of_no_process_is_none():
    assert process_cpu_seconds(2**22 + 12345) is None  # Above Linux's largest pid.
