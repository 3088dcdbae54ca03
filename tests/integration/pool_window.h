// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/integration/pool_window.h
// Reads the window rows (sinks, then tail) a blocks-mode FETCH names from the daemon's shm pool,
// as an engine does, and checks them against a dense FETCH of the same layers: every window row
// must be exactly the dense row at its position, sinks first and tail last.
#ifndef KVCTL_TESTS_INTEGRATION_POOL_WINDOW_H_
#define KVCTL_TESTS_INTEGRATION_POOL_WINDOW_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "common/half.h"
#include "ipc/messages.h"

namespace kvctl::testing {

// A read-only mapping of /dev/shm/<name>, pool_bytes long.
class PoolMap {
 public:
  PoolMap(const std::string& shm_name, uint64_t pool_bytes) : bytes_(pool_bytes) {
    const int fd = shm_open(shm_name.c_str(), O_RDONLY, 0);
    REQUIRE(fd >= 0);
    void* p = mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    REQUIRE(p != MAP_FAILED);
    data_ = static_cast<const uint8_t*>(p);
  }
  ~PoolMap() { munmap(const_cast<uint8_t*>(data_), bytes_); }
  PoolMap(const PoolMap&) = delete;
  PoolMap& operator=(const PoolMap&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t bytes_;
};

inline float RowValue(const uint8_t* p, DType dtype) {
  if (dtype == DType::kF32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return dtype == DType::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
}

struct PairWindow {
  uint32_t sinks = 0;
  std::vector<int64_t> positions;
  std::vector<float> k, v;  // [rows, head_dim], widened to fp32.
};

// Pair `pair`'s window rows from the pool, with positions expanded from the runs.
inline PairWindow ReadWindow(const PoolMap& pool, const ipc::FetchBlocksReply& r, uint64_t pair) {
  const ipc::RecordLayout& l = r.layouts[r.layout_index[pair]];
  const size_t d = r.head_dim, row_bytes = d * DTypeSize(l.row_dtype);
  PairWindow w;
  w.sinks = r.window_sinks[pair];
  for (uint32_t j = r.run_indptr[pair]; j < r.run_indptr[pair + 1]; ++j) {
    for (uint32_t i = 0; i < r.run_lengths[j]; ++i) {
      w.positions.push_back(static_cast<int64_t>(r.run_starts[j] + i));
    }
  }
  for (uint32_t j = r.window_indptr[pair]; j < r.window_indptr[pair + 1]; ++j) {
    const uint64_t id = r.window_ids[j];
    const uint64_t at =
        id / l.rows_per_page * r.page_bytes + id % l.rows_per_page * l.row_slot_bytes;
    REQUIRE(at + 2 * row_bytes <= pool.bytes());
    const uint8_t* slot = pool.data() + at;
    for (size_t c = 0; c < d; ++c) {
      w.k.push_back(RowValue(slot + c * DTypeSize(l.row_dtype), l.row_dtype));
      w.v.push_back(RowValue(slot + row_bytes + c * DTypeSize(l.row_dtype), l.row_dtype));
    }
  }
  return w;
}

// Every pair's window (read from the pool) is the dense reply's first `sinks` rows and its last
// rows, bit for bit, at the same positions; records cover the rows in between. `dense` must be
// an fp32 FETCH of the same layers.
inline void CheckWindowsMatchDense(const PoolMap& pool, const ipc::FetchBlocksReply& blocks,
                                   const ipc::FetchDenseReply& dense) {
  REQUIRE(dense.dtype == DType::kF32);
  const size_t d = blocks.head_dim;
  const auto* pos = static_cast<const int64_t*>(dense.positions.data());
  const auto* k = static_cast<const float*>(dense.k.data());
  const auto* v = static_cast<const float*>(dense.v.data());
  size_t first = 0;  // The pair's first row in the dense reply.
  for (uint64_t pair = 0; pair < dense.counts.size(); ++pair) {
    INFO("pair " << pair);
    const PairWindow w = ReadWindow(pool, blocks, pair);
    const size_t count = dense.counts[pair], rows = w.positions.size();
    const uint32_t records = blocks.indptr[pair + 1] - blocks.indptr[pair];
    REQUIRE(w.k.size() == rows * d);
    REQUIRE(uint64_t{records} * blocks.block_tokens + rows == count);
    for (size_t i = 0; i < rows; ++i) {
      // Sinks are the first rows of the pair, the tail its last ones.
      const size_t at = first + (i < w.sinks ? i : count - rows + i);
      INFO("window row " << i);
      REQUIRE(w.positions[i] == pos[at]);
      REQUIRE(std::memcmp(&w.k[i * d], k + at * d, d * 4) == 0);
      REQUIRE(std::memcmp(&w.v[i * d], v + at * d, d * 4) == 0);
    }
    first += count;
  }
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_INTEGRATION_POOL_WINDOW_H_
