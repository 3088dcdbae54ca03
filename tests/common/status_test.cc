#include "common/status.h"

#include <catch2/catch.hpp>

namespace kvctl {
namespace {

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("x: got ", x, ", expected an even number");
  return x / 2;
}

Status Quarter(int x, int* out) {
  KVCTL_ASSIGN_OR_RETURN(int h, Half(x));
  KVCTL_ASSIGN_OR_RETURN(*out, Half(h));
  return OkStatus();
}

TEST_CASE("Status: carries code and message", "[common]") {
  Status s = InvalidArgument("bits: got ", 5, ", expected 2");
  CHECK_FALSE(s.ok());
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.ToString() == "INVALID_ARGUMENT: bits: got 5, expected 2");
  CHECK(OkStatus().ok());
  CHECK(OkStatus().ToString() == "OK");
}

TEST_CASE("StatusOr: value or error, macros propagate", "[common]") {
  int out = 0;
  CHECK(Quarter(8, &out).ok());
  CHECK(out == 2);
  Status s = Quarter(6, &out);  // 6 -> 3 fails on the second halving.
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message() == "x: got 3, expected an even number");
  StatusOr<int> bad = Status();  // An OK status is not a value: turned into an internal error.
  CHECK(bad.status().code() == StatusCode::kInternal);
}

}  // namespace
}  // namespace kvctl
