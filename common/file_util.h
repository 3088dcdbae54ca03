// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/file_util.h
// Reading a whole file into memory with the project's error style, for config files, profiles
// and .npy dumps.
//
// Thread safety: reentrant.
//
//   KVCTL_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "the config file"));
#ifndef KVCTL_COMMON_FILE_UTIL_H_
#define KVCTL_COMMON_FILE_UTIL_H_

#include <string>
#include <string_view>

#include "common/status.h"

namespace kvctl {

// The bytes of `path`. NOT_FOUND "<path>: cannot open <what> (<reason>)" when it cannot be
// opened, INTERNAL when reading fails part way.
StatusOr<std::string> ReadWholeFile(const std::string& path, std::string_view what);

}  // namespace kvctl

#endif  // KVCTL_COMMON_FILE_UTIL_H_
