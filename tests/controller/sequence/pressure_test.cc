// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// KvSequence::LowerWidth and the pool pressure relief of APPEND (budget.pressure = "requantize").
#include <catch2/catch.hpp>
#include <cstring>

#include "common/half.h"
#include "controller/config/config.h"
#include "controller/sequence/budget_resolve.h"
#include "controller/sequence/kv_sequence.h"
#include "kernels/quantize.h"
#include "tests/controller/sequence/evict_test_util.h"
#include "tests/controller/sequence/sequence_test_util.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

using testing::MakeTestPool;
using testing::UniformPlans;

constexpr int kD = 64;
constexpr uint64_t kPage = 4096;

QuantSpec Kivi(int k_bits, int v_bits) { return testing::KiviSpec(kD, k_bits, v_bits); }

// `tokens` tokens of `heads` heads, the same rows for every layer.
struct Rows {
  SyntheticKv kv;
  std::vector<KvTensorView> Ks(int layers, int64_t first, int64_t count) const {
    return std::vector<KvTensorView>(static_cast<size_t>(layers), kv.KView().Tokens(first, count));
  }
  std::vector<KvTensorView> Vs(int layers, int64_t first, int64_t count) const {
    return std::vector<KvTensorView>(static_cast<size_t>(layers), kv.VView().Tokens(first, count));
  }
};

Rows MakeRows(int64_t tokens, int heads, uint64_t seed) {
  return {GenerateSyntheticKv({.tokens = tokens, .heads = heads, .head_dim = kD, .seed = seed})};
}

PressureSettings LowerWidths(int min_bits) {
  PressureSettings p;
  p.lower_widths = true;
  p.min_bits = min_bits;
  return p;
}

uint32_t PagesUsed(const PageAllocator& pool) { return pool.Stats().pages_used; }

// The rows of pair `pair` of a dense fetch.
std::vector<float> PairRows(const DenseKv& dense, int pair, bool keys) {
  size_t begin = 0;
  for (int i = 0; i < pair; ++i) begin += dense.counts[i];
  const std::vector<float>& src = keys ? dense.k : dense.v;
  return {src.begin() + static_cast<std::ptrdiff_t>(begin * kD),
          src.begin() + static_cast<std::ptrdiff_t>((begin + dense.counts[pair]) * kD)};
}

