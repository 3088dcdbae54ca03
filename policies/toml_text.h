// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: policies/toml_text.h
// ParseTomlText: TOML text -> table, with a syntax error turned into a Status that names the file,
// line and column; TomlDouble / TomlList: numbers written so they read back exactly. Shared by the
// RateQuant profile and the calibration profile readers and writers.
// Thread safety: pure functions.
//
//   KVCTL_ASSIGN_OR_RETURN(toml::table root, ParseTomlText(text, "profile.toml"));
#ifndef KVCTL_POLICIES_TOML_TEXT_H_
#define KVCTL_POLICIES_TOML_TEXT_H_

#include <toml++/toml.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

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

// 17 significant digits round-trip a double; a '.0' keeps integral values TOML floats.
inline std::string TomlDouble(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  std::string s = buf;
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// "[a, b, ...]": floating-point values by TomlDouble, integers as they print.
template <typename T>
std::string TomlList(const std::vector<T>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) {
    out << (i ? ", " : "");
    if constexpr (std::is_floating_point_v<T>) {
      out << TomlDouble(values[i]);
    } else {
      out << values[i];
    }
  }
  out << "]";
  return out.str();
}

}  // namespace kvctl

#endif  // KVCTL_POLICIES_TOML_TEXT_H_
