// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvtop_stats.h"

#include <catch2/catch.hpp>

#include "tests/observability/kvtop_test_util.h"

namespace kvctl::kvtop {
namespace {

StatsText Parse(const std::string& text) {
  StatusOr<StatsText> parsed = ParseStatsText(text);
  REQUIRE(parsed.ok());
  return *std::move(parsed);
}

TEST_CASE("kvtop stats: sections, plain fields and per-entity lines", "[tools][kvtop]") {
  const StatsText t = Parse(testing::MakeStats({}));
  REQUIRE(t.sections.size() == 9);
  CHECK(t.sections[0].name == "server");
  CHECK(t.sections[7].name == "quality");
  CHECK(t.sections[8].name == "tier");
  REQUIRE(t.Field("pool", "pool_bytes") != nullptr);
  CHECK(*t.Field("pool", "pool_bytes") == "268435456");
  CHECK(t.Number("pool", "pages") == 3584);
  CHECK(t.Number("server", "kvctl_version") == std::nullopt);  // "0.1.0" is text.
  CHECK(t.Field("pool", "no_such_field") == nullptr);
  CHECK(t.Field("no_such_section", "pages") == nullptr);

  const StatsSection* seqs = t.Section("sequences");
  REQUIRE(seqs != nullptr);
  REQUIRE(seqs->entities.size() == 2);
  CHECK(seqs->entities[0].name == "seq_1_1");
  REQUIRE(seqs->entities[0].Find("client") != nullptr);
  CHECK(*seqs->entities[0].Find("client") == "vllm");
  // Entity lines are not plain fields, and plain fields that look numeric stay plain.
  CHECK(t.Field("sequences", "seq_1_1") == nullptr);
  CHECK(t.Number("sequences", "sequences") == 2);
}

TEST_CASE("kvtop stats: values keep their colons", "[tools][kvtop]") {
  const StatsText t = Parse(testing::MakeStats({}));
  CHECK(*t.Field("server", "endpoint") == "ipc:///tmp/kvctl.sock");
  CHECK(*t.Field("server", "http_address") == "127.0.0.1:9464");
}

TEST_CASE("kvtop stats: malformed text is an error naming the line", "[tools][kvtop]") {
  StatusOr<StatsText> bad = ParseStatsText("# Server\nkvctl_version:0.1.0\nthis has no colon\n");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("line 3") != std::string::npos);
  CHECK_FALSE(ParseStatsText("").ok());
  CHECK_FALSE(ParseStatsText("\n\n").ok());
  // A field before any header belongs to "server"; CRLF line ends are accepted.
  StatusOr<StatsText> headless = ParseStatsText("pid:7\r\n");
  REQUIRE(headless.ok());
  CHECK(headless->Number("server", "pid") == 7);
  // A section header seen twice (the daemon never sends one) continues the first section, so
  // JSON keys stay unique.
  StatusOr<StatsText> twice = ParseStatsText("# Ipc\na:1\n# Pool\nb:2\n# Ipc\nc:3\n");
  REQUIRE(twice.ok());
  REQUIRE(twice->sections.size() == 2);
  CHECK(twice->Number("ipc", "c") == 3);
}

TEST_CASE("kvtop stats: entity keys are word_N[_N] with k=v values", "[tools][kvtop]") {
  const StatsText t = Parse(
      "# X\nlayer_3:tokens=5\nhead_3_1:tokens=6,k_bits=2\nfoo_bar:a=b\nlayer_x:a=1\n"
      "layer_4:plain\n");
  const StatsSection& s = t.sections[0];
  REQUIRE(s.entities.size() == 2);
  CHECK(s.entities[1].name == "head_3_1");
  CHECK(s.entities[1].fields.size() == 2);
  CHECK(*t.Field("x", "foo_bar") == "a=b");
  CHECK(*t.Field("x", "layer_x") == "a=1");
  CHECK(*t.Field("x", "layer_4") == "plain");
}

TEST_CASE("kvtop stats: IsJsonNumber follows JSON's number grammar", "[tools][kvtop]") {
  for (const char* yes : {"0", "-1", "12", "1.5", "0.25", "1e+06", "1E-3", "-0.5e2"}) {
    CHECK(IsJsonNumber(yes));
  }
  for (const char* no : {"", "-", "01", "1.", ".5", "1e", "0x10", "inf", "nan", "1.0.0", "+1", " 1",
                         "1 ", "0.1.0"}) {
    CHECK_FALSE(IsJsonNumber(no));
  }
}

TEST_CASE("kvtop stats: typed rows for layers, heads and sequences", "[tools][kvtop]") {
  const Snapshot s = BuildSnapshot(Parse(testing::MakeStats({.layers = 3, .heads = 2})));
  REQUIRE(s.layers.size() == 3);
  CHECK(s.layers[2].layer == 2);
  CHECK(s.layers[2].tokens == 300);
  CHECK(s.layers[0].bits_per_element == Approx(11.0857));
  REQUIRE(s.heads.size() == 6);
  CHECK(s.heads[5].layer == 2);
  CHECK(s.heads[5].head == 1);
  CHECK(s.heads[5].k_bits == 2);
  CHECK(s.heads[4].k_bits == 4);
  CHECK(s.heads[5].quality_samples == 2);
  CHECK(s.heads[5].v_rel_error == Approx(0.183071));
  CHECK(s.HeadsOf(1).size() == 2);
  CHECK(s.HeadsOf(7).empty());
  REQUIRE(s.sequences.size() == 2);
  CHECK(s.sequences[1].session == 1);
  CHECK(s.sequences[1].sequence == 2);
  CHECK(s.sequences[1].client == "vllm");
  CHECK(s.sequences[1].tokens == 200);
  CHECK(s.sequences[1].age_s == 11);
  CHECK(s.Num("pool", "pages_used") == 180);
  CHECK(s.Num("pool", "missing") == 0);
  CHECK(s.Str("policy", "quant_method") == "kvarn");
}

TEST_CASE("kvtop stats: rates from counter deltas, none across a restart", "[tools][kvtop]") {
  const Snapshot a = BuildSnapshot(Parse(testing::MakeStats({})));
  const Snapshot b = BuildSnapshot(Parse(
      testing::MakeStats({.requests = 300, .appends = 180, .fetches = 5, .bytes_in = 3 << 20})));
  const Rates r = ComputeRates(a, 10.0, b, 12.0);
  REQUIRE(r.valid);
  CHECK(r.requests == Approx(100));
  CHECK(r.appends == Approx(50));
  CHECK(r.fetches == Approx(0));
  CHECK(r.bytes_in == Approx(1 << 20));
  CHECK_FALSE(ComputeRates(a, 10.0, b, 10.0).valid);  // dt = 0.
  CHECK_FALSE(ComputeRates(b, 10.0, a, 12.0).valid);  // A counter went down.
  const Snapshot other_pid = BuildSnapshot(Parse(testing::MakeStats({.pid = 99, .requests = 500})));
  CHECK_FALSE(ComputeRates(a, 10.0, other_pid, 12.0).valid);
}

}  // namespace
}  // namespace kvctl::kvtop