TEST_CASE("KvSequence: LowerWidth re-quantizes a head's records in place and frees pages",
          "[controller]") {
  auto pool = MakeTestPool(8 << 20, kPage);
  const QuantSpec wide = Kivi(4, 4), narrow = Kivi(2, 2);
  KvSequence seq(pool.get(), {1, 2, kD, DType::kF32}, UniformPlans(1, 2, wide));
  const Rows rows = MakeRows(1000, 2, 5);
  REQUIRE(seq.Append(0, rows.Ks(1, 0, 1000), rows.Vs(1, 0, 1000)).ok());
  const HeadBlocks before = seq.Blocks(0, 0);
  REQUIRE(before.records > 8);
  const DenseKv dense_before = seq.FetchDense(0, 1);
  const uint32_t pages_before = PagesUsed(*pool);
  const uint64_t payload_before = seq.Usage().payload_bytes;

  REQUIRE(seq.LowerWidth(0, 0, 2, 2).ok());

  // Exactly the pages the narrower records no longer need went back to the pool.
  const int64_t freed =
      RecordPages(wide, before.records, kPage) - RecordPages(narrow, before.records, kPage);
  REQUIRE(freed > 0);
  CHECK(PagesUsed(*pool) == pages_before - freed);
  CHECK(seq.Usage().payload_bytes ==
        payload_before - before.records * (BlockLayoutOf(wide).record_bytes -
                                           BlockLayoutOf(narrow).record_bytes));
  CHECK(seq.HeadSpec(0, 0).k_bits == 2);
  CHECK(seq.HeadSpec(0, 1).k_bits == 4);
  const HeadBlocks after = seq.Blocks(0, 0);
  CHECK(after.records == before.records);
  CHECK(after.records_per_page == kPage / BlockLayoutOf(narrow).record_bytes);
  CHECK(after.sink_rows == before.sink_rows);
  CHECK(after.tail_rows == before.tail_rows);
  const HeadUsage usage = seq.HeadUsageOf(0, 0);
  CHECK(usage.width_lowerings == 1);
  CHECK(usage.requantized_tokens == uint64_t{before.records} * wide.block_tokens);
  CHECK(usage.k_bits == 2);

  // Head 0's records decode to the fp16-rounded 4-bit values quantized again at 2 bits (computed
  // here with the kernels alone); rows and head 1 are untouched; positions are the same.
  const DenseKv dense_after = seq.FetchDense(0, 1);
  CHECK(dense_after.positions == dense_before.positions);
  CHECK(PairRows(dense_after, 1, true) == PairRows(dense_before, 1, true));
  CHECK(PairRows(dense_after, 1, false) == PairRows(dense_before, 1, false));
  const std::vector<float> k0 = PairRows(dense_before, 0, true);
  const std::vector<float> v0 = PairRows(dense_before, 0, false);
  std::vector<float> expect_k = k0, expect_v = v0;
  const int g = wide.block_tokens;
  std::vector<uint8_t> rec(BlockLayoutOf(narrow).record_bytes);
  for (uint32_t r = 0; r < before.records; ++r) {
    const size_t at = (before.sink_rows + static_cast<size_t>(r) * g) * kD;
    std::vector<float> bk(k0.begin() + at, k0.begin() + at + g * kD);
    std::vector<float> bv(v0.begin() + at, v0.begin() + at + g * kD);
    for (float& x : bk) x = RoundToHalf(x);
    for (float& x : bv) x = RoundToHalf(x);
    REQUIRE(QuantizeBlock(narrow, {bk.data(), bv.data(), kD, nullptr}, rec.data()).ok());
    DequantizeBlock(narrow, rec.data(), nullptr, &expect_k[at], &expect_v[at]);
  }
  CHECK(PairRows(dense_after, 0, true) == expect_k);
  CHECK(PairRows(dense_after, 0, false) == expect_v);
  CHECK(PairRows(dense_after, 0, true) != k0);

  // Later flushes of the head use the new widths: its new records are 2-bit records of the rows.
  REQUIRE(seq.Append(1000, rows.Ks(1, 0, 256), rows.Vs(1, 0, 256)).ok());
  CHECK(seq.Blocks(0, 0).records > before.records);
  CHECK(seq.HeadUsageOf(0, 0).payload_bytes < seq.HeadUsageOf(0, 1).payload_bytes);
}

TEST_CASE("KvSequence: LowerWidth refuses what it cannot do and changes nothing", "[controller]") {
  auto pool = MakeTestPool(8 << 20, kPage);
  KvSequence seq(pool.get(), {1, 2, kD, DType::kF32}, UniformPlans(1, 2, Kivi(4, 2)));
  const Rows rows = MakeRows(300, 2, 7);
  REQUIRE(seq.Append(0, rows.Ks(1, 0, 300), rows.Vs(1, 0, 300)).ok());
  const uint32_t pages = PagesUsed(*pool);
  const DenseKv dense = seq.FetchDense(0, 1);
  struct Case {
    int layer, head, k_bits, v_bits;
    const char* message;
  };
  for (const Case& c :
       {Case{0, 0, 8, 2, "expected at most 4/2"}, Case{0, 0, 4, 2, "with one lower"},
        Case{0, 0, 2, 1, "v_bits: got 1"}, Case{0, 0, 5, 1, "expected at most"},
        Case{1, 0, 2, 2, "layer: got 1"}, Case{0, 2, 2, 2, "head: got 2"}}) {
    Status s = seq.LowerWidth(c.layer, c.head, c.k_bits, c.v_bits);
    INFO(c.message << " / " << s.message());
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK_THAT(s.message(), Catch::Contains(c.message));
  }
  CHECK(PagesUsed(*pool) == pages);
  CHECK(seq.FetchDense(0, 1).k == dense.k);

  auto lossless_pool = MakeTestPool(8 << 20, kPage);
  std::vector<LayerPlan> plans = UniformPlans(1, 1, Kivi(4, 4));
  plans[0].lossless = true;
  KvSequence lossless(lossless_pool.get(), {1, 1, kD, DType::kF32}, plans);
  CHECK_THAT(lossless.LowerWidth(0, 0, 2, 2).message(), Catch::Contains("lossless"));
}

