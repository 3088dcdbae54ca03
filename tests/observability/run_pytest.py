# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""CTest entry point for the observability pytest suite; exits 77 (CTest SKIP_RETURN_CODE) when
pytest or pyzmq is missing (tools/setup.sh installs python/ and tools/requirements.txt). Tests
that need tmux or prometheus_client skip themselves when those are missing.

    python3 tests/observability/run_pytest.py [pytest args...]
"""

import importlib.util
import os
import sys

missing = [m for m in ("zmq", "pytest") if importlib.util.find_spec(m) is None]
if missing:
    print("kvctl observability tests skipped: missing %s (tools/setup.sh installs them)"
          % ", ".join(missing))
    sys.exit(77)

sys.dont_write_bytecode = True  # Keep the source tree clean.
import pytest  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--rootdir", here, here] + sys.argv[1:]))
