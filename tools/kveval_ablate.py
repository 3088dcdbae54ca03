# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval with ad-hoc eviction rows, as used for docs/quality.md "Eviction frontier".

Rows come from the environment, then kveval's own arguments follow:
  ABL_ROWS='name=policy:keep:key=val;key=val|...'   kvctl evict-only rows with extra --set keys
           'name=kvpress:snapkv:keep:interval:window'  kvpress SnapKV at another interval/window
  ABL_DUMP=FILE      each finished batch's results appended as JSON lines (a run killed later
                     keeps them)
  ABL_PROFILE=FILE   reuse a kvcalib profile instead of calibrating (memory-starved machines)
  ABL_MAX_APPEND_BYTES=N  the HF cache's largest APPEND (kvctl.hf_cache._MAX_APPEND_BYTES, 64 MiB):
                     larger sends a long prefill as one APPEND. Since APPEND_CONTINUES (the HF
                     cache flags every chunk but the last) the daemon evicts once either way, so
                     this no longer changes the results; it checks that it does not. Pieces
                     also fit the session's staging slot (8 MiB by default, since session 49):
                     add pool.staging_bytes_per_session=0 to a row's keys for inline pieces
  ABL_ROWS='s=snapkv:0.25:evict.group=max' python3 tools/kveval_ablate.py --rows s --text F ...
It patches kveval's row table and press factory; a rewrite of kveval may break it."""
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kveval, kveval_rows
from kveval_rows import Row, evict

base_all = kveval_rows.all_rows
extra = {}
for spec in filter(None, os.environ.get("ABL_ROWS", "").split("|")):
    name, rest = spec.split("=", 1)
    parts = rest.split(":")
    if parts[0] == "kvpress":
        extra[name] = Row(name, "kvpress", press="%s@%s@%s" % (parts[1], parts[3], parts[4]),
                          keep=float(parts[2]))
        continue
    policy, keep = parts[0], float(parts[1])
    s = evict(policy, keep)
    if len(parts) > 2 and parts[2]:
        for kv in parts[2].split(";"):
            k, v = kv.split("=", 1)
            s[k] = v
    prof = "kivi" if s.get("budget.layer_profile") == "demand" else ""
    extra[name] = Row(name, "kvctl", s, send_q=policy != "streaming", profile=prof, note=rest)

def all_rows():
    r = base_all()
    r.update(extra)
    return r
kveval.all_rows = all_rows

orig_make_press = kveval.make_press
def make_press(name, keep):
    if "@" not in name:
        return orig_make_press(name, keep)
    import kvpress
    press, interval, window = name.split("@")
    cls = {"snapkv": kvpress.SnapKVPress}[press]
    extra_kw = {"window_size": int(window)}
    ratio = 1.0 - keep
    return kvpress.PrefillDecodingPress(
        prefilling_press=cls(compression_ratio=ratio, **extra_kw),
        decoding_press=kvpress.CompressionRatioDecodingPress(
            base_press=cls(**extra_kw), target_compression_ratio=ratio,
            compression_interval=int(interval)))
kveval.make_press = make_press
if os.environ.get("ABL_MAX_APPEND_BYTES"):
    import kvctl.hf_cache
    kvctl.hf_cache._MAX_APPEND_BYTES = int(os.environ["ABL_MAX_APPEND_BYTES"])
import json
if os.environ.get("ABL_PROFILE"):
    # The calibration profile of an earlier identical run (same model, same calibration text):
    # the dump step needs more memory than this shared machine has free.
    kveval.dump_calibration = lambda *a, **k: []
    kveval.fit_profile = lambda args, method, profiles, dumps, workdir: os.environ["ABL_PROFILE"]
_dump = os.environ.get("ABL_DUMP", os.devnull)
def _wrap(fn):
    def inner(self, *a, **k):
        out = fn(self, *a, **k)
        with open(_dump, "a") as f:
            for r in self.results:
                f.write(json.dumps({k2: v for k2, v in r.items() if not k2.startswith("_")}) + "\n")
            f.write("--\n")
        return out
    return inner
kveval.Evaluator.run_kvctl = _wrap(kveval.Evaluator.run_kvctl)
kveval.Evaluator.run_peer = _wrap(kveval.Evaluator.run_peer)
sys.exit(kveval.main(sys.argv[1:]))
