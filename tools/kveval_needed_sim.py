# Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
"""kveval_needed_sim: would a different observation window (or pooling kernel) at the prefill's
eviction keep the tokens a segment's continuation needs? An offline simulation in full precision,
not the daemon (docs/quality.md, "Which tokens the failing segments need").

For a tools/kveval_needed.py file (<label>-seg<i>.npz): the prefix's last --max-obs queries'
attention is computed once (the rows of the last W queries do not depend on W). Per variant
(W observation queries, W newest tokens protected, 4 sinks, pooling kernel k), each (layer, KV
head) keeps the sinks, the window and the top of the pooled window score (mean over the group's
query heads and the queries, softmax over every causal key, max-pooled) among the candidates
before the window, as many tokens in all as the daemon's row held at the first scored step (so
the same budget). Then the scored positions are stepped in full precision with attention masked
to that kept set (plus every token appended after the prefill; the daemon's compressions during
the 128 steps and its quantization are not simulated) and dPPL against full precision is
printed. --daemon-mask also runs the daemon's own hold masks of every step (eviction only, no
quantization) as a check of what the simulation leaves out.

    nice -n 10 python3 tools/kveval_needed_sim.py results/q18d-needed/prose-seg0.npz \
        --variants 32:7,128:7,256:7 --daemon-mask
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "python"))

_BIAS = {}   # layer -> [1, kv_heads, 1, T] float bias (0 kept, -inf dropped) of this step.
IMPL = "kveval_needed_mask"


def _masked_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      is_causal=None, **kwargs):
    import torch
    bias = _BIAS[module.layer_idx]
    groups = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(groups, 1)
    v = value.repeat_interleave(groups, 1)
    b = bias.repeat_interleave(groups, 1)[..., :k.shape[2]].to(query.dtype)
    out = torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=b,
                                                           scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register():
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
    AttentionInterface.register(IMPL, _masked_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPL, sdpa_mask)


def obs_attention(torch, model, ids, prefix: int, w: int):
    """[L, H, w, prefix]: the last w prefix queries' attention, mean over each group."""
    from transformers import DynamicCache
    cfg = model.config
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    model.set_attn_implementation("eager")
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        model(ids[:, :prefix - w], past_key_values=cache, use_cache=True,
              position_ids=torch.arange(prefix - w)[None], logits_to_keep=1)
        out = model(ids[:, prefix - w:prefix], past_key_values=cache, use_cache=True,
                    position_ids=torch.arange(prefix - w, prefix)[None], logits_to_keep=1,
                    output_attentions=True)
    return np.stack([a[0].reshape(cfg.num_key_value_heads, groups, w, prefix).mean(1).numpy()
                     for a in out.attentions])


def pooled_window_score(obs, w: int, kernel: int) -> np.ndarray:
    """[L, H, prefix - w]: the last w queries' mean attention on each candidate, max-pooled."""
    cand = obs.shape[-1] - w
    score = obs[:, :, -w:, :cand].mean(2)
    pad = kernel // 2
    padded = np.pad(score, ((0, 0), (0, 0), (pad, pad)), constant_values=-1)
    return np.max(np.stack([padded[:, :, k:k + cand] for k in range(kernel)]), 0)


def simulated_keep(obs, w: int, kernel: int, keep: int, sinks: int = 4):
    """[L, H, prefix] bool: sinks + the w newest + the top of the pooled score, keep in all."""
    L, H, _, prefix = obs.shape
    cand = prefix - w
    pooled = pooled_window_score(obs, w, kernel)
    pooled[:, :, :sinks] = -2
    kept = np.zeros((L, H, prefix), bool)
    kept[:, :, :sinks] = True
    kept[:, :, cand:] = True
    n = max(0, keep - sinks - w)
    top = np.argsort(-pooled, -1)[:, :, :n]
    np.put_along_axis(kept, top, True, -1)
    return kept


