// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvtop_format.h
// Compact, fixed-width number and text formats for kvtop's screen and plain output: sizes in binary
// units, counts, rates, latencies, ages, relative errors, and UTF-8-aware padding and truncation.
//
// Thread safety: pure functions.
//
//   HumanBytes(11796480) == "11.2M";  HumanMicros(46341) == "46ms";  PadLeft("7", 3) == "  7"
#ifndef KVCTL_TOOLS_KVTOP_FORMAT_H_
#define KVCTL_TOOLS_KVTOP_FORMAT_H_

#include <cstdint>
#include <string>
#include <string_view>

namespace kvctl::kvtop {

// Columns a UTF-8 string takes: its code points (kvtop emits no wide or combining characters).
int DisplayWidth(std::string_view utf8);
// The first `width` columns of `utf8`, never splitting a code point.
std::string Truncate(std::string_view utf8, int width);
// Cut or padded with spaces to exactly `width` columns, text on the left / right.
std::string PadRight(std::string_view utf8, int width);
std::string PadLeft(std::string_view utf8, int width);
// Text from the daemon made safe to paint: control characters and invalid bytes become '?'.
std::string Printable(std::string_view text);

// 512B, 11.2M, 224M, 1.5G (binary units, at most 5 columns below 1000T).
std::string HumanBytes(double bytes);
// 350, 9999, 12.3k, 4.5M: whole counts.
std::string HumanCount(double n);
// 0.5, 12, 1.2k: per-second rates.
std::string HumanRate(double per_s);
// 107us, 4.6ms, 46ms, 1.2s.
std::string HumanMicros(double us);
// 45s, 12m03s, 3h02m, 2d03h.
std::string HumanAge(double seconds);
// A value in at most 4 columns: 2, 16, 1050, 12k, 1.2M.
std::string Compact4(double x);
// A relative error in at most 4 columns: .183, .092, 4e-4, 1.23, 12.
std::string FormatError(double e);
// An id in at most `digits` + 1 columns: itself if short enough, else "~" and its last `digits`
// digits. Session ids are random 64-bit capabilities: the screen need not show them whole.
std::string ShortId(uint64_t id, int digits);

}  // namespace kvctl::kvtop

#endif  // KVCTL_TOOLS_KVTOP_FORMAT_H_
