#include "common/tensor.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "common/half.h"

namespace kvctl {
namespace {

TEST_CASE("KvTensorView: strided rows and dtype conversion", "[common]") {
  // [H=2, T=3, D=4] storage viewed as [T, H, D].
  std::vector<uint16_t> data(2 * 3 * 4);
  for (size_t i = 0; i < data.size(); ++i) data[i] = FloatToHalf(static_cast<float>(i));
  KvTensorView v{data.data(), DType::kF16, 3, 2, 4, /*token_stride=*/4, /*head_stride=*/12};
  REQUIRE(v.Validate("k").ok());
  float row[4];
  v.LoadRow(2, 1, row);
  CHECK(row[0] == 20.0f);
  CHECK(row[3] == 23.0f);
  KvTensorView tail = v.Tokens(1, 2);
  tail.LoadRow(0, 0, row);
  CHECK(row[0] == 4.0f);
}

TEST_CASE("KvTensorView: validation names the problem", "[common]") {
  float x[8] = {};
  KvTensorView v = KvTensorView::Contiguous(x, DType::kF32, 2, 1, 0);
  Status s = v.Validate("k");
  CHECK(s.message() == "k: head_dim must be > 0, got 0");
  v = KvTensorView::Contiguous(nullptr, DType::kF32, 2, 1, 4);
  CHECK(v.Validate("v").message() == "v: data pointer is null");
  v = KvTensorView{x, DType::kF32, 2, 2, 4, 2, 4};
  CHECK(v.Validate("q").code() == StatusCode::kInvalidArgument);
}

TEST_CASE("KvTensorView: CheckFinite finds the first bad element", "[common]") {
  std::vector<float> x(2 * 2 * 4, 1.0f);
  x[1 * 8 + 1 * 4 + 2] = std::nanf("");
  KvTensorView v = KvTensorView::Contiguous(x.data(), DType::kF32, 2, 2, 4);
  Status s = v.CheckFinite("k");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().find("token 1, head 1, channel 2") != std::string::npos);
  CHECK(ParseDType("bf16").value() == DType::kBF16);
  CHECK(ParseDType("int8").status().message().find("int8") != std::string::npos);
}

}  // namespace
}  // namespace kvctl
