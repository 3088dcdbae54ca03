// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvtop_stats.h
// kvtop's stats model: parses the daemon's STATS text (INFO-style `# Section` headers,
// `field:value` lines and per-entity lines such as `head_3_1:tokens=5,k_bits=2`) into sections,
// then into typed rows (layers, heads, sequences) and request rates computed from two snapshots'
// counters. The same text arrives over the PUB stream and as the STATS reply, so one parser serves
// both.
//
// Thread safety: pure functions over values; a Snapshot is an immutable value once built.
//
//   StatusOr<StatsText> text = ParseStatsText(reply);
//   Snapshot now = BuildSnapshot(*std::move(text));
//   Rates r = ComputeRates(before, before_s, now, now_s);
#ifndef KVCTL_TOOLS_KVTOP_STATS_H_
#define KVCTL_TOOLS_KVTOP_STATS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kvctl::kvtop {

using Fields = std::vector<std::pair<std::string, std::string>>;

// A per-entity line: `layer_3:tokens=5,bytes=10` -> {"layer_3", {{"tokens","5"},{"bytes","10"}}}.
struct StatsEntity {
  std::string name;
  Fields fields;
  const std::string* Find(std::string_view key) const;
};

struct StatsSection {
  std::string name;                   // Lower case, as in the STATS request: "server", "pool", ...
  Fields fields;                      // Plain `field:value` lines, in order.
  std::vector<StatsEntity> entities;  // Per-entity lines, in order.
};

struct StatsText {
  std::vector<StatsSection> sections;

  const StatsSection* Section(std::string_view name) const;
  // The value of a plain field of `section`, or nullptr.
  const std::string* Field(std::string_view section, std::string_view key) const;
  // The field as a number; nullopt when absent or not a number.
  std::optional<double> Number(std::string_view section, std::string_view key) const;
};

// Parses the STATS text. A line before any `# Section` header goes into section "server" (the
// daemon always starts with one); a repeated header continues the earlier section. An entity line
// is a key of the form `word_N[_N...]` whose value holds `k=v` pairs separated by commas.
// INVALID_ARGUMENT for a non-empty line without ':' that is not a header, naming the line number;
// empty text is INVALID_ARGUMENT too.
StatusOr<StatsText> ParseStatsText(std::string_view text);

// True when `s` is a number in JSON's grammar (what kvtop --json emits unquoted).
bool IsJsonNumber(std::string_view s);

struct LayerRow {
  int layer = 0;
  double tokens = 0;  // Tokens kept, summed over the layer's KV heads and all sequences.
  double bytes = 0, bits_per_element = 0, budget_tokens = 0, evictions = 0;
};

struct HeadRow {
  int layer = 0, head = 0;
  double tokens = 0, k_bits = 0, v_bits = 0, bits_per_element = 0;
  double k_rel_error = 0, v_rel_error = 0, quality_samples = 0;
};

struct SequenceRow {
  uint64_t session = 0, sequence = 0;
  std::string client;
  double tokens = 0, bytes = 0, evictions = 0, age_s = 0;
};

struct Snapshot {
  StatsText text;
  std::vector<LayerRow> layers;        // By layer index.
  std::vector<HeadRow> heads;          // By (layer, head).
  std::vector<SequenceRow> sequences;  // In STATS order.

  // Shorthands for plain fields: the number (0 when absent) or the text ("" when absent).
  double Num(std::string_view section, std::string_view key) const;
  std::string Str(std::string_view section, std::string_view key) const;
  // Heads of one layer, by head index.
  std::vector<HeadRow> HeadsOf(int layer) const;
};

// Builds the typed rows; fields that are missing or not numbers read as 0.
Snapshot BuildSnapshot(StatsText text);

// Per-second rates between two snapshots taken `t0_s` and `t1_s` seconds into some clock.
struct Rates {
  bool valid = false;  // False for the first snapshot, a restarted daemon or dt <= 0.
  double requests = 0, errors = 0, appends = 0, fetches = 0, bytes_in = 0, bytes_out = 0;
};

// Rates from counter deltas. Not valid when a counter went down or the pid changed (a restart).
Rates ComputeRates(const Snapshot& before, double t0_s, const Snapshot& after, double t1_s);

}  // namespace kvctl::kvtop

#endif  // KVCTL_TOOLS_KVTOP_STATS_H_
