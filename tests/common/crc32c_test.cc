// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "common/crc32c.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/skip.h"

namespace kvctl {
namespace {

TEST_CASE("CRC-32C: known answers of the specification", "[crc32c]") {
  const std::string check = "123456789";
  // The catalogued check value of CRC-32C, and RFC 3720 (iSCSI) B.4's 32-byte vectors.
  CHECK(Crc32cExtendPortable(0, check.data(), check.size()) == 0xE3069283u);
  CHECK(Crc32c(check.data(), check.size()) == 0xE3069283u);
  CHECK(Crc32c(nullptr, 0) == 0u);
  std::vector<uint8_t> zeros(32, 0x00), ones(32, 0xFF), up(32), down(32);
  for (int i = 0; i < 32; ++i)
    up[i] = static_cast<uint8_t>(i), down[i] = static_cast<uint8_t>(31 - i);
  CHECK(Crc32c(zeros.data(), 32) == 0x8A9136AAu);
  CHECK(Crc32c(ones.data(), 32) == 0x62A8AB43u);
  CHECK(Crc32c(up.data(), 32) == 0x46DD794Eu);
  CHECK(Crc32c(down.data(), 32) == 0x113FDB5Cu);
  if (Crc32cHardwareAvailable()) {
    CHECK(Crc32cExtendHardware(0, check.data(), check.size()) == 0xE3069283u);
    CHECK(Crc32cExtendHardware(0, up.data(), 32) == 0x46DD794Eu);
  }
}

TEST_CASE("CRC-32C: extending equals checksumming the concatenation", "[crc32c]") {
  const std::string a = "12345", b = "6789";
  CHECK(Crc32cExtend(Crc32c(a.data(), a.size()), b.data(), b.size()) == 0xE3069283u);
  CHECK(Crc32cExtend(Crc32c(a.data(), a.size()), nullptr, 0) == Crc32c(a.data(), a.size()));
}

TEST_CASE("CRC-32C: hardware and table agree on random lengths and alignments", "[crc32c]") {
  if (!Crc32cHardwareAvailable()) {
    return testing::Skip("this CPU lacks SSE4.2: no hardware CRC-32C to compare with the table");
  }
  std::mt19937_64 rng(17);
  std::vector<uint8_t> buf(70000);
  for (uint8_t& byte : buf) byte = static_cast<uint8_t>(rng());
  std::uniform_int_distribution<size_t> offset(0, 63), length(0, 65600);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t at = offset(rng);
    const size_t n = trial < 64 ? static_cast<size_t>(trial) : length(rng);  // Every short tail.
    const auto seed = static_cast<uint32_t>(rng());
    INFO("offset " << at << ", length " << n << ", seed " << seed);
    REQUIRE(Crc32cExtendHardware(seed, buf.data() + at, n) ==
            Crc32cExtendPortable(seed, buf.data() + at, n));
  }
  // Around the three-stream rounds of the hardware path (3 x 2048, 3 x 1360 and 3 x 256 bytes,
  // and their combinations), and the 4 KiB pool chunk, at several alignments.
  for (size_t n : {767u,  768u,   769u,   775u,   1535u,  1536u,  2303u, 4079u, 4080u,
                   4081u, 4095u,  4096u,  4097u,  4848u,  4856u,  6143u, 6144u, 6145u,
                   6151u, 10224u, 10232u, 10991u, 12288u, 12295u, 65536u}) {
    for (size_t at : {0u, 3u, 8u, 61u}) {
      INFO("length " << n << ", offset " << at);
      CHECK(Crc32cExtendHardware(7, buf.data() + at, n) ==
            Crc32cExtendPortable(7, buf.data() + at, n));
    }
  }
  // Every length from 0 to 5000 once (every path of the cascade and every tail).
  for (size_t n = 0; n <= 5000; ++n) {
    INFO("length " << n);
    REQUIRE(Crc32cExtendHardware(0xABCD, buf.data() + 5, n) ==
            Crc32cExtendPortable(0xABCD, buf.data() + 5, n));
  }
  // One flipped bit changes the checksum (what the pool relies on).
  const uint32_t before = Crc32c(buf.data(), 4096);
  buf[1234] ^= 0x10;
  CHECK(Crc32c(buf.data(), 4096) != before);
}

TEST_CASE("CRC-32C: row checksums equal one checksum per row, on both paths", "[crc32c]") {
  std::mt19937_64 rng(29);
  std::vector<uint8_t> buf(3000);
  for (uint8_t& byte : buf) byte = static_cast<uint8_t>(rng());
  // Row lengths with and without a tail of single bytes; row counts around the groups of three.
  for (size_t row_bytes : {0u, 1u, 7u, 8u, 9u, 128u, 130u, 512u}) {
    for (size_t rows : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u}) {
      if (row_bytes * rows + 3 > buf.size()) continue;
      INFO("row_bytes " << row_bytes << ", rows " << rows);
      std::vector<uint32_t> want(rows);
      for (size_t r = 0; r < rows; ++r) {
        want[r] = Crc32cExtendPortable(0, buf.data() + 3 + r * row_bytes, row_bytes);
      }
      std::vector<uint32_t> got(rows + 1, 42);
      Crc32cRows(buf.data() + 3, row_bytes, rows, got.data());
      CHECK(std::vector<uint32_t>(got.begin(), got.end() - 1) == want);
      CHECK(got.back() == 42u);
      if (Crc32cHardwareAvailable()) {
        std::fill(got.begin(), got.end(), 42u);
        Crc32cRowsHardware(buf.data() + 3, row_bytes, rows, got.data());
        CHECK(std::vector<uint32_t>(got.begin(), got.end() - 1) == want);
        CHECK(got.back() == 42u);
      }
    }
  }
}

// Not run by default (hidden tag): the throughput figures of docs/reliability.md "Page
// checksums", over 64 KiB pages and over the 4 KiB chunks FETCH and the scrubber check one by one.
//   build/tests/common_test "[.crc32c-speed]"
TEST_CASE("CRC-32C: throughput of both paths over 64 KiB pages and 4 KiB chunks",
          "[.crc32c-speed]") {
  std::vector<uint8_t> page(64 << 10);
  std::mt19937_64 rng(3);
  for (uint8_t& byte : page) byte = static_cast<uint8_t>(rng());
  auto measure = [&](uint32_t (*crc)(uint32_t, const void*, size_t), size_t unit, int rounds) {
    uint32_t sink = 0;
    double best = 0;
    for (int trial = 0; trial < 5; ++trial) {  // Best of 5: the least disturbed by other load.
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < rounds; ++i) {
        for (size_t at = 0; at < page.size(); at += unit) sink ^= crc(sink, page.data() + at, unit);
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, static_cast<double>(page.size()) * rounds / s / 1e9);
    }
    CHECK(sink != 0x12345678u);  // Keeps the loop.
    return best;
  };
  WARN("table, 64 KiB: " << measure(Crc32cExtendPortable, page.size(), 200) << " GB/s");
  if (Crc32cHardwareAvailable()) {
    WARN("sse4.2, 64 KiB: " << measure(Crc32cExtendHardware, page.size(), 4000) << " GB/s");
    WARN("sse4.2, 4 KiB: " << measure(Crc32cExtendHardware, 4096, 4000) << " GB/s");
  }
}

}  // namespace
}  // namespace kvctl
