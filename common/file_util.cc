// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "common/file_util.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kvctl {

StatusOr<std::string> ReadWholeFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path, ": cannot open ", what, " (", std::strerror(errno), ")");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Internal(path, ": reading ", what, " failed");
  return std::move(text).str();
}

}  // namespace kvctl