def masked_nll(torch, model, ids, prefix: int, scored: int, masks):
    """NLL per scored position with step i attending to masks(i) -> [L, H, T] bool."""
    from transformers import DynamicCache
    cfg = model.config
    cache = DynamicCache(config=cfg)
    nll = np.zeros(scored)
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        model(ids[:, :prefix], past_key_values=cache, use_cache=True,
              position_ids=torch.arange(prefix)[None], logits_to_keep=1)
        model.set_attn_implementation(IMPL)
        for i in range(scored):
            t = prefix + i
            m = torch.from_numpy(masks(i))
            for li in range(cfg.num_hidden_layers):
                b = torch.zeros(1, cfg.num_key_value_heads, 1, t + 1)
                b[0, :, 0, :t + 1] = torch.where(m[li, :, :t + 1], 0.0, float("-inf"))
                b[0, :, 0, t] = 0.0
                _BIAS[li] = b
            logits = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True,
                           position_ids=torch.full((1, 1), t)).logits[0, -1]
            nll[i] = -float(torch.log_softmax(logits.float(), -1)[int(ids[0, t + 1])])
    model.set_attn_implementation("sdpa")
    return nll


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("npz")
    p.add_argument("--variants", default="32:7,128:7,256:7",
                   help="W:kernel pairs (W observation queries = protected window)")
    p.add_argument("--daemon-mask", action="store_true")
    p.add_argument("--rank-only", action="store_true",
                   help="no masked runs: only how each variant ranks the needed positions")
    a = p.parse_args(argv)
    import torch
    from kvctl.model import load_smollm2
    torch.set_num_threads(1)
    register()
    z = np.load(a.npz)
    ids = torch.from_numpy(z["ids"].astype(np.int64))[None]
    held, ref = z["held"], z["ref_nll"]
    att = z["att"].astype(np.float32)
    scored, L, H, T = held.shape
    prefix = T - scored - 1
    keep = int(round(held[0, :, :, :prefix].sum((-1)).mean()))
    d = z["row_nll"] - ref
    worst = np.argsort(-d)[:16]
    variants = [tuple(int(x) for x in v.split(":")) for v in a.variants.split(",")]
    model, _ = load_smollm2()
    obs = obs_attention(torch, model, ids, prefix, max(w for w, _ in variants))

    def dppl(nll):
        return 100 * (np.exp(nll.mean() - ref.mean()) - 1)

    print("%s: %d kept per (layer, head) at the first scored step; row dPPL %+.2f %%"
          % (a.npz, keep, dppl(z["row_nll"])))
    if a.daemon_mask:
        nll = masked_nll(torch, model, ids, prefix, scored, lambda i: held[i])
        print("  daemon's hold masks, full precision: dPPL %+.2f %% (worst-16 steps of the row: "
              "loss +%.2f nats of the row's +%.2f)" % (dppl(nll), (nll - ref)[worst].sum(),
                                                       d[worst].sum()))
    # Needed: every (layer, head, prefix position) weighted by the full-precision attention the
    # row's 16 worst steps give it (not only the ones the daemon dropped: that would favour any
    # variant unlike the daemon's own choice).
    need = att[worst][:, :, :, :prefix].sum(0)
    allm = att[:, :, :, :prefix].sum(0)
    print("  daemon (first scored step's kept set): worst-16 needed attention kept %.1f %%, all "
          "steps %.1f %%" % (100 * (need * held[0, :, :, :prefix]).sum() / need.sum(),
                              100 * (allm * held[0, :, :, :prefix]).sum() / allm.sum()))
    for w, k in variants:
        kept = simulated_keep(obs, w, k, keep)
        print("  W %d kernel %d: worst-16 needed attention kept %.1f %%, all steps %.1f %%"
              % (w, k, 100 * (need * kept).sum() / need.sum(),
                 100 * (allm * kept).sum() / allm.sum()), flush=True)
        if a.rank_only:
            continue
        full = np.ones((L, H, T), bool)
        full[:, :, :prefix] = kept
        lost = (att[:, :, :, :prefix] * ~kept[None]).sum(-1).mean()
        agree = (kept & held[0, :, :, :prefix]).sum() / held[0, :, :, :prefix].sum()
        nll = masked_nll(torch, model, ids, prefix, scored, lambda i: full)
        print("  W %d kernel %d: dPPL %+.2f %%; worst-16 steps +%.2f nats; attention mass lost "
              "%.3f; overlap with the daemon's kept set %.2f"
              % (w, k, dppl(nll), (nll - ref)[worst].sum(), lost, agree), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
