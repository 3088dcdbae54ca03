// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/prefix_keys.h"

#include <cstring>

#include "common/crc32c.h"
#include "common/sha256.h"

namespace kvctl {
namespace {

constexpr uint32_t kPrefixMagic = 0x4650564B;  // "KVPF" little-endian.
constexpr uint16_t kPrefixVersion = 1;
// magic u32, version u16, reserved u16, tokens u64, crc32c u32 of header (crc zeroed) and ids.
constexpr size_t kHeaderBytes = 4 + 2 + 2 + 8 + 4;

void PutLe(std::vector<uint8_t>* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<uint8_t>(value >> (8 * i)));
}

uint64_t GetLe(const uint8_t* p, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{p[i]} << (8 * i);
  return value;
}

void HashLe(Sha256* h, uint64_t value, int bytes) {
  uint8_t b[8];
  for (int i = 0; i < bytes; ++i) b[i] = static_cast<uint8_t>(value >> (8 * i));
  h->Update(b, bytes);
}

void HashString(Sha256* h, const std::string& s) {
  HashLe(h, s.size(), 4);  // Length first, so ("ab", "c") and ("a", "bc") differ.
  h->Update(s.data(), s.size());
}

}  // namespace

std::vector<std::string> PrefixKeys(const PrefixNamespace& ns, std::span<const int32_t> tokens) {
  Sha256 root;
  root.Update("kvctl-prefix-v1", 15);
  HashString(&root, ns.key_prefix);
  HashString(&root, ns.model_name);
  HashLe(&root, ns.geometry.layers, 4);
  HashLe(&root, ns.geometry.kv_heads, 4);
  HashLe(&root, ns.geometry.head_dim, 4);
  HashLe(&root, static_cast<uint8_t>(ns.geometry.dtype), 1);
  HashLe(&root, static_cast<uint32_t>(ns.block_tokens), 4);
  Sha256::Digest chain = root.Finish();
  const size_t block = static_cast<size_t>(ns.block_tokens);
  std::vector<std::string> keys;
  keys.reserve(tokens.size() / block);
  std::vector<uint8_t> ids(block * 4);
  for (size_t start = 0; start + block <= tokens.size(); start += block) {
    for (size_t i = 0; i < block; ++i) {
      const auto id = static_cast<uint32_t>(tokens[start + i]);
      for (int b = 0; b < 4; ++b) ids[4 * i + b] = static_cast<uint8_t>(id >> (8 * b));
    }
    Sha256 link;
    link.Update(chain);
    link.Update(ids);
    chain = link.Finish();
    keys.push_back(ns.key_prefix + ":p:" + Sha256::Hex(chain));
  }
  return keys;
}

std::vector<uint8_t> EncodePrefixValue(std::span<const int32_t> tokens,
                                       std::span<const uint8_t> image) {
  std::vector<uint8_t> out;
  out.reserve(kHeaderBytes + tokens.size() * 4 + image.size());
  PutLe(&out, kPrefixMagic, 4);
  PutLe(&out, kPrefixVersion, 2);
  PutLe(&out, 0, 2);
  PutLe(&out, tokens.size(), 8);
  PutLe(&out, 0, 4);  // The CRC, filled in below.
  for (int32_t id : tokens) PutLe(&out, static_cast<uint32_t>(id), 4);
  const uint32_t crc = Crc32c(out.data(), out.size());
  for (int i = 0; i < 4; ++i) out[16 + i] = static_cast<uint8_t>(crc >> (8 * i));
  out.insert(out.end(), image.begin(), image.end());
  return out;
}

StatusOr<PrefixValue> DecodePrefixValue(std::span<const uint8_t> value) {
  if (value.size() < kHeaderBytes) {
    return DataLoss("prefix value: ", value.size(), " bytes, shorter than its ", kHeaderBytes,
                    "-byte header");
  }
  const uint8_t* p = value.data();
  if (GetLe(p, 4) != kPrefixMagic) {
    return DataLoss("prefix value: magic ", GetLe(p, 4), ", expected ", kPrefixMagic,
                    " (\"KVPF\")");
  }
  if (GetLe(p + 4, 2) != kPrefixVersion) {
    return DataLoss("prefix value: version ", GetLe(p + 4, 2), ", this daemon reads version ",
                    kPrefixVersion);
  }
  const uint64_t n = GetLe(p + 8, 8);
  if (n > (value.size() - kHeaderBytes) / 4) {
    return DataLoss("prefix value: ", n, " token ids do not fit its ", value.size(), " bytes");
  }
  const size_t ids_end = kHeaderBytes + static_cast<size_t>(n) * 4;
  std::vector<uint8_t> head(p, p + ids_end);
  std::memset(head.data() + 16, 0, 4);
  const uint32_t want = static_cast<uint32_t>(GetLe(p + 16, 4));
  if (const uint32_t got = Crc32c(head.data(), head.size()); got != want) {
    return DataLoss("prefix value: CRC32C of its header and token ids is ", got, ", stored ", want);
  }
  PrefixValue out;
  out.tokens.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    out.tokens[i] = static_cast<int32_t>(GetLe(p + kHeaderBytes + 4 * i, 4));
  }
  out.image = value.subspan(ids_end);
  return out;
}

}  // namespace kvctl