// Appends 128-token chunks of `rows` until an APPEND fails or the rows run out; returns the
// tokens appended and the failing status (OK if the rows ran out). The failed APPEND must leave the
// sequence exactly as it was.
std::pair<int64_t, Status> FillUntilFull(KvSequence* seq, const PageAllocator& pool,
                                         const Rows& rows, int layers) {
  int64_t appended = 0;
  while (appended + 128 <= rows.kv.tokens) {
    const DenseKv before = seq->FetchDense(0, layers);
    const uint32_t pages = PagesUsed(pool);
    Status s =
        seq->Append(appended, rows.Ks(layers, appended, 128), rows.Vs(layers, appended, 128));
    if (!s.ok()) {
      const DenseKv after = seq->FetchDense(0, layers);
      CHECK(after.k == before.k);
      CHECK(after.positions == before.positions);
      CHECK(PagesUsed(pool) == pages);
      CHECK(seq->tokens() == appended);
      return {appended, s};
    }
    appended += 128;
  }
  return {appended, OkStatus()};
}

TEST_CASE("KvSequence: under pool pressure an APPEND lowers widths instead of failing",
          "[controller]") {
  constexpr uint64_t kBigPage = 16384;
  constexpr int kLayers = 2, kHeads = 2;
  const QuantSpec spec = Kivi(8, 8);
  const Rows rows = MakeRows(4096, kHeads, 11);
  // Members go in reverse order: the sequence returns its pages before the pool goes.
  struct Run {
    std::unique_ptr<PageAllocator> pool;
    std::unique_ptr<KvSequence> seq;
    int64_t tokens = 0;
    Status status;
  };
  auto run = [&](PressureSettings pressure) {
    Run r;
    r.pool = MakeTestPool(64 * kBigPage, kBigPage);
    r.seq = std::make_unique<KvSequence>(
        r.pool.get(), SequenceGeometry{kLayers, kHeads, kD, DType::kF32},
        UniformPlans(kLayers, kHeads, spec), EvictionSettings{}, pressure);
    std::tie(r.tokens, r.status) = FillUntilFull(r.seq.get(), *r.pool, rows, kLayers);
    return r;
  };

  // Without relief: RESOURCE_EXHAUSTED once the 8-bit records fill the pool.
  auto [pool_fail, seq_fail, tokens_fail, status_fail] = run({});
  REQUIRE(status_fail.code() == StatusCode::kResourceExhausted);
  CHECK(seq_fail->Usage().pressure_reliefs == 0);

  // Nothing narrower than 8 bits allowed: relief cannot help, the error says why.
  auto [pool_min, seq_min, tokens_min, status_min] = run(LowerWidths(8));
  CHECK(tokens_min == tokens_fail);
  REQUIRE(status_min.code() == StatusCode::kResourceExhausted);
  CHECK_THAT(status_min.message(), Catch::Contains("budget.pressure: lowering every head"));

  // With relief: the same APPEND succeeds after lowering widths, every token is kept, and the
  // sequence grows well past the 8-bit limit before 2 bits fill the pool too.
  auto [pool_ok, seq_ok, tokens_ok, status_ok] = run(LowerWidths(2));
  CHECK(tokens_ok >= 2 * tokens_fail);
  const SequenceUsage u = seq_ok->Usage();
  CHECK(u.pressure_reliefs >= 1);
  CHECK(u.kept_tokens == tokens_ok * kLayers * kHeads);
  CHECK(u.evicted_tokens == 0);
  int lowered = 0;
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kHeads; ++h) {
      const HeadUsage hu = seq_ok->HeadUsageOf(l, h);
      CHECK(hu.k_bits >= 2);
      CHECK(hu.v_bits >= 2);
      CHECK(hu.tokens == tokens_ok);
      lowered += hu.k_bits < 8 || hu.v_bits < 8;
    }
  }
  CHECK(lowered > 0);
  const DenseKv dense = seq_ok->FetchDense(0, kLayers);
  for (int pair = 0; pair < kLayers * kHeads; ++pair) CHECK(dense.counts[pair] == tokens_ok);
  if (!status_ok.ok()) {
    CHECK(status_ok.code() == StatusCode::kResourceExhausted);
    CHECK_THAT(status_ok.message(), Catch::Contains("budget.pressure"));
  }
}

