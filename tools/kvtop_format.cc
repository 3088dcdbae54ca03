// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvtop_format.h"

#include <cmath>
#include <cstdio>

namespace kvctl::kvtop {
namespace {

template <typename... Args>
std::string Format(const char* fmt, Args... args) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, args...);
  return buf;
}

// Scales `x` by 1000 (or 1024) until it is below that, then formats with the unit suffix.
std::string Scaled(double x, double base, const char* const* units, int n_units,
                   const char* small_fmt) {
  if (!std::isfinite(x)) return "?";
  if (std::fabs(x) < base) return Format(small_fmt, x) + units[0];
  int u = 0;
  while (std::fabs(x) >= base && u + 1 < n_units) x /= base, ++u;
  return Format(std::fabs(x) < 99.95 ? "%.1f" : "%.0f", x) + units[u];
}

// Length of the UTF-8 sequence that starts with `c`, 0 if `c` cannot start one.
int SequenceLength(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 0;
}

}  // namespace

int DisplayWidth(std::string_view s) {
  int n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string Truncate(std::string_view s, int width) {
  size_t i = 0;
  int cols = 0;
  while (i < s.size() && cols < width) {
    ++i;
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    ++cols;
  }
  return std::string(s.substr(0, i));
}

std::string PadRight(std::string_view s, int width) {
  std::string out = Truncate(s, width);
  out.append(static_cast<size_t>(std::max(0, width - DisplayWidth(out))), ' ');
  return out;
}

std::string PadLeft(std::string_view s, int width) {
  std::string out = Truncate(s, width);
  return std::string(static_cast<size_t>(std::max(0, width - DisplayWidth(out))), ' ') + out;
}

std::string Printable(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int len = SequenceLength(c);
    bool ok = len > 0 && i + len <= s.size() && c >= 0x20 && c != 0x7F;
    for (int j = 1; ok && j < len; ++j) {
      ok = (static_cast<unsigned char>(s[i + j]) & 0xC0) == 0x80;
    }
    if (ok) {
      out.append(s.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else {
      out += '?';
      ++i;
    }
  }
  return out;
}

std::string HumanBytes(double bytes) {
  static const char* const kUnits[] = {"B", "K", "M", "G", "T", "P"};
  return Scaled(bytes, 1024, kUnits, 6, "%.0f");
}

std::string HumanCount(double n) {
  static const char* const kUnits[] = {"", "k", "M", "G", "T"};
  if (std::fabs(n) < 10000) return Format("%.0f", n);
  return Scaled(n, 1000, kUnits, 5, "%.0f");
}

std::string HumanRate(double per_s) {
  static const char* const kUnits[] = {"", "k", "M", "G", "T"};
  if (std::fabs(per_s) < 10) return Format("%.1f", per_s);
  return Scaled(per_s, 1000, kUnits, 5, "%.0f");
}

std::string HumanMicros(double us) {
  if (us < 1000) return Format("%.0fus", us);
  if (us < 10000) return Format("%.1fms", us / 1000);
  if (us < 1e6) return Format("%.0fms", us / 1000);
  return Format("%.1fs", us / 1e6);
}

std::string HumanAge(double seconds) {
  const long long s = std::llround(std::max(0.0, seconds));
  if (s < 60) return Format("%llds", s);
  if (s < 3600) return Format("%lldm%02llds", s / 60, s % 60);
  if (s < 86400) return Format("%lldh%02lldm", s / 3600, s % 3600 / 60);
  return Format("%lldd%02lldh", s / 86400, s % 86400 / 3600);
}

std::string Compact4(double x) {
  if (!std::isfinite(x)) return "?";
  if (x < 10000) return Format("%.0f", x);
  static const char* const kUnits[] = {"", "k", "M", "G", "T"};
  int u = 0;
  while (x >= 999.5 && u < 4) x /= 1000, ++u;
  return Format(x < 9.95 ? "%.1f" : "%.0f", x) + kUnits[u];
}

std::string FormatError(double e) {
  if (!std::isfinite(e)) return "?";
  if (e >= 99.5) return Format("%.0f", std::fmin(e, 9999));
  if (e >= 9.95) return Format("%.1f", e);
  if (e >= 0.9995) return Format("%.2f", e);
  if (e >= 0.0005) return Format("%.3f", e).substr(1);  // ".092": the leading 0 is implied.
  if (e < 1e-9) return "0";
  int exp = static_cast<int>(std::floor(std::log10(e)));
  long mantissa = std::lround(e / std::pow(10.0, exp));
  if (mantissa >= 10) mantissa = 1, ++exp;
  return Format("%lde%d", mantissa, exp);
}

std::string ShortId(uint64_t id, int digits) {
  const std::string s = std::to_string(id);
  if (static_cast<int>(s.size()) <= digits) return s;
  return std::string("~").append(s, s.size() - static_cast<size_t>(digits));
}

}  // namespace kvctl::kvtop
