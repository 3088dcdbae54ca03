// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Config values: parsing, checking and printing one key's value (byte sizes, numbers, enums,
// strings) against its schema row. The schema table itself is in config_schema.cc.
#include <cctype>
#include <charconv>
#include <cstdio>
#include <string>

#include "common/json_text.h"
#include "controller/config/config.h"

namespace kvctl {
namespace {

bool IsPowerOfTwo(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

std::string FormatNumber(double x) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), x);
  std::string s(buf, end);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // TOML needs a float literal.
  return s;
}

std::string RangeText(const ConfigOption& o) {
  if (o.type == ConfigType::kBytes) {
    return FormatByteSize(static_cast<uint64_t>(o.min)) + ".." +
           FormatByteSize(static_cast<uint64_t>(o.max));
  }
  if (o.type == ConfigType::kDouble) {
    return internal::StrCat(o.min, "..", o.max);
  }
  return internal::StrCat(static_cast<int64_t>(o.min), "..", static_cast<int64_t>(o.max));
}

// A value as shown in error messages.
std::string ShowValue(const ConfigOption& o, const ConfigValue& v) {
  if (o.type == ConfigType::kBytes) {
    const int64_t b = std::get<int64_t>(v);
    return b < 0 ? std::to_string(b) : FormatByteSize(static_cast<uint64_t>(b));
  }
  if (o.type == ConfigType::kEnum) return std::to_string(std::get<int64_t>(v));
  return FormatConfigValue(o, v);
}

Status Expected(const ConfigOption& o, std::string_view got, std::string_view expected) {
  return InvalidArgument(o.key, ": got ", got, ", expected ", expected);
}

}  // namespace

StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  const auto fail = [&] {
    return InvalidArgument("got \"", text,
                           "\", expected a byte size like 4096, \"64KiB\", \"512MiB\" or \"1GiB\" "
                           "(units B, KiB, MiB, GiB, TiB; whole numbers)");
  };
  std::string_view s = text;
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  uint64_t n = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), n);
  if (ec != std::errc() || ptr == s.data()) return fail();
  std::string_view unit = s.substr(ptr - s.data());
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  std::string lower;
  for (char c : unit) lower += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  int shift = -1;
  if (lower.empty() || lower == "b") shift = 0;
  if (lower == "kib") shift = 10;
  if (lower == "mib") shift = 20;
  if (lower == "gib") shift = 30;
  if (lower == "tib") shift = 40;
  if (shift < 0) return fail();
  if (shift > 0 && n > (UINT64_MAX >> shift)) {
    return InvalidArgument("got \"", text, "\", expected a byte size below 2^64");
  }
  return n << shift;
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr std::pair<int, const char*> kUnits[] = {
      {40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}};
  for (auto [shift, name] : kUnits) {
    const uint64_t unit = uint64_t{1} << shift;
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes >> shift) + name;
  }
  return std::to_string(bytes) + "B";
}

StatusOr<ConfigValue> ParseConfigValue(const ConfigOption& o, std::string_view text) {
  const std::string got = JsonQuoted(text);
  ConfigValue value;
  switch (o.type) {
    case ConfigType::kInt: {
      int64_t n = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
      if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) {
        return Expected(o, got, DescribeExpected(o));
      }
      value = n;
      break;
    }
    case ConfigType::kBytes: {
      StatusOr<uint64_t> n = ParseByteSize(text);
      if (!n.ok() || *n > static_cast<uint64_t>(INT64_MAX)) {
        return Expected(o, got, DescribeExpected(o));
      }
      value = static_cast<int64_t>(*n);
      break;
    }
    case ConfigType::kDouble: {
      double x = 0;
      auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), x);
      if (ec != std::errc() || ptr != text.data() + text.size() || text.empty()) {
        return Expected(o, got, DescribeExpected(o));
      }
      value = x;
      break;
    }
    case ConfigType::kBool:
      if (text != "true" && text != "false") return Expected(o, got, DescribeExpected(o));
      value = text == "true";
      break;
    case ConfigType::kString:
      value = std::string(text);
      break;
    case ConfigType::kEnum: {
      size_t i = 0;
      while (i < o.names.size() && o.names[i] != text) ++i;
      if (i == o.names.size()) return Expected(o, got, DescribeExpected(o));
      value = static_cast<int64_t>(i);
      break;
    }
  }
  KVCTL_RETURN_IF_ERROR(CheckConfigValue(o, value));
  return value;
}

Status CheckConfigValue(const ConfigOption& o, const ConfigValue& v) {
  switch (o.type) {
    case ConfigType::kInt:
    case ConfigType::kBytes: {
      const int64_t n = std::get<int64_t>(v);
      if (static_cast<double>(n) < o.min || static_cast<double>(n) > o.max ||
          ((o.flags & kPowerOfTwo) && !IsPowerOfTwo(n))) {
        return Expected(o, ShowValue(o, v), DescribeExpected(o));
      }
      break;
    }
    case ConfigType::kDouble: {
      const double x = std::get<double>(v);
      if (!(x >= o.min && x <= o.max)) return Expected(o, ShowValue(o, v), DescribeExpected(o));
      break;
    }
    case ConfigType::kEnum: {
      const int64_t i = std::get<int64_t>(v);
      if (i < 0 || i >= static_cast<int64_t>(o.names.size())) {
        return Expected(o, ShowValue(o, v), DescribeExpected(o));
      }
      break;
    }
    case ConfigType::kBool:
    case ConfigType::kString:
      break;
  }
  if (o.check != nullptr) {
    const std::string expected = o.check(v);
    if (!expected.empty()) return Expected(o, ShowValue(o, v), expected);
  }
  return OkStatus();
}

std::string FormatConfigValue(const ConfigOption& o, const ConfigValue& v) {
  switch (o.type) {
    case ConfigType::kInt:
      return std::to_string(std::get<int64_t>(v));
    case ConfigType::kBytes:
      return JsonQuoted(FormatByteSize(static_cast<uint64_t>(std::get<int64_t>(v))));
    case ConfigType::kDouble:
      return FormatNumber(std::get<double>(v));
    case ConfigType::kBool:
      return std::get<bool>(v) ? "true" : "false";
    case ConfigType::kString:
      return JsonQuoted(std::get<std::string>(v));
    case ConfigType::kEnum: {
      const int64_t i = std::get<int64_t>(v);
      if (i < 0 || i >= static_cast<int64_t>(o.names.size())) return std::to_string(i);
      return JsonQuoted(o.names[i]);
    }
  }
  return "";
}

std::string DescribeExpected(const ConfigOption& o) {
  switch (o.type) {
    case ConfigType::kInt:
      return "an integer in " + RangeText(o);
    case ConfigType::kBytes:
      return std::string(o.flags & kPowerOfTwo ? "a power-of-two byte size" : "a byte size") +
             " in " + RangeText(o) + " (an integer or a string like \"64KiB\", \"512MiB\")";
    case ConfigType::kDouble:
      return "a number in " + RangeText(o);
    case ConfigType::kBool:
      return "true or false";
    case ConfigType::kString:
      return "a string";
    case ConfigType::kEnum: {
      std::string s = "one of ";
      for (size_t i = 0; i < o.names.size(); ++i) s += (i ? ", " : "") + o.names[i];
      return s;
    }
  }
  return "";
}

}  // namespace kvctl