TEST_CASE("KvSequence: pressure relief lowers the head its curve says is cheapest",
          "[controller]") {
  constexpr uint64_t kBigPage = 16384;
  const QuantSpec spec = Kivi(8, 8);
  const Rows rows = MakeRows(4096, 2, 13);
  // Head 0 of each layer costs 1000x more per element than head 1.
  PressureSettings pressure = LowerWidths(2);
  for (int l = 0; l < 2; ++l) {
    pressure.curves.push_back({.k_scale = 1000, .beta_k = 4, .v_scale = 1000, .beta_v = 4});
    pressure.curves.push_back({.k_scale = 1, .beta_k = 4, .v_scale = 1, .beta_v = 4});
  }
  auto pool = MakeTestPool(64 * kBigPage, kBigPage);
  KvSequence seq(pool.get(), {2, 2, kD, DType::kF32}, UniformPlans(2, 2, spec), {}, pressure);
  int64_t appended = 0;
  while (seq.Usage().pressure_reliefs == 0) {
    REQUIRE(seq.Append(appended, rows.Ks(2, appended, 128), rows.Vs(2, appended, 128)).ok());
    appended += 128;
  }
  for (int l = 0; l < 2; ++l) {
    CHECK(seq.HeadSpec(l, 0).k_bits == 8);
    CHECK(seq.HeadSpec(l, 0).v_bits == 8);
  }
  CHECK((seq.HeadSpec(0, 1).k_bits < 8 || seq.HeadSpec(1, 1).k_bits < 8 ||
         seq.HeadSpec(0, 1).v_bits < 8 || seq.HeadSpec(1, 1).v_bits < 8));
}

// A joint sequence (1 layer x 2 heads x head_dim 32) planned from `budget_toml`,
// with budget.pressure = "requantize", in a pool of `pages` 4 KiB pages.
struct JointSequence {
  std::unique_ptr<PageAllocator> pool;
  std::unique_ptr<KvSequence> seq;
  std::vector<int64_t> caps;
};

