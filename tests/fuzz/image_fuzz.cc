// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// libFuzzer harness of sequence images (controller/sequence/sequence_image.h) and of the saved
// prefix values that wrap them (controller/service/prefix_keys.h): bytes ->
// ReadImageInfo -> ImportImage into a real shm pool with page checksums (again with
// streaming eviction on when that succeeds) -> FetchDense, Verify and two Appends on whatever was
// rebuilt -> destroy, then the pool must hold no page. Each input runs twice: as it is (magic,
// version, length and CRC checks) and with its length and CRC-32C fixed up, so mutations reach the
// plan and body checks behind the checksum. Any crash, sanitizer report, KvSequence invariant
// failure (KVCTL_CHECK) or leaked page is a finding.
//
// Seeds: real images written by tests/controller/sequence/sequence_image_test.cc
// ("[.seeds]", into tests/fuzz/image_seeds/). tools/fuzz.sh --image SECONDS runs it.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "controller/pool/pool.h"
#include "controller/sequence/sequence_image.h"
#include "controller/service/prefix_keys.h"

namespace kvctl::fuzz {
namespace {

void Die(const char* what) {
  std::fprintf(stderr, "image fuzz: %s\n", what);
  std::abort();
}

class ImageHarness {
 public:
  ImageHarness() {
    auto arena = ShmArena::Create("/kvctl-fuzz-" + std::to_string(getpid()) + "-image", 16 << 20);
    if (!arena.ok()) Die("shm arena");
    auto pool =
        PageAllocator::Create(std::move(*arena), {.page_bytes = 16 << 10, .checksums = true});
    if (!pool.ok()) Die("pool");
    pool_ = std::move(pool).value();
  }

  void Run(std::span<const uint8_t> input) {
    // The stored form of a saved prefix wraps an image (controller/service/prefix_keys.h): its
    // decoder must account for every byte, and what it unwraps goes through the image path.
    if (StatusOr<PrefixValue> prefix = DecodePrefixValue(input); prefix.ok()) {
      if (prefix->image.data() + prefix->image.size() != input.data() + input.size() ||
          prefix->image.size() + prefix->tokens.size() * 4 > input.size()) {
        Die("prefix value: the image is not the value's tail");
      }
      Try(prefix->image);
    }
    // And the encoder's values always decode back to their parts (ids from the input's head).
    std::vector<int32_t> ids(std::min<size_t>(input.size() / 4, 64));
    if (!ids.empty()) std::memcpy(ids.data(), input.data(), ids.size() * 4);
    const std::vector<uint8_t> wrapped = EncodePrefixValue(ids, input);
    StatusOr<PrefixValue> back = DecodePrefixValue(wrapped);
    if (!back.ok() || back->tokens != ids || back->image.size() != input.size() ||
        !std::equal(input.begin(), input.end(), back->image.begin())) {
      Die("prefix value: encode then decode changed it");
    }
    Try(input);
    if (input.size() < 16) return;
    std::vector<uint8_t> sealed(input.begin(), input.end());
    const uint64_t size = sealed.size();
    if (sealed.size() >= 24) std::memcpy(sealed.data() + 16, &size, 8);  // total_bytes.
    const uint32_t crc = Crc32c(sealed.data() + 16, sealed.size() - 16);
    std::memcpy(sealed.data() + 12, &crc, 4);
    Try(sealed);
  }

 private:
  void Try(std::span<const uint8_t> image) {
    StatusOr<ImageInfo> info = ReadImageInfo(image);
    // The image's own geometry when it is small enough to exercise quickly, else a fixed one
    // (then the geometry check refuses most inputs, which is also worth covering).
    SequenceGeometry g{.layers = 2, .kv_heads = 3, .head_dim = 64, .dtype = DType::kF16};
    if (info.ok() && info->geometry.layers * info->geometry.kv_heads <= 64 &&
        info->geometry.head_dim <= 256) {
      g = info->geometry;
      g.quality_sample_period = 2;
    }
    // An image that imports is imported again under streaming eviction: the importer-eviction
    // checks, then appends that evict from a rebuilt sequence.
    bool imported = false;
    for (bool evicting : {false, true}) {
      EvictionSettings evict;
      if (evicting) {
        if (!imported) break;
        evict.enabled = true;
        evict.policy = EvictPolicy::kStreaming;
        evict.sinks = 2;
        evict.window = 8;
        evict.tokens_per_head = 48;
        evict.floor = 10;
      }
      StatusOr<std::unique_ptr<KvSequence>> seq = ImportImage(pool_.get(), image, g, "", evict);
      imported = seq.ok();
      if (seq.ok()) Exercise(**seq, g);
    }
    if (pool_->Stats().pages_used != 0) Die("pages left allocated after the sequence went");
  }

  // Reads everything back and appends, so a rebuilt sequence that breaks an invariant trips it.
  void Exercise(KvSequence& seq, const SequenceGeometry& g) {
    if (!seq.Verify(0, g.layers).ok()) Die("a rebuilt sequence fails its page checksums");
    DenseKv dense = seq.FetchDense(0, g.layers);
    size_t rows = 0;
    for (uint32_t c : dense.counts) rows += c;
    if (rows != static_cast<size_t>(seq.tokens()) * g.layers * g.kv_heads) {
      Die("FetchDense rows differ from tokens x layers x heads");
    }
    for (int64_t n : {int64_t{1}, int64_t{37}}) {
      const size_t elems = static_cast<size_t>(n) * g.kv_heads * g.head_dim;
      std::vector<float> k(elems), v(elems);
      for (size_t i = 0; i < elems; ++i) {
        k[i] = static_cast<float>(static_cast<int>(i % 17) - 8) * 0.125f;
        v[i] = static_cast<float>(static_cast<int>(i % 13) - 6) * 0.25f;
      }
      std::vector<KvTensorView> kv, vv;
      for (int l = 0; l < g.layers; ++l) {
        kv.push_back(KvTensorView::Contiguous(k.data(), DType::kF32, n, g.kv_heads, g.head_dim));
        vv.push_back(KvTensorView::Contiguous(v.data(), DType::kF32, n, g.kv_heads, g.head_dim));
      }
      const Status s = seq.Append(seq.first_position() + seq.tokens(), kv, vv);
      // INVALID_ARGUMENT: a flush of stored rows the method cannot encode (e.g. turbo metadata
      // past fp16 for rows near 65504): the same as for a sequence that appended those rows.
      if (!s.ok() && s.code() != StatusCode::kResourceExhausted &&
          s.code() != StatusCode::kInvalidArgument) {
        std::fprintf(stderr, "image fuzz: append after import: %s\n", s.ToString().c_str());
        std::abort();
      }
    }
  }

  std::unique_ptr<PageAllocator> pool_;
};

}  // namespace
}  // namespace kvctl::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvctl::fuzz::ImageHarness harness;  // Destroyed at exit, which removes the shm pool.
  harness.Run(std::span<const uint8_t>(data, size));
  return 0;
}
