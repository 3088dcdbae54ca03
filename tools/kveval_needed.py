# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_needed: which context tokens the scored positions of a kveval segment need, and whether
an evicting kvctl row kept them (docs/quality.md, "Which tokens the failing segments need").

For one text and the segments named, with kveval's segmentation (--tokens, --segments,
--scored): (1) the full-precision model (DynamicCache, eager attention) prefills the segment and
steps through the scored positions, keeping each step's attention over the context, averaged over
the query heads of each KV head, [scored, layers, kv_heads, context], and the attention of the
prefix's last --obs queries (what an observation-window scorer sees at the prefill's eviction);
(2) the row runs on a real daemon (one sequence, batch 1, Q sent, dense attention) and after
every scored step the positions each (layer, KV head) attended to (the cache's hold mask, i.e.
what the daemon held) are recorded with the step's NLL. Written: <out>/<label>-seg<i>.npz (the
arrays) for tools/kveval_needed_report.py.

    nice -n 10 python3 tools/kveval_needed.py --text prose --label prose --seg 0,1,2,3 \
        --row evict_rkv_47_turbo_k4v3_f64_obs32_l60 --kvctl-bin /work/main/build/bin/kvctl \
        --out results/q18d-needed
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kveval  # noqa: E402
from kveval_rows import all_rows, pool_settings  # noqa: E402


def reference(torch, model, seg, scored: int, obs: int):
    """Full-precision pass: NLL per scored position, attention [scored, L, H, T] (mean over each
    KV head's query heads) and the prefix's last `obs` queries' attention [L, H, obs, prefix]."""
    from transformers import DynamicCache
    model.set_attn_implementation("eager")
    cfg = model.config
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    total = seg.shape[1]
    prefix = total - scored - 1
    att = np.zeros((scored, cfg.num_hidden_layers, cfg.num_key_value_heads, total), np.float32)
    nll = np.zeros(scored, np.float64)
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        pos = torch.arange(prefix - obs)[None]
        model(seg[:, :prefix - obs], past_key_values=cache, use_cache=True, position_ids=pos,
              logits_to_keep=1)
        out = model(seg[:, prefix - obs:prefix], past_key_values=cache, use_cache=True,
                    position_ids=torch.arange(prefix - obs, prefix)[None], logits_to_keep=1,
                    output_attentions=True)
        obs_att = np.stack([a[0].reshape(cfg.num_key_value_heads, groups, obs, prefix)
                            .mean(1).numpy() for a in out.attentions])
        for t in range(prefix, total - 1):
            out = model(seg[:, t:t + 1], past_key_values=cache, use_cache=True,
                        position_ids=torch.full((1, 1), t), output_attentions=True)
            lp = torch.log_softmax(out.logits[0, -1].float(), -1)
            nll[t - prefix] = -float(lp[int(seg[0, t + 1])])
            for li, a in enumerate(out.attentions):
                att[t - prefix, li, :, :t + 1] = (
                    a[0, :, 0].reshape(cfg.num_key_value_heads, groups, t + 1).mean(1).numpy())
    model.set_attn_implementation("sdpa")
    return nll, att, obs_att


def kvctl_pass(torch, model, seg, scored: int, endpoint: str):
    """The row on its daemon: NLL per scored position and held[scored, L, H, T] (True where the
    (layer, KV head) attended to the position at that step; the step's own token included)."""
    from kvctl.hf import KvctlCache
    cfg = model.config
    total = seg.shape[1]
    prefix = total - scored - 1
    held = np.zeros((scored, cfg.num_hidden_layers, cfg.num_key_value_heads, total), bool)
    nll = np.zeros(scored, np.float64)
    cache = KvctlCache(model, [endpoint], timeout_ms=600000, send_q=[True], attention="dense")
    for layer in cache.layers:
        layer._reserve(total)
    try:
        with torch.no_grad():
            model(seg[:, :prefix], past_key_values=cache, use_cache=True,
                  position_ids=torch.arange(prefix)[None], logits_to_keep=1)
            for t in range(prefix, total - 1):
                logits = model(seg[:, t:t + 1], past_key_values=cache, use_cache=True,
                               position_ids=torch.full((1, 1), t)).logits[0, -1]
                lp = torch.log_softmax(logits.float(), -1)
                nll[t - prefix] = -float(lp[int(seg[0, t + 1])])
                for li, layer in enumerate(cache.layers):
                    if layer.hold_bias is None:
                        held[t - prefix, li, :, :t + 1] = True
                    else:
                        held[t - prefix, li, :, :t] = (layer.hold_bias[0, :, 0, :t] == 0).numpy()
                        held[t - prefix, li, :, t] = True
    finally:
        cache.close()
    model.set_attn_implementation("sdpa")
    return nll, held


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--text", required=True)
    p.add_argument("--label", required=True)
    p.add_argument("--seg", default="0", help="segment indices, comma-separated")
    p.add_argument("--row", required=True, help="a kveval kvctl row name")
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--segments", type=int, default=4)
    p.add_argument("--scored", type=int, default=128)
    p.add_argument("--obs", type=int, default=32, help="observation queries kept at the prefill")
    p.add_argument("--kvctl-bin", default=os.path.join(kveval.REPO, "build", "bin", "kvctl"))
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    import torch
    from kvctl.model import load_smollm2
    torch.set_num_threads(1)
    rows = all_rows()
    if a.row not in rows or rows[a.row].kind != "kvctl":
        print("kveval_needed: --row %s: expected a kvctl row of tools/kveval_rows.py" % a.row,
              file=sys.stderr)
        return 1
    row = rows[a.row]
    model, tok = load_smollm2()
    args = argparse.Namespace(tokens=a.tokens, segments=a.segments, prompt_tokens=a.tokens)
    kveval.prepare_inputs(args, tok, kveval.read_text("--text", a.text))
    cfg = model.config
    fp16 = 2 * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * (
        cfg.hidden_size // cfg.num_attention_heads) * a.tokens
    _, pool = pool_settings(fp16)
    os.makedirs(a.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="kveval-needed-", dir="/tmp")
    for si in [int(x) for x in a.seg.split(",")]:
        seg = args.segments[si]
        t0 = time.perf_counter()
        ref_nll, att, obs_att = reference(torch, model, seg, a.scored, a.obs)
        t1 = time.perf_counter()
        # A fresh daemon per segment, as kveval's sequence per segment starts empty.
        d = kveval.Daemon(a.kvctl_bin, workdir, "%s-%d" % (a.row, si),
                          dict(pool, **row.settings)).start()
        try:
            row_nll, held = kvctl_pass(torch, model, seg, a.scored, d.endpoint)
        finally:
            d.stop()
        path = os.path.join(a.out, "%s-seg%d.npz" % (a.label, si))
        np.savez_compressed(path, ids=seg[0].numpy(), ref_nll=ref_nll, row_nll=row_nll,
                            att=att.astype(np.float16), obs_att=obs_att.astype(np.float16),
                            held=held, row=a.row, start=args.segment_starts[si])
        print("kveval_needed: %s segment %d: reference %.0f s, row %.0f s, dPPL %+.2f %% -> %s"
              % (a.label, si, t1 - t0, time.perf_counter() - t1,
                 100 * (np.exp(row_nll.mean() - ref_nll.mean()) - 1), path), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