JointSequence MakeJointSequence(const std::string& budget_toml, uint32_t pages,
                                const std::string& pressure) {
  const std::string path = testing::WriteTwoHeadProfile(1);
  Config c;
  REQUIRE(ApplyToml(c,
                    "[quant]\nmethod = \"kivi\"\nflush_tokens = 32\n[budget]\nmode = \"joint\"\n"
                    "pressure = \"" +
                        pressure + "\"\nprofile = \"" + path + "\"\n" + budget_toml,
                    "t.toml")
              .ok());
  REQUIRE(ValidateConfig(c).ok());
  const SequenceShape shape{1, 2, 0, 32, 0};
  const QuantSpec spec = MakeQuantSpec(QuantMethod::kKivi, 32, 2, 2).value();
  std::vector<LayerPlan> plans = UniformPlans(1, 2, spec);
  plans[0].rules.flush_tokens = 32;
  JointSequence out;
  JointPlanInput input;
  REQUIRE(ApplyBudgetWidths(c, shape, &plans, &out.caps, &input).ok());
  StatusOr<EvictionSettings> eviction = ResolveEviction(c, shape, out.caps);
  REQUIRE(eviction.ok());
  StatusOr<PressureSettings> pressure_settings = ResolvePressure(c, shape, &input);
  REQUIRE(pressure_settings.ok());
  CHECK((pressure_settings->joint != nullptr) == (pressure == "requantize"));
  std::remove(path.c_str());
  out.pool = MakeTestPool(uint64_t{pages} * kPage, kPage);
  out.seq = std::make_unique<KvSequence>(out.pool.get(), SequenceGeometry{1, 2, 32, DType::kF32},
                                         std::move(plans), *eviction, *pressure_settings);
  return out;
}

// Appends 16-token chunks of `kv` until its end or an error.
std::pair<int64_t, Status> AppendChunks(KvSequence* seq, const SyntheticKv& kv) {
  int64_t t = 0;
  for (; t + 16 <= kv.tokens; t += 16) {
    Status s = seq->Append(t, {kv.KView().Tokens(t, 16)}, {kv.VView().Tokens(t, 16)});
    if (!s.ok()) return {t, s};
  }
  return {t, OkStatus()};
}

TEST_CASE("KvSequence: a joint sequence under pressure lowers widths when that is cheaper",
          "[controller][evict]") {
  const SyntheticKv kv =
      GenerateSyntheticKv({.tokens = 2048, .heads = 2, .head_dim = 32, .seed = 3});
  // A generous budget: the plan keeps most tokens at 4 bits. The profile has no attention
  // demand, so its eviction curves are uniform (every token equally attended) and evicting is
  // the expensive lever.
  const std::string budget = "fp16_fraction = 0.9\nplan_tokens = 2048\n";
  JointSequence failing = MakeJointSequence(budget, 24, "fail");
  auto [fail_at, fail_status] = AppendChunks(failing.seq.get(), kv);
  REQUIRE(fail_status.code() == StatusCode::kResourceExhausted);
  JointSequence relieved = MakeJointSequence(budget, 24, "requantize");
  REQUIRE(relieved.seq->HeadSpec(0, 0).k_bits == 4);
  // Up to the first relief: it lowered widths and cut no cap.
  int64_t t = 0;
  for (; relieved.seq->Usage().pressure_reliefs == 0; t += 16) {
    REQUIRE(t + 16 <= kv.tokens);
    REQUIRE(relieved.seq->Append(t, {kv.KView().Tokens(t, 16)}, {kv.VView().Tokens(t, 16)}).ok());
  }
  CHECK(t > fail_at);
  CHECK(relieved.seq->Usage().pressure_cap_cuts == 0);
  CHECK(relieved.seq->Usage().evicted_tokens == 0);
  CHECK((relieved.seq->HeadSpec(0, 0).k_bits < 4 || relieved.seq->HeadSpec(0, 1).k_bits < 4 ||
         relieved.seq->HeadSpec(0, 0).v_bits < 4 || relieved.seq->HeadSpec(0, 1).v_bits < 4));
  for (int h = 0; h < 2; ++h) CHECK(relieved.seq->HeadUsageOf(0, h).budget == relieved.caps[h]);
  // Later, with the cheap head at 2 bits, reliefs cut the cheap head's cap instead of lowering
  // the sensitive head (alpha 100x): every APPEND still succeeds.
  for (; t + 16 <= kv.tokens; t += 16) {
    const Status s =
        relieved.seq->Append(t, {kv.KView().Tokens(t, 16)}, {kv.VView().Tokens(t, 16)});
    INFO("t " << t << ": " << s.ToString());
    REQUIRE(s.ok());
  }
  CHECK(relieved.seq->Usage().pressure_cap_cuts >= 1);
  CHECK(relieved.seq->HeadSpec(0, 0).k_bits == 2);
  CHECK(relieved.seq->HeadSpec(0, 1).k_bits == 4);
  CHECK(relieved.seq->HeadSpec(0, 1).v_bits == 4);
  CHECK(relieved.seq->HeadUsageOf(0, 0).budget < relieved.caps[0]);
  CHECK(relieved.seq->HeadUsageOf(0, 1).budget == relieved.caps[1]);
}

