// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/json_text.h
// Text for hand-written JSON (and TOML basic strings, whose escapes are the same): a quoted
// string with '"', '\\' and control characters escaped (\u00XX), and a number with 10
// significant digits or null when not finite. Used by every report and config printer so they
// escape alike.
//
// Thread safety: pure functions.
//
//   std::string out = "{\"name\": " + JsonQuoted(name) + ", \"x\": " + JsonNumber(x) + "}";
#ifndef KVCTL_COMMON_JSON_TEXT_H_
#define KVCTL_COMMON_JSON_TEXT_H_

#include <string>
#include <string_view>

namespace kvctl {

// Appends `s` as a quoted string literal to *out.
void AppendJsonQuoted(std::string* out, std::string_view s);
std::string JsonQuoted(std::string_view s);

// "%.10g" of x, or "null" when x is NaN or infinite.
std::string JsonNumber(double x);

}  // namespace kvctl

#endif  // KVCTL_COMMON_JSON_TEXT_H_
