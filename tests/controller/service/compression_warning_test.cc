// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The warning a configuration that cannot compress what it is asked to gets at OPEN
// (controller/sequence/budget_resolve.h CompressionOutlookOf): R-KV keeping 25 % of the tokens
// with KVarN at 128 fp16 sinks (set explicitly: the registry's default was 128 until issue #18) +
// 128-row flush quantizes nothing before 1021 tokens; a
// tokens_per_head cap below sinks + flush never quantizes; a config that compresses is silent; a
// memory budget (budget.fp16_fraction) is aimed before its onset is taken.
// The warning is logged once per message and shown on the sequence's STATS line.
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

#include "controller/config/config.h"
#include "controller/sequence/budget_resolve.h"
#include "controller/service/controller.h"

namespace kvctl {
namespace {

constexpr uint32_t kLayers = 2, kKvHeads = 2, kQHeads = 4, kHeadDim = 64;

Config WithToml(const std::string& toml) {
  Config c;
  REQUIRE(ApplyToml(c, toml, "t.toml").ok());
  REQUIRE(ValidateConfig(c).ok());
  return c;
}

// The outlook of a new sequence as OPEN computes it, without a pool.
CompressionOutlook OutlookOf(const Config& c) {
  StatusOr<StreamingRules> rules = ResolveStreamingRules(c, "m", kHeadDim);
  REQUIRE(rules.ok());
  std::vector<LayerPlan> plans(kLayers);
  for (uint32_t l = 0; l < kLayers; ++l) {
    plans[l].lossless = c.quant.lossless;
    plans[l].rules = *rules;
    for (uint32_t h = 0; h < kKvHeads; ++h) {
      StatusOr<QuantSpec> spec = ResolveQuantSpec(c, "m", kHeadDim, l, h);
      REQUIRE(spec.ok());
      plans[l].head_specs.push_back(*spec);
    }
  }
  const SequenceShape shape{kLayers, kKvHeads, kQHeads, kHeadDim,
                            c.quant.lossless ? 0 : rules->sink_tokens};
  StatusOr<EvictionSettings> ev = ResolveEviction(c, shape);
  REQUIRE(ev.ok());
  AimEvictionAtMemory(c, plans, kHeadDim, DType::kF16, &*ev);  // As OPEN does.
  return CompressionOutlookOf(c, shape, plans, *ev);
}

std::string Causes(const CompressionOutlook& o) {
  std::string s;
  for (const CompressionWarning& w : o.warnings) s += w.cause + ";";
  return s;
}

const char* kRkv25 =
    "[budget]\nmode = \"evict-only\"\ntoken_fraction = 0.25\n[evict]\npolicy = \"rkv\"\n";
// KVarN (the built-in method) with 128 sinks set explicitly.
const char* kSinks128 = "[quant]\nsink_tokens = 128\n";
const std::string kRkv25Kvarn = std::string(kRkv25) + kSinks128;
// KIVI flushing every 32 tokens, no sinks (set explicitly).
const char* kKiviFlush32 = "[quant]\nmethod = \"kivi\"\nsink_tokens = 0\nflush_tokens = 32\n";
// R-KV at 1/8 of fp16 memory over 2-bit KIVI (head_dim 64: 1,536-byte records of 32 tokens, 48
// bytes a token against 256 in fp16): f = 0.125 x 256 / 48 = 2/3, and the mean tail of 16 rows
// costs 16 x (256 - 48) bytes more than records, 70 kept tokens (rounded up). A head quantizes
// once it holds the 32-row flush: ceil(2T / 3) - 70 >= 32 from T = 152.
const char* kRkvMemory8 =
    "[budget]\nmode = \"evict-only\"\nfp16_fraction = 0.125\n[evict]\npolicy = \"rkv\"\n"
    "[quant]\nmethod = \"kivi\"\nk_bits = 2\nv_bits = 2\nsink_tokens = 0\nflush_tokens = 32\n";

TEST_CASE("Compression outlook: R-KV 25 % with KVarN warns, compressing configs do not",
          "[controller][budget]") {
  SECTION("R-KV 25 % + KVarN with 128 sinks: nothing quantized before 1021 tokens") {
    const CompressionOutlook o = OutlookOf(WithToml(kRkv25Kvarn));
    CHECK(o.onset_tokens == 1021);  // The first T with ceil(0.25 T) >= 128 sinks + 128 flush.
    REQUIRE(Causes(o) == "late_quantization;");
    CHECK(o.warnings[0].message.find("quant.sink_tokens 128 + quant.flush_tokens 128 = 256") !=
          std::string::npos);
    CHECK(o.warnings[0].message.find("before a sequence reaches 1021 tokens") != std::string::npos);
  }
  SECTION("the same eviction with KIVI flushing every 32 tokens compresses") {
    const CompressionOutlook o = OutlookOf(WithToml(std::string(kRkv25) + kKiviFlush32));
    CHECK(o.onset_tokens == 125);  // ceil(0.25 T) >= 0 sinks + 32 flush.
    CHECK(o.warnings.empty());
  }
  SECTION("a memory budget's onset counts what its fp16 tail costs") {
    const CompressionOutlook o = OutlookOf(WithToml(kRkvMemory8));
    CHECK(o.onset_tokens == 152);
    CHECK(o.warnings.empty());
  }
  SECTION("a tokens_per_head cap below sinks + flush never quantizes") {
    const CompressionOutlook o = OutlookOf(
        WithToml("[budget]\nmode = \"evict-only\"\ntokens_per_head = 200\n[evict]\npolicy = "
                 "\"streaming\"\n" +
                 std::string(kSinks128)));
    CHECK(o.onset_tokens == -1);
    REQUIRE(Causes(o) == "never_quantized;");
    CHECK(o.warnings[0].message.find("budget.tokens_per_head 200 keeps at most 200 tokens") !=
          std::string::npos);
  }
  SECTION("a cap above sinks + flush compresses") {
    const CompressionOutlook o = OutlookOf(
        WithToml("[budget]\nmode = \"evict-only\"\ntokens_per_head = 300\n[evict]\npolicy = "
                 "\"streaming\"\n" +
                 std::string(kSinks128)));
    CHECK(o.onset_tokens == 256);
    CHECK(o.warnings.empty());
  }
  SECTION("sinks + flush past a short sequence warns without eviction") {
    const CompressionOutlook o = OutlookOf(WithToml("[quant]\nsink_tokens = 512\n"));
    CHECK(o.onset_tokens == 640);
    CHECK(Causes(o) == "late_quantization;");
  }
  SECTION("defaults, lossless and fp16 rows do not warn") {
    CHECK(OutlookOf(Config()).warnings.empty());
    CHECK(OutlookOf(Config()).onset_tokens == 160);  // KVarN's default 32 sinks + 128 flush.
    CHECK(OutlookOf(WithToml("[quant]\nlossless = true\n")).onset_tokens == 0);
    const CompressionOutlook fp16 =
        OutlookOf(WithToml(std::string(kRkv25) + "[quant]\nmethod = \"fp16\"\n"));
    CHECK(fp16.warnings.empty());
    CHECK(fp16.onset_tokens == 0);
  }
}

// evict.full_heads: the named heads keep every token, so the onset is the other heads', which
// keep less, and a budget the named heads fill leaves the others their floor (over budget).
TEST_CASE("Compression outlook: full heads delay the others' onset and can outgrow the budget",
          "[controller][budget]") {
  // R-KV keeping `fraction` of the tokens over KIVI flushing every 32 tokens, no sinks.
  auto rkv = [](const std::string& fraction, const std::string& full_heads) {
    std::string toml = "[budget]\nmode = \"evict-only\"\ntoken_fraction = " + fraction +
                       "\n[evict]\npolicy = \"rkv\"\n";
    if (!full_heads.empty()) toml += "full_heads = \"" + full_heads + "\"\n";
    return WithToml(toml + kKiviFlush32);
  };
  SECTION("without full heads a head at half the tokens holds 32 rows from 63 tokens") {
    CHECK(OutlookOf(rkv("0.5", "")).onset_tokens == 63);
  }
  SECTION("one of the 4 heads full: the other 3 keep (4 ceil(T / 2) - T) / 3, 32 from 95") {
    const CompressionOutlook o = OutlookOf(rkv("0.5", "0:0"));
    CHECK(o.onset_tokens == 95);
    CHECK(o.warnings.empty());
  }
  SECTION("a fraction the full head all but fills: no onset within any sequence, no overflow") {
    const CompressionOutlook o = OutlookOf(rkv("0.2500000000000001", "1:1"));
    CHECK(o.onset_tokens == -1);
    // Not over budget (the others get the 1e-16 of the tokens left), but starved and never
    // quantized.
    CHECK(Causes(o) == "full_heads_starve_others;never_quantized;");
  }
  SECTION("one of 4 full at 0.35: the others keep (1.4 - 1) / 3 = 0.133 < 0.175, starved") {
    const CompressionOutlook o = OutlookOf(rkv("0.35", "0:0"));
    REQUIRE(Causes(o) == "full_heads_starve_others;");
    CHECK(o.warnings[0].message.find("names 1 of the 4 (layer, head) pairs, which keep every "
                                     "token of budget.token_fraction 0.35; the other heads keep "
                                     "0.133333") != std::string::npos);
    CHECK(o.onset_tokens > 0);  // They still quantize, late.
  }
  SECTION("one of 4 full at 0.45: the others keep 0.267 >= 0.225, no warning") {
    CHECK(OutlookOf(rkv("0.45", "0:0")).warnings.empty());
  }
  SECTION("a quarter of the heads full at token_fraction 0.25: the others keep their floor") {
    const CompressionOutlook o = OutlookOf(rkv("0.25", "1:1"));
    REQUIRE(Causes(o) == "full_heads_over_budget;");
    CHECK(o.onset_tokens == -1);  // The floor is below the 32-row flush.
    CHECK(o.warnings[0].message.find("names 1 of the 4 (layer, head) pairs, at least "
                                     "budget.token_fraction 0.25 of them") != std::string::npos);
  }
  // The floor: 128 sinks + the streaming window's 8 tokens = 136; 4 x 300 - 3 x 136 = 792.
  SECTION("with tokens_per_head the full head outgrows it once T passes 4 x 300 - 3 floor") {
    const CompressionOutlook o =
        OutlookOf(WithToml("[budget]\nmode = \"evict-only\"\ntokens_per_head = 300\n[evict]\n"
                           "policy = \"streaming\"\nfull_heads = \"0:1\"\n" +
                           std::string(kSinks128)));
    REQUIRE(Causes(o) == "full_heads_over_budget;");
    CHECK(o.onset_tokens == 256);
    CHECK(o.warnings[0].message.find("from 792 tokens on the other heads keep only their floor "
                                     "of 136 tokens") != std::string::npos);
  }
}

std::string UniqueShmName() {
  static int counter = 0;
  return "/kvctl-cw-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

// A controller on `toml`, one session with queries, `opens` sequences; returns its STATS.
std::string OpenAndStats(const std::string& toml, int opens) {
  Config config = WithToml(toml);
  config.pool.bytes = 8 << 20;
  config.pool.page_bytes = 64 << 10;
  config.pool.shm_name = UniqueShmName();
  config.pool.staging_slots = 0;
  StatusOr<std::unique_ptr<Controller>> created = Controller::Create(config);
  REQUIRE(created.ok());
  Controller& controller = **created;
  const SteadyTime now = std::chrono::steady_clock::now();
  ipc::HelloRequest hello;
  hello.client_name = "cw_test";
  hello.geometry = {kLayers, kKvHeads, kQHeads, kHeadDim, DType::kF16};
  StatusOr<ipc::HelloReply> reply = controller.Hello(hello, now);
  REQUIRE(reply.ok());
  for (int i = 1; i <= opens; ++i)
    REQUIRE(controller.Open({reply->session_id, uint64_t(i)}, now).ok());
  StatusOr<std::string> text = controller.Stats({0, "sequences"}, now);
  REQUIRE(text.ok());
  return *text;
}

TEST_CASE("Compression warning: logged once at OPEN and shown in STATS", "[controller][budget]") {
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("cw_test", ring));
  const std::string warned = OpenAndStats(kRkv25Kvarn, 2);
  const std::string quiet = OpenAndStats(std::string(kRkv25) + kKiviFlush32, 1);
  const std::string memory = OpenAndStats(kRkvMemory8, 1);  // OPEN aims the budget at memory.
  spdlog::set_default_logger(previous);
  std::vector<std::string> lines = ring->last_formatted();
  int warnings = 0;
  for (const std::string& line : lines) {
    if (line.find("cannot compress") != std::string::npos) {
      ++warnings;
      CHECK(line.find("before a sequence reaches 1021 tokens") != std::string::npos);
    }
  }
  CHECK(warnings == 1);  // Two OPENs with the same cause: one line.
  CHECK(warned.find("\nsequences_compression_warning:2\n") != std::string::npos);
  CHECK(warned.find(",quant_onset_tokens=1021,compression_warning=late_quantization") !=
        std::string::npos);
  CHECK(quiet.find("\nsequences_compression_warning:0\n") != std::string::npos);
  CHECK(quiet.find(",quant_onset_tokens=125,compression_warning=none") != std::string::npos);
  CHECK(memory.find(",quant_onset_tokens=152,compression_warning=none") != std::string::npos);
}

}  // namespace
}  // namespace kvctl
