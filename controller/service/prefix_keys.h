// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/prefix_keys.h
// How stored prefixes are named and packed in the cluster tier (docs/tier.md "Prefixes").
//
// Names: a block-hash chain over token ids, as vLLM's prefix caching names its blocks. The chain
// starts from a digest of what makes two caches interchangeable (the key prefix, the model name,
// the KV geometry and dtype, the block size) and each block of block_tokens ids extends it:
//   h_0 = SHA-256("kvctl-prefix-v1" | key_prefix | model | layers | kv_heads | head_dim | dtype |
//                 block_tokens)
//   h_i = SHA-256(h_{i-1} | ids of block i as little-endian int32)
// and the prefix of the first i blocks is stored under "KEY_PREFIX:p:" + hex(h_i). Equal token
// prefixes therefore meet under one key across sequences, daemons and nodes, and a prompt's
// stored prefixes are found by computing its chain and asking which keys exist.
//
// Values: "KVPF", a version, the token ids the prefix holds (checked against the prompt on
// restore, so even a hash collision cannot hand one prompt another's cache), a CRC32C of the
// header and ids, then the sequence image (controller/sequence/sequence_image.h, checksummed on
// its own).
//
// Thread safety: pure functions.
#ifndef KVCTL_CONTROLLER_SERVICE_PREFIX_KEYS_H_
#define KVCTL_CONTROLLER_SERVICE_PREFIX_KEYS_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/status.h"
#include "ipc/messages.h"

namespace kvctl {

struct PrefixNamespace {
  std::string key_prefix;  // tier.key_prefix
  std::string model_name;  // From HELLO.
  ipc::Geometry geometry;  // q_heads is not part of it: nothing stored depends on Q.
  int block_tokens = 16;   // tier.prefix_block_tokens, >= 1.
};

// The keys of tokens' prefixes of 1, 2, ... floor(size / block_tokens) blocks, in that order.
std::vector<std::string> PrefixKeys(const PrefixNamespace& ns, std::span<const int32_t> tokens);

// The stored value of a prefix: the header, `tokens` and `image`.
std::vector<uint8_t> EncodePrefixValue(std::span<const int32_t> tokens,
                                       std::span<const uint8_t> image);

struct PrefixValue {
  std::vector<int32_t> tokens;
  std::span<const uint8_t> image;  // Into the value passed to DecodePrefixValue.
};
// DATA_LOSS naming what is wrong (magic, version, sizes, checksum) for a value that is not one
// EncodePrefixValue wrote.
StatusOr<PrefixValue> DecodePrefixValue(std::span<const uint8_t> value);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_PREFIX_KEYS_H_
