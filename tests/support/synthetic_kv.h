// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/support/synthetic_kv.h
// A generator of LLM-like K, V and Q for benchmarks and tests when no real dump is at hand: keys
// with a few outlier channels carrying large per-channel offsets, rotated by RoPE with the token
// position (so per-channel statistics drift along the sequence, as after RoPE in real models), a
// low-norm first token (the attention sink), heavy-tailed values (Student-t, 4 degrees of freedom)
// and queries that share the keys' channel structure. Deterministic for a given seed.
//
// Thread safety: pure function.
//
//   SyntheticKv kv = GenerateSyntheticKv({.tokens = 4096, .heads = 8, .head_dim = 128});
//   KvTensorView k = kv.KView();
#ifndef KVCTL_TESTS_SUPPORT_SYNTHETIC_KV_H_
#define KVCTL_TESTS_SUPPORT_SYNTHETIC_KV_H_

#include <cstdint>
#include <vector>

#include "common/tensor.h"

namespace kvctl {

struct SyntheticKvOptions {
  int64_t tokens = 1024;
  int heads = 8;
  int head_dim = 128;
  int q_heads = 0;              // 0: same as heads.
  int outlier_channels = 4;     // Per head, in K.
  float outlier_scale = 12.0f;  // Spread and offset of outlier channels relative to the rest.
  float sink_norm_scale = 0.05f;
  uint64_t seed = 1;
};

struct SyntheticKv {
  int64_t tokens = 0;
  int heads = 0, q_heads = 0, head_dim = 0;
  std::vector<float> k, v, q;  // Dense [tokens, heads (q_heads for q), head_dim].

  KvTensorView KView() const;
  KvTensorView VView() const;
  KvTensorView QView() const;
};

SyntheticKv GenerateSyntheticKv(const SyntheticKvOptions& options);

}  // namespace kvctl

#endif  // KVCTL_TESTS_SUPPORT_SYNTHETIC_KV_H_
