// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tier/blob_store.h
// Large values in a Redis Cluster as a manifest key plus chunk keys (format: EncodeManifest below):
// chunks of `chunk_bytes` spread over the cluster's masters (each chunk key hashes to its own slot)
// and written or read pipelined per master, then one small manifest under the value's name.
// A value of at most `chunk_bytes` is stored inside its manifest instead (one key, one round trip
// each way: small values would otherwise pay two round trips against a raw SET/GET's one).
//
// Integrity: the manifest names the format version, the total size, the chunk size and count, a
// random generation and the CRC32C of every chunk (seeded with the generation and the chunk index,
// so a chunk moved to another key fails too), and carries a CRC32C of itself. Get answers
// NOT_FOUND when the manifest is absent and DATA_LOSS naming the value, the chunk index and its key
// when a chunk is missing, short or fails its checksum: never wrong bytes. A manifest of another
// format version is FAILED_PRECONDITION.
//
// Overwrites: each Put writes its chunks under a fresh generation, then swaps the manifest (reads
// the old header and sets the new manifest in one pipeline) and deletes the previous generation's
// chunks, so a reader sees the old value, the new value, or DATA_LOSS (old chunks deleted under
// it): never a mix. Two Puts of one name at once may leave one's chunks behind (both read the same
// old header): garbage until their TTL, never wrong bytes. Chunks get the value's TTL plus
// kChunkTtlSlack, so they do not expire before the manifest written after them.
//
// A name with a Redis hashtag ("{...}") pins every chunk to the hashtag's slot (one master):
// callers who want the chunks spread use names without braces.
//
// Thread safety: as RedisCluster (the cluster serializes each call); BlobStore holds no state of
// its own besides the cluster pointer and the chunk size.
//
//   BlobStore blobs(cluster.get());
//   KVCTL_RETURN_IF_ERROR(blobs.Put("seq/42", bytes, std::chrono::minutes(10)));
//   KVCTL_ASSIGN_OR_RETURN(std::vector<uint8_t> back, blobs.Get("seq/42"));
#ifndef KVCTL_TIER_BLOB_STORE_H_
#define KVCTL_TIER_BLOB_STORE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "tier/redis_cluster.h"

namespace kvctl::tier {

// The manifest of one stored value (encoded little-endian; see EncodeManifest).
struct BlobManifest {
  static constexpr uint8_t kVersion = 1;
  uint8_t version = kVersion;
  uint64_t total_bytes = 0;
  uint32_t chunk_bytes = 0;
  uint64_t generation = 0;
  std::vector<uint32_t> chunk_crcs;  // One per chunk; size() is the chunk count.
  // The value itself when it is stored inside the manifest (no chunks; flag bit 0). Decoded, it
  // views the bytes given to DecodeManifest.
  bool is_inline = false;
  std::string_view inline_bytes;
};

// "KVTB", version u8, flags u8 (bit 0: inline), 2 zero bytes, total_bytes u64, chunk_bytes u32,
// chunk_count u32, generation u64, chunk_count x crc u32, the inline value (total_bytes bytes,
// inline only), then the CRC32C of everything before it (u32).
std::string EncodeManifest(const BlobManifest& manifest);
// DATA_LOSS naming `name` when the bytes are not a well-formed, self-consistent manifest;
// FAILED_PRECONDITION when they are a manifest of another version or with unknown flags.
StatusOr<BlobManifest> DecodeManifest(std::string_view name, std::string_view bytes);
// The key of chunk `index` of generation `generation` of `name`: "<name>#<generation hex>#<index>".
std::string ChunkKey(std::string_view name, uint64_t generation, uint32_t index);
// The checksum stored for a chunk: CRC32C of (generation u64, index u32, the chunk's bytes).
uint32_t ChunkCrc(uint64_t generation, uint32_t index, std::span<const uint8_t> bytes);

class BlobStore {
 public:
  // Chunk TTL beyond the manifest's (the chunks are written first).
  static constexpr std::chrono::milliseconds kChunkTtlSlack{30000};

  // REQUIRES: cluster outlives this store; 0 < chunk_bytes < 4 GiB.
  explicit BlobStore(RedisCluster* cluster, size_t chunk_bytes = 1 << 20);

  // Chunks first (pipelined per master), manifest last; ttl 0 = no expiry. On failure the chunks
  // written so far are deleted (best effort) and the previous value, if any, is left as it was.
  Status Put(std::string_view name, std::span<const uint8_t> value, std::chrono::milliseconds ttl);
  StatusOr<std::vector<uint8_t>> Get(std::string_view name);
  // Whether each name has a manifest (chunks are not checked).
  StatusOr<std::vector<bool>> Exists(std::span<const std::string> names);
  // Removes the manifest (atomically, GETDEL) and then its chunks; an absent name is OK.
  Status Del(std::string_view name);

  // The chunk keys the current manifest of `name` names, none for an inline value (for tests and
  // accounting).
  StatusOr<std::vector<std::string>> ChunkKeys(std::string_view name);
  size_t chunk_bytes() const { return chunk_bytes_; }

 private:
  // REQUIRES: the result is used only for its fields, not inline_bytes (its bytes are gone).
  StatusOr<BlobManifest> ReadManifest(std::string_view name);
  // Reads the header of the manifest it replaces and sets the new one (one pipeline), then
  // deletes the replaced manifest's chunks.
  Status PutManifest(std::string_view name, const BlobManifest& manifest,
                     std::chrono::milliseconds ttl);
  static Status NotFoundError(std::string_view name);
  // Best effort: a failure leaves garbage that the TTL (if any) removes.
  void DeleteChunks(std::string_view name, uint64_t generation, size_t count);

  RedisCluster* const cluster_;
  const size_t chunk_bytes_;
};

}  // namespace kvctl::tier

#endif  // KVCTL_TIER_BLOB_STORE_H_
