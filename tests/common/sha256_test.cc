// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// SHA-256 against the FIPS 180-4 / NIST CAVP example vectors, and incremental updates split at
// every byte against the one-shot digest.
#include "common/sha256.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

namespace kvctl {
namespace {

std::string HexOf(const std::string& text) {
  const Sha256::Digest d = Sha256::Of({reinterpret_cast<const uint8_t*>(text.data()), text.size()});
  return Sha256::Hex(d);
}

TEST_CASE("Sha256 known answers", "[common]") {
  CHECK(HexOf("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(HexOf("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(HexOf("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(HexOf("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
              "nopqrlmnopqrsmnopqrstnopqrstu") ==
        "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  CHECK(HexOf(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("Sha256 incremental updates equal the one-shot digest", "[common]") {
  std::vector<uint8_t> data(300);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  for (size_t len : {0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 300}) {
    const std::span<const uint8_t> all(data.data(), len);
    const Sha256::Digest want = Sha256::Of(all);
    for (size_t split = 0; split <= len; ++split) {
      Sha256 h;
      h.Update(all.subspan(0, split));
      h.Update(all.subspan(split));
      REQUIRE(h.Finish() == want);
    }
  }
}

}  // namespace
}  // namespace kvctl
