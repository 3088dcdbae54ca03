// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "policies/width_relief.h"

#include <catch2/catch.hpp>

namespace kvctl {
namespace {

constexpr uint64_t kPage = 64 << 10;

QuantSpec Kivi(int k_bits, int v_bits) {
  StatusOr<QuantSpec> spec = MakeQuantSpec(QuantMethod::kKivi, 64, k_bits, v_bits);
  REQUIRE(spec.ok());
  return *spec;
}

ReliefHead Head(int layer, int head, QuantSpec spec, int64_t records, double scale = 1) {
  ReliefHead h;
  h.layer = layer;
  h.head = head;
  h.spec = spec;
  h.records = records;
  h.curve.k_scale = h.curve.v_scale = scale;
  return h;
}

TEST_CASE("WidthRelief: RecordPages packs page_bytes / record_bytes records per page",
          "[policies]") {
  const QuantSpec spec = Kivi(4, 4);
  const int64_t per_page = static_cast<int64_t>(kPage / BlockLayoutOf(spec).record_bytes);
  CHECK(RecordPages(spec, 0, kPage) == 0);
  CHECK(RecordPages(spec, 1, kPage) == 1);
  CHECK(RecordPages(spec, per_page, kPage) == 1);
  CHECK(RecordPages(spec, per_page + 1, kPage) == 2);
}

TEST_CASE("WidthRelief: the head with the cheaper curve is lowered first", "[policies]") {
  const QuantSpec spec = Kivi(4, 4);
  const int64_t records = 4 * static_cast<int64_t>(kPage / BlockLayoutOf(spec).record_bytes);
  // Head (0, 1) costs 10x less per element: it alone must cover a one-page shortfall.
  const std::vector<ReliefHead> heads = {Head(0, 0, spec, records, 10.0),
                                         Head(0, 1, spec, records, 1.0)};
  StatusOr<WidthRelief> r =
      PlanWidthRelief(heads, {.page_bytes = kPage, .min_bits = 2, .shortfall_pages = 1});
  REQUIRE(r.ok());
  REQUIRE(r->steps.size() == 1);
  CHECK(r->steps[0].head == 1);
  CHECK(r->steps[0].from_k_bits == 4);
  CHECK(r->steps[0].pages_freed >= 1);
  CHECK(r->pages_freed == r->steps[0].pages_freed);
  CHECK(r->distortion_added == Approx(r->steps[0].distortion_added));
  CHECK(r->distortion_added > 0);
}

TEST_CASE("WidthRelief: the default model lowers 8-bit heads before 4-bit ones", "[policies]") {
  const QuantSpec wide = Kivi(8, 8), narrow = Kivi(4, 4);
  const int64_t records = 64;
  const std::vector<ReliefHead> heads = {Head(0, 0, narrow, records), Head(1, 0, wide, records)};
  StatusOr<WidthRelief> r =
      PlanWidthRelief(heads, {.page_bytes = kPage, .min_bits = 2, .shortfall_pages = 1});
  REQUIRE(r.ok());
  REQUIRE(r->steps.size() == 1);
  CHECK(r->steps[0].layer == 1);
  CHECK(r->steps[0].to_k_bits == 4);  // 8 -> 4: the next allowed width below 8 for kivi.
}

TEST_CASE("WidthRelief: plans free the shortfall, never widen, never go below min_bits",
          "[policies]") {
  std::vector<ReliefHead> heads;
  for (int l = 0; l < 6; ++l) {
    for (int h = 0; h < 2; ++h) {
      heads.push_back(Head(l, h, Kivi(l % 2 ? 8 : 4, 4), 40 + 37 * l + 11 * h, 1.0 + l + h));
    }
  }
  int64_t total = 0;
  for (const ReliefHead& h : heads) total += RecordPages(h.spec, h.records, kPage);
  for (int min_bits : {2, 3}) {
    for (int64_t shortfall = 1; shortfall <= 8; ++shortfall) {
      StatusOr<WidthRelief> r = PlanWidthRelief(
          heads, {.page_bytes = kPage, .min_bits = min_bits, .shortfall_pages = shortfall});
      REQUIRE(r.ok());
      CHECK(r->pages_freed >= shortfall);
      int64_t after = total, steps_pages = 0;
      for (const ReliefStep& s : r->steps) {
        CHECK(s.to_k_bits <= s.from_k_bits);
        CHECK(s.to_v_bits <= s.from_v_bits);
        CHECK((s.to_k_bits < s.from_k_bits || s.to_v_bits < s.from_v_bits));
        CHECK(s.to_k_bits >= min_bits);
        CHECK(s.to_v_bits >= min_bits);
        steps_pages += s.pages_freed;
        const ReliefHead& h = heads[static_cast<size_t>(s.layer * 2 + s.head)];
        QuantSpec to = h.spec;
        to.k_bits = s.to_k_bits;
        to.v_bits = s.to_v_bits;
        after += RecordPages(to, h.records, kPage) - RecordPages(h.spec, h.records, kPage);
      }
      CHECK(steps_pages == r->pages_freed);
      CHECK(total - after == r->pages_freed);
    }
  }
}

TEST_CASE("WidthRelief: more than lowering everything can free is RESOURCE_EXHAUSTED",
          "[policies]") {
  const std::vector<ReliefHead> heads = {Head(0, 0, Kivi(4, 4), 500)};
  StatusOr<WidthRelief> r =
      PlanWidthRelief(heads, {.page_bytes = kPage, .min_bits = 4, .shortfall_pages = 1});
  REQUIRE(r.status().code() == StatusCode::kResourceExhausted);
  CHECK_THAT(r.status().message(), Catch::Contains("frees 0 pages, expected >= 1"));
  // Heads without records free nothing either.
  r = PlanWidthRelief({Head(0, 0, Kivi(8, 8), 0)},
                      {.page_bytes = kPage, .min_bits = 2, .shortfall_pages = 1});
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
}

TEST_CASE("WidthRelief: partial plans free what they can when the shortfall is too large",
          "[policies]") {
  const std::vector<ReliefHead> heads = {Head(0, 0, Kivi(8, 8), 300), Head(0, 1, Kivi(4, 4), 0)};
  const int64_t most = RecordPages(Kivi(8, 8), 300, kPage) - RecordPages(Kivi(2, 2), 300, kPage);
  REQUIRE(most > 0);
  StatusOr<WidthRelief> r = PlanWidthRelief(
      heads, {.page_bytes = kPage, .min_bits = 2, .shortfall_pages = most + 5, .partial = true});
  REQUIRE(r.ok());
  CHECK(r->pages_freed == most);
  REQUIRE(r->steps.size() == 1);
  CHECK(r->steps[0].to_k_bits == 2);
  CHECK(r->steps[0].to_v_bits == 2);
  // Nothing to lower: an empty plan, not an error.
  r = PlanWidthRelief({Head(0, 0, Kivi(2, 2), 300)},
                      {.page_bytes = kPage, .min_bits = 2, .shortfall_pages = 3, .partial = true});
  REQUIRE(r.ok());
  CHECK(r->steps.empty());
  CHECK(r->pages_freed == 0);
}

TEST_CASE("WidthRelief: bad input names the field", "[policies]") {
  const std::vector<ReliefHead> heads = {Head(0, 0, Kivi(4, 4), 10)};
  StatusOr<WidthRelief> r =
      PlanWidthRelief(heads, {.page_bytes = kPage, .min_bits = 2, .shortfall_pages = 0});
  CHECK_THAT(r.status().message(), Catch::Contains("shortfall_pages: got 0"));
  r = PlanWidthRelief({Head(0, 0, Kivi(4, 4), -1)},
                      {.page_bytes = kPage, .min_bits = 2, .shortfall_pages = 1});
  CHECK_THAT(r.status().message(), Catch::Contains("heads[0].records: got -1"));
  ReliefHead bad = Head(0, 0, Kivi(4, 4), 10);
  bad.curve.beta_k = 1;
  r = PlanWidthRelief({bad}, {.page_bytes = kPage, .min_bits = 2, .shortfall_pages = 1});
  CHECK_THAT(r.status().message(), Catch::Contains("heads[0].curve beta: got 1"));
  r = PlanWidthRelief(heads, {.page_bytes = 64, .min_bits = 2, .shortfall_pages = 1});
  CHECK_THAT(r.status().message(), Catch::Contains("expected <= page_bytes 64"));
}

}  // namespace
}  // namespace kvctl
