// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/sha256.h
// SHA-256 (FIPS 180-4), incremental. The cluster tier names stored prefixes by a chain of these
// digests over token ids (controller/service/prefix_keys.h): keys shared by every daemon of a
// deployment, so a collision must be infeasible even for a client choosing its tokens, which a
// non-cryptographic hash does not give. Not constant-time; nothing secret is hashed.
//
// Thread safety: a Sha256 object is not synchronized; use one per thread.
//
//   Sha256 h;
//   h.Update(bytes);
//   Sha256::Digest d = h.Finish();
#ifndef KVCTL_COMMON_SHA256_H_
#define KVCTL_COMMON_SHA256_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace kvctl {

class Sha256 {
 public:
  using Digest = std::array<uint8_t, 32>;

  Sha256();
  void Update(std::span<const uint8_t> bytes);
  void Update(const void* data, size_t size) {
    Update(std::span<const uint8_t>(static_cast<const uint8_t*>(data), size));
  }
  // The digest of everything updated so far; the object must not be used afterwards.
  Digest Finish();

  // One-shot helpers.
  static Digest Of(std::span<const uint8_t> bytes);
  static std::string Hex(std::span<const uint8_t> digest);

 private:
  void Block(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace kvctl

#endif  // KVCTL_COMMON_SHA256_H_
