// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// Helpers shared by the tools tests.
#ifndef KVCTL_TESTS_TOOLS_TOOLS_TEST_UTIL_H_
#define KVCTL_TESTS_TOOLS_TOOLS_TEST_UTIL_H_

#include <stdlib.h>

#include <filesystem>
#include <stdexcept>
#include <string>

namespace kvctl::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string templ = (std::filesystem::temp_directory_path() / "kvctl_tools_XXXXXX").string();
    if (mkdtemp(templ.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = templ;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // `name` inside the directory; "" is the directory itself.
  std::string Path(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_TOOLS_TOOLS_TEST_UTIL_H_
