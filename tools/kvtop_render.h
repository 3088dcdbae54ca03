// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvtop_render.h
// kvtop's renderings of a Snapshot, all without a terminal: the full-screen layout as lines of
// styled spans (the ncurses UI only paints them, so layout is testable as text), the plain-text
// snapshot of `kvtop --once` and the JSON of `kvtop --once --json`.
//
// Screen, top to bottom: a 4-line header (version, uptime, endpoint, pool, bits/element,
// compression, request rates, append/fetch p50/p99); the layer bars (left) beside the heads heat
// map and quality panel of the selected layer (right); the sequences table; a key-help footer.
// At 80x24 everything fits; more rows go to the layer list and the sequences table, more columns
// to longer bars and more heads.
//
// Thread safety: pure functions.
//
//   std::vector<Line> screen = LayoutScreen(snapshot, rates, view, COLS, LINES);
//   std::cout << RenderJson(snapshot.text);
#ifndef KVCTL_TOOLS_KVTOP_RENDER_H_
#define KVCTL_TOOLS_KVTOP_RENDER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/kvtop_format.h"
#include "tools/kvtop_stats.h"

namespace kvctl::kvtop {

// What a span looks like; the UI maps each to colors (or to bold/reverse with --no-color).
enum class Style : uint8_t {
  kNormal,
  kTitle,     // Header and footer bars.
  kSection,   // Panel titles.
  kDim,       // Labels, column headers.
  kSelected,  // The selected layer.
  kError,     // "not reachable".
  kBar,       // Layer bar, within budget.
  kBarOver,   // Layer bar past its budget.
  kHeat0,     // Heat map, cool ...
  kHeat1,
  kHeat2,
  kHeat3,
  kHeat4,  // ... hot.
};
inline constexpr int kHeatLevels = 5;

struct Span {
  std::string text;  // UTF-8; every character kvtop emits is one column wide.
  Style style = Style::kNormal;
};
using Line = std::vector<Span>;

enum class SortKey : uint8_t { kTokens, kBytes, kAge, kClient, kId };
const char* SortKeyName(SortKey key);
SortKey NextSortKey(SortKey key);

struct ViewState {
  int selected_layer = 0;  // A layer index; clamped to the layers present.
  SortKey sort = SortKey::kTokens;
  bool help = false;           // Show the key help instead of the panels.
  bool unicode = true;         // Block characters for bars; ASCII when false.
  std::string state = "live";  // Right end of the title bar: "live", "PAUSED", ...
  std::string source;          // Right end of the footer: where the data comes from.
};

// The screen: exactly `height` lines, none wider than `width` columns (both >= 1).
std::vector<Line> LayoutScreen(const Snapshot& snapshot, const Rates& rates, const ViewState& view,
                               int width, int height);

// A screen with no data: the title bar, `message` (error style) and `detail` centred, the footer.
std::vector<Line> LayoutMessage(std::string_view message, std::string_view detail,
                                const ViewState& view, int width, int height);

// The plain-text snapshot: header, every layer, head and sequence, quality and policy. Lines are at
// most `width` columns except table rows, which are never cut. ASCII only.
std::string RenderPlain(const Snapshot& snapshot, int width);

// The stats as one JSON object: {"section": {"field": value, "entity": {"k": value}}}. Values that
// are JSON numbers are emitted as numbers, everything else as strings.
std::string RenderJson(const StatsText& text);

// The line's text without styles.
std::string LineText(const Line& line);

}  // namespace kvctl::kvtop

#endif  // KVCTL_TOOLS_KVTOP_RENDER_H_