TEST_CASE("KvSequence: a joint sequence that may not lower widths evicts under pressure",
          "[controller][evict]") {
  const SyntheticKv kv =
      GenerateSyntheticKv({.tokens = 640, .heads = 2, .head_dim = 32, .seed = 4});
  // budget.pressure_min_bits = 4 with 4-bit widths: lowering widths is not allowed, so the relief
  // cuts token caps.
  const std::string budget = "fp16_fraction = 0.9\nplan_tokens = 512\npressure_min_bits = 4\n";
  JointSequence failing = MakeJointSequence(budget, 10, "fail");
  REQUIRE(failing.seq->HeadSpec(0, 0).k_bits == 4);
  REQUIRE(failing.seq->HeadSpec(0, 1).k_bits == 4);
  auto [fail_at, fail_status] = AppendChunks(failing.seq.get(), kv);
  REQUIRE(fail_status.code() == StatusCode::kResourceExhausted);
  JointSequence relieved = MakeJointSequence(budget, 10, "requantize");
  auto [ok_at, ok_status] = AppendChunks(relieved.seq.get(), kv);
  INFO(ok_status.ToString());
  CHECK(ok_at > fail_at);
  const SequenceUsage u = relieved.seq->Usage();
  CHECK(u.pressure_cap_cuts >= 1);
  CHECK(u.pressure_reliefs >= u.pressure_cap_cuts);
  CHECK(relieved.seq->HeadSpec(0, 0).k_bits == 4);
  CHECK(relieved.seq->HeadSpec(0, 1).k_bits == 4);
  CHECK(u.evicted_tokens > 0);
  int64_t cut = 0;
  for (int h = 0; h < 2; ++h) {
    const HeadUsage hu = relieved.seq->HeadUsageOf(0, h);
    CHECK(hu.budget <= relieved.caps[h]);
    CHECK(hu.tokens <= hu.budget);
    cut += relieved.caps[h] - hu.budget;
  }
  CHECK(cut > 0);
}

TEST_CASE("Config: budget.pressure is checked and named in errors", "[controller][config]") {
  Config c;
  REQUIRE(ApplyToml(c, "[budget]\npressure = \"requantize\"\npressure_min_bits = 3\n", "t").ok());
  CHECK(ValidateConfig(c).ok());
  CHECK(c.budget.pressure == PressurePolicy::kRequantize);
  CHECK(c.budget.pressure_min_bits == 3);
  Config lossless = c;
  REQUIRE(ApplyToml(lossless, "[quant]\nlossless = true\n", "t").ok());
  CHECK_THAT(ValidateConfig(lossless).message(),
             Catch::Contains("budget.pressure: got \"requantize\", expected \"fail\""));
  Config pool_with_fail;
  REQUIRE(ApplyToml(pool_with_fail, "[budget]\npressure_scope = \"pool\"\n", "t").ok());
  CHECK_THAT(ValidateConfig(pool_with_fail).message(),
             Catch::Contains("budget.pressure_scope: got \"pool\", expected \"sequence\""));
  Config bad;
  CHECK_THAT(ApplyToml(bad, "[budget]\npressure = \"evict\"\n", "t").message(),
             Catch::Contains("budget.pressure"));
  CHECK_THAT(ApplyToml(bad, "[budget]\npressure_min_bits = 0\n", "t").message(),
             Catch::Contains("budget.pressure_min_bits"));
}

}  // namespace
}  // namespace kvctl
