// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvtop_render.h"

#include <catch2/catch.hpp>
#include <regex>

#include "tests/observability/kvtop_test_util.h"
#include "tools/kvtop_format.h"

namespace kvctl::kvtop {
namespace {

Snapshot Make(const testing::FakeStats& f) {
  StatusOr<StatsText> parsed = ParseStatsText(testing::MakeStats(f));
  REQUIRE(parsed.ok());
  return BuildSnapshot(*std::move(parsed));
}

std::string Screen(const std::vector<Line>& lines) {
  std::string out;
  for (const Line& l : lines) out += LineText(l) + "\n";
  return out;
}

int CountMatches(const std::string& text, const std::string& pattern) {
  const std::regex re(pattern, std::regex::multiline);
  return static_cast<int>(
      std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

void RequireExactSize(const std::vector<Line>& lines, int width, int height) {
  REQUIRE(static_cast<int>(lines.size()) == height);
  for (const Line& l : lines) {
    INFO(LineText(l));
    CHECK(DisplayWidth(LineText(l)) == width);
  }
}

TEST_CASE("kvtop render: the screen fits 80x24 with header, layers, heads, sequences",
          "[tools][kvtop]") {
  const Snapshot s = Make({.layers = 30, .heads = 3, .sequences = 3});
  Rates rates;
  rates.valid = true;
  rates.requests = 102;
  rates.appends = 100;
  ViewState view;
  view.source = "ipc:///tmp/kvctl-stats.sock";
  const std::vector<Line> lines = LayoutScreen(s, rates, view, 80, 24);
  RequireExactSize(lines, 80, 24);
  const std::string text = Screen(lines);
  INFO(text);
  for (const char* want :
       {"kvctl 0.1.0", "up 1h02m", "ipc:///tmp/kvctl.sock", "pool 11.2M/224M 5.0%",
        "bits/elt 11.09 (23.41 reserved)", "x0.68 vs fp16", "req/s 102",
        "append/s 100 p50 107us p99 46ms", "Heads of layer 0", "kbit", "vbit", "tok",
        "Quality 1/16: 90 samples, mean K .105 V .185", "Kerr", "Verr", "SESS/SEQ", "CLIENT",
        "q quit"}) {
    INFO(want);
    CHECK(text.find(want) != std::string::npos);
  }
  CHECK(text.find("fetch/s 0.0 p50 58ms p99 58ms") != std::string::npos);
  CHECK(Screen(LayoutScreen(s, Rates{}, view, 80, 24)).find("req/s -  append/s -") !=
        std::string::npos);  // No rates before a second snapshot.
  CHECK(CountMatches(text, "^[> ]L[0-9]+ ") >= 8);
  CHECK(CountMatches(text, "^>L0 ") == 1);
  CHECK(CountMatches(text, "^ 1/[123] +vllm ") == 3);
}

TEST_CASE(
    "kvtop render: a daemon with a cluster tier and cached prefixes gets their lines, the screen "
    "its size",
    "[tools][kvtop]") {
  const Snapshot s = Make({.layers = 30, .heads = 3, .sequences = 3, .tier = true});
  ViewState view;
  const std::vector<Line> lines = LayoutScreen(s, Rates{}, view, 140, 24);
  RequireExactSize(lines, 140, 24);
  const std::string text = Screen(lines);
  INFO(text);
  for (const char* want : {"tier up", "spilled 2 seq 3.0M", "spills 5 5.0ms", "restores 3 4.0ms",
                           "lost 0", "prefix hit/miss 7/2", "restored 14.3k tok",
                           "prefixes 2 (1 read) 2.0M/64.0M", "hit/lookup 3/4", "dropped 1"}) {
    INFO(want);
    CHECK(text.find(want) != std::string::npos);
  }
  CHECK(Screen(LayoutScreen(Make({.layers = 30}), Rates{}, view, 100, 24)).find("tier ") ==
        std::string::npos);
  CHECK(RenderPlain(s, 120).find("prefix hit/miss 7/2") != std::string::npos);
}

TEST_CASE("kvtop render: more room shows more layers, heads and sequences", "[tools][kvtop]") {
  const Snapshot s = Make({.layers = 30, .heads = 16, .sequences = 20});
  const ViewState view;
  const std::string small = Screen(LayoutScreen(s, Rates{}, view, 80, 24));
  const std::vector<Line> big_lines = LayoutScreen(s, Rates{}, view, 160, 60);
  RequireExactSize(big_lines, 160, 60);
  const std::string big = Screen(big_lines);
  CHECK(CountMatches(big, "^[> ]L[0-9]+ ") > CountMatches(small, "^[> ]L[0-9]+ "));
  CHECK(CountMatches(big, " vllm ") > CountMatches(small, " vllm "));
  CHECK(small.find("(h0-h7 of 16)") != std::string::npos);  // 8 heads fit beside the layers.
  CHECK(big.find("of 16)") == std::string::npos);           // All 16 fit.
  CHECK(small.find("... ") != std::string::npos);           // "... N more" sequences.
}

TEST_CASE("kvtop render: the selected layer is marked, scrolled to and shown in the heat map",
          "[tools][kvtop]") {
  const Snapshot s = Make({.layers = 30, .heads = 2});
  ViewState view;
  view.selected_layer = 29;
  const std::string text = Screen(LayoutScreen(s, Rates{}, view, 80, 24));
  INFO(text);
  CHECK(CountMatches(text, "^>L29 ") == 1);
  CHECK(CountMatches(text, "^ L0 ") == 0);  // Scrolled away.
  CHECK(text.find("Heads of layer 29") != std::string::npos);
  view.selected_layer = 1000;  // Past the end: the last layer.
  CHECK(Screen(LayoutScreen(s, Rates{}, view, 80, 24)).find("Heads of layer 29") !=
        std::string::npos);
}

TEST_CASE("kvtop render: heat styles follow bits, and bars follow budgets", "[tools][kvtop]") {
  const Snapshot s = Make({.layers = 2, .heads = 2, .budget_tokens = 150});
  const std::vector<Line> lines = LayoutScreen(s, Rates{}, ViewState{}, 80, 24);
  const std::string text = Screen(lines);
  CHECK(text.find("tokens vs budget") != std::string::npos);
  bool four_bits_heat2 = false, two_bits_heat4 = false, over_budget = false;
  for (const Line& l : lines) {
    for (const Span& span : l) {
      if (span.text == "   4" && span.style == Style::kHeat2) four_bits_heat2 = true;
      if (span.text == "   2" && span.style == Style::kHeat4) two_bits_heat4 = true;
      if (span.style == Style::kBarOver) over_budget = true;  // Layer 1 holds 200 of 150.
    }
  }
  CHECK(four_bits_heat2);
  CHECK(two_bits_heat4);
  CHECK(over_budget);
}

TEST_CASE("kvtop render: sequences sort by each key", "[tools][kvtop]") {
  const Snapshot s = Make({.layers = 1, .heads = 1, .sequences = 3});
  auto first_row = [&](SortKey key) {
    ViewState view;
    view.sort = key;
    const std::string text = Screen(LayoutScreen(s, Rates{}, view, 80, 24));
    std::smatch m;
    REQUIRE(std::regex_search(text, m, std::regex(" (1/[0-9]) +vllm ")));
    return m[1].str();
  };
  CHECK(first_row(SortKey::kTokens) == "1/3");  // 300 tokens.
  CHECK(first_row(SortKey::kBytes) == "1/1");   // 3000 bytes.
  CHECK(first_row(SortKey::kAge) == "1/3");     // 12 s.
  CHECK(first_row(SortKey::kId) == "1/1");
  SortKey k = SortKey::kTokens;
  for (int i = 0; i < 5; ++i) k = NextSortKey(k);
  CHECK(k == SortKey::kTokens);
  CHECK(std::string(SortKeyName(SortKey::kClient)) == "client");
}

TEST_CASE("kvtop render: help, message and tiny screens keep their size", "[tools][kvtop]") {
  const Snapshot s = Make({});
  ViewState view;
  view.help = true;
  const std::vector<Line> help = LayoutScreen(s, Rates{}, view, 80, 24);
  RequireExactSize(help, 80, 24);
  CHECK(Screen(help).find("kvtop keys") != std::string::npos);
  CHECK(Screen(help).find("or vs the busiest layer.") != std::string::npos);  // Not cut at 80.

  view.help = false;
  const std::vector<Line> down = LayoutMessage("kvctl not reachable at ipc:///x; retrying",
                                               "last data at 12:00:00", view, 80, 24);
  RequireExactSize(down, 80, 24);
  const std::string text = Screen(down);
  CHECK(text.find("   kvctl not reachable at ipc:///x; retrying") != std::string::npos);
  CHECK(LineText(down.back()).find("q quit") != std::string::npos);

  RequireExactSize(LayoutScreen(s, Rates{}, view, 20, 5), 20, 5);
  RequireExactSize(LayoutScreen(s, Rates{}, view, 1, 1), 1, 1);
  RequireExactSize(LayoutMessage("x", "", view, 10, 2), 10, 2);
}

TEST_CASE("kvtop render: ASCII mode emits no multibyte characters", "[tools][kvtop]") {
  ViewState view;
  view.unicode = false;
  const std::string ascii = Screen(LayoutScreen(Make({}), Rates{}, view, 100, 30));
  for (char c : ascii) CHECK(static_cast<unsigned char>(c) < 0x80);
  CHECK(ascii.find('#') != std::string::npos);
  view.unicode = true;
  CHECK(Screen(LayoutScreen(Make({}), Rates{}, view, 100, 30)).find("█") != std::string::npos);
}

TEST_CASE("kvtop render: client names are painted safely", "[tools][kvtop]") {
  const std::string text =
      Screen(LayoutScreen(Make({.client = "ev\x1b[2Jil"}), Rates{}, ViewState{}, 80, 24));
  CHECK(text.find('\x1b') == std::string::npos);
  CHECK(text.find("ev?[2Jil") != std::string::npos);
  CHECK(Printable("ok \xc3\xa9\x01\xff") == "ok \xc3\xa9??");
}

TEST_CASE("kvtop render: long session ids are shortened on screen and whole in JSON",
          "[tools][kvtop]") {
  const testing::FakeStats f{.sequences = 1, .session = 12795078947620653759ull};
  const std::string screen = Screen(LayoutScreen(Make(f), Rates{}, ViewState{}, 80, 24));
  CHECK(CountMatches(screen, "^ ~653759/1 +vllm ") == 1);
  CHECK(screen.find("12795078947620653759") == std::string::npos);
  CHECK(CountMatches(RenderPlain(Make(f), 100), "^  ~653759/1 +vllm ") == 1);
  StatusOr<StatsText> t = ParseStatsText(testing::MakeStats(f));
  REQUIRE(t.ok());
  CHECK(RenderJson(*t).find("\"seq_12795078947620653759_1\": {") != std::string::npos);
  CHECK(ShortId(123456, 6) == "123456");
  CHECK(ShortId(1234567, 6) == "~234567");
}

TEST_CASE("kvtop render: JSON keeps numbers as numbers and escapes text", "[tools][kvtop]") {
  StatusOr<StatsText> t = ParseStatsText(testing::MakeStats({.client = "a\"b\\c\td"}));
  REQUIRE(t.ok());
  const std::string json = RenderJson(*t);
  INFO(json);
  CHECK(json.find("\"pool_bytes\": 268435456") != std::string::npos);
  CHECK(json.find("\"kvctl_version\": \"0.1.0\"") != std::string::npos);
  CHECK(json.find("\"http_address\": \"127.0.0.1:9464\"") != std::string::npos);
  CHECK(json.find("\"bits_per_element\": 11.0857") != std::string::npos);
  CHECK(json.find("\"seq_1_1\": {\"client\": \"a\\\"b\\\\c\\u0009d\", \"tokens\": 100") !=
        std::string::npos);
  CHECK(json.find("\"layer_1\": {\"tokens\": 200") != std::string::npos);
  CHECK(json.front() == '{');
  CHECK(json.substr(json.size() - 2) == "}\n");
  CHECK(RenderJson(StatsText{}) == "{}\n");
}

TEST_CASE("kvtop render: the plain snapshot lists every layer, head and sequence",
          "[tools][kvtop]") {
  const std::string text = RenderPlain(Make({.layers = 30, .heads = 3, .sequences = 2}), 100);
  CHECK(CountMatches(text, "^ +[0-9]+ +[0-9]+ +[0-9.]+[BKMG] +11\\.086 ") == 30);  // Layers.
  CHECK(CountMatches(text, "^ +[0-9]+ +[0-9] +[0-9]+ +[24] +2 ") == 90);           // Heads.
  CHECK(CountMatches(text, "^  1/[12] +vllm ") == 2);
  CHECK(text.find("requests 100  append 80 p50 107us p99 46ms") != std::string::npos);
  for (char c : text) CHECK(static_cast<unsigned char>(c) < 0x80);
}

TEST_CASE("kvtop format: compact units", "[tools][kvtop]") {
  CHECK(HumanBytes(512) == "512B");
  CHECK(HumanBytes(11796480) == "11.2M");
  CHECK(HumanBytes(234881024) == "224M");
  CHECK(HumanBytes(1 << 30) == "1.0G");
  CHECK(HumanCount(9999) == "9999");
  CHECK(HumanCount(12345) == "12.3k");
  CHECK(HumanRate(0.5) == "0.5");
  CHECK(HumanRate(102) == "102");
  CHECK(HumanRate(1234) == "1.2k");
  CHECK(HumanMicros(107) == "107us");
  CHECK(HumanMicros(4600) == "4.6ms");
  CHECK(HumanMicros(46341) == "46ms");
  CHECK(HumanMicros(1.2e6) == "1.2s");
  CHECK(HumanAge(45) == "45s");
  CHECK(HumanAge(723) == "12m03s");
  CHECK(HumanAge(3723) == "1h02m");
  CHECK(HumanAge(183600) == "2d03h");
  CHECK(Compact4(16) == "16");
  CHECK(Compact4(1050) == "1050");
  CHECK(Compact4(12345) == "12k");
  CHECK(Compact4(1.2e6) == "1.2M");
  CHECK(FormatError(0.183071) == ".183");
  CHECK(FormatError(0.0920884) == ".092");
  CHECK(FormatError(0.99999) == "1.00");
  CHECK(FormatError(0.0004) == "4e-4");
  CHECK(FormatError(0.000096) == "1e-4");
  CHECK(FormatError(12.3) == "12.3");
  CHECK(FormatError(0) == "0");
  CHECK(PadLeft("█", 3) == "  █");
  CHECK(Truncate("a█b", 2) == "a█");
  CHECK(DisplayWidth("a█b") == 3);
}

}  // namespace
}  // namespace kvctl::kvtop
