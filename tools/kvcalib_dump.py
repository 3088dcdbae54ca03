# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""Calibration dumps of the real SmolLM2-135M for `kvcalib fit --input`: post-RoPE K, V and Q of
every layer for consecutive 256-token windows of a text, in kvcalib's dump layout
(docs/kvcalib.md), float16. The capture is kveval's (tools/kveval_calib.py), so a profile made
from these dumps is the one kveval would fit on the same text.

    python3 tools/kvcalib_dump.py --text configs/profiles/calibration-text.txt --out /tmp/calib
    build/bin/kvcalib fit --input /tmp/calib/seq_* --method kivi --out profile.toml

Exit status 0 ok; 1 bad input (missing text, too short) or the model stack is not installed.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TQDM_DISABLE", "1")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kveval_calib import dump_calibration  # noqa: E402
from kveval_rows import EvalError  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--text", required=True, help="calibration text (UTF-8)")
    p.add_argument("--out", required=True, help="output folder: OUT/seq_<s>/layer_<l>/")
    p.add_argument("--seq-tokens", type=int, default=256, help="tokens per sequence")
    p.add_argument("--sequences", type=int, default=8, help="at most this many windows")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    args = p.parse_args(argv)
    try:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        print("kvcalib_dump: --text: %s" % e, file=sys.stderr)
        return 1
    try:
        import torch
        from kvctl.model import load_smollm2
    except ImportError as e:
        print("kvcalib_dump: missing Python package: %s (tools/setup.sh installs "
              "python/requirements-model.txt)" % e.name, file=sys.stderr)
        return 1
    torch.set_num_threads(args.threads)
    model, tok = load_smollm2()
    try:
        dirs = dump_calibration(torch, model, tok, text, args.out, args.seq_tokens,
                                args.sequences)
    except EvalError as e:
        print("kvcalib_dump: %s" % e, file=sys.stderr)
        return 1
    tokens = tok(text, return_tensors="pt").input_ids.shape[1]
    print("kvcalib_dump: %d sequences x %d tokens of %s (%d tokens) in %s"
          % (len(dirs), args.seq_tokens, args.text, tokens, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
