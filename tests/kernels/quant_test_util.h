// Helpers shared by the kernel tests.
#ifndef KVCTL_TESTS_KERNELS_QUANT_TEST_UTIL_H_
#define KVCTL_TESTS_KERNELS_QUANT_TEST_UTIL_H_

#include <vector>

#include "kernels/quantize.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl::testing {

// One block of head `head` from a synthetic [G, H, D] tensor, with its OScaR norms.
struct BlockData {
  SyntheticKv kv;
  std::vector<float> norms;
  BlockInput Input(int head) const {
    const int d = kv.head_dim;
    return BlockInput{kv.k.data() + head * d, kv.v.data() + head * d,
                      static_cast<int64_t>(kv.heads) * d, norms.data()};
  }
};

inline BlockData MakeBlock(int tokens, int heads, int head_dim, uint64_t seed) {
  BlockData b;
  b.kv =
      GenerateSyntheticKv({.tokens = tokens, .heads = heads, .head_dim = head_dim, .seed = seed});
  b.norms.resize(static_cast<size_t>(tokens));
  ComputeTokenNorms(b.kv.KView(), b.norms.data());
  return b;
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_KERNELS_QUANT_TEST_UTIL_H_
