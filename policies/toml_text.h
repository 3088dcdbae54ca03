// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/toml_text.h
// ParseTomlText: TOML text -> table, with a syntax error turned into a Status that names the file,
// line and column. Shared by the RateQuant profile reader and the calibration profile reader.
// Thread safety: a pure function.
//
//   KVCTL_ASSIGN_OR_RETURN(toml::table root, ParseTomlText(text, "profile.toml"));
#ifndef KVCTL_POLICIES_TOML_TEXT_H_
#define KVCTL_POLICIES_TOML_TEXT_H_

#include <toml++/toml.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace kvctl {

// INVALID_ARGUMENT "name:line:column: description" on a syntax error.
inline StatusOr<toml::table> ParseTomlText(std::string_view text, std::string_view name) {
  try {
    return toml::parse(text, std::string(name));
  } catch (const toml::parse_error& e) {
    return InvalidArgument(name, ":", e.source().begin.line, ":", e.source().begin.column, ": ",
                           e.description());
  }
}

}  // namespace kvctl

#endif  // KVCTL_POLICIES_TOML_TEXT_H_
