# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kvctl.hf: the HF transformers adapter. KvctlCache (kvctl/hf_cache.py) is a transformers Cache
whose layers live in the kvctl daemon; `python3 -m kvctl.hf` runs the demo and the decode
benchmark (kvctl/hf_cli.py). Both import the cache from kvctl.hf_cache, never this module, so
running it as __main__ loads the cache (and registers its attention function) once.

    from kvctl.hf import KvctlCache
    cache = KvctlCache(model, "ipc:///tmp/kvctl.sock")
"""

from .hf_cache import ATTN_IMPLEMENTATION, KvctlCache, KvctlLayer

__all__ = ["ATTN_IMPLEMENTATION", "KvctlCache", "KvctlLayer"]

if __name__ == "__main__":
    from .hf_cli import main

    raise SystemExit(main())
