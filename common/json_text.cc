// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "common/json_text.h"

#include <cmath>
#include <cstdio>

namespace kvctl {

void AppendJsonQuoted(std::string* out, std::string_view s) {
  out->push_back('"');
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (u < 0x20) {
      char esc[8];
      std::snprintf(esc, sizeof esc, "\\u%04x", u);
      out->append(esc);
    } else {
      out->push_back(c);
    }
  }
  out->push_back('"');
}

std::string JsonQuoted(std::string_view s) {
  std::string out;
  AppendJsonQuoted(&out, s);
  return out;
}

std::string JsonNumber(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.10g", x);
  return buf;
}

}  // namespace kvctl
