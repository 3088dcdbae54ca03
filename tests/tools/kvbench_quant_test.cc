// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvbench_quant.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/half.h"
#include "tests/tools/tools_test_util.h"
#include "tools/npy.h"

namespace kvctl {
namespace {

using Catch::Matchers::Contains;
using testing::TempDir;

QuantBenchContext TinyContext(int64_t tokens, int heads, int q_heads) {
  StatusOr<QuantBenchInput> in = MakeSyntheticInput(
      {.tokens = tokens, .heads = heads, .head_dim = 128, .q_heads = q_heads, .seed = 3});
  REQUIRE(in.ok());
  StatusOr<QuantBenchContext> ctx = PrepareQuantBench(std::move(*in), 64);
  REQUIRE(ctx.ok());
  return std::move(*ctx);
}

TEST_CASE("KvbenchQuant: rows on a tiny input have the expected bits and errors", "[tools]") {
  // 600 tokens: no method's block or flush divides it, so the leftover and tail paths run too.
  const QuantBenchContext ctx = TinyContext(600, 2, 4);
  std::map<std::string, QuantRowAccuracy> rows;
  for (const QuantRowSpec& r : DefaultQuantRows()) {
    StatusOr<QuantRowAccuracy> a = ComputeQuantRow(ctx, r);
    INFO(QuantRowLabel(r) << ": " << a.status().message());
    REQUIRE(a.ok());
    rows[QuantRowLabel(r)] = *a;
  }
  REQUIRE(rows.size() == 18);

  // 8-bit KIVI is the near-lossless check.
  CHECK(rows["kivi 8"].pure.k_rel_mse < 1e-4);
  CHECK(rows["kivi 8"].pure.v_rel_mse < 1e-4);
  CHECK(rows["kivi 8"].streaming.k_rel_mse < 1e-4);
  CHECK(rows["fp16"].pure.k_rel_mse < 1e-6);
  CHECK(rows["fp16"].pure.attn_rel_err < 1e-2);
  CHECK(rows["fp16"].pure.bits_per_element == 16.0);

  // KVarN k2v2, G = D = 128: 2 + 16 * (2*128 + 128) / (128*128) = 2.375 (docs/algorithms.md §6.4).
  const QuantRowAccuracy& kvarn = rows["kvarn 2"];
  CHECK(kvarn.spec.block_tokens == 128);
  CHECK(kvarn.pure.bits_per_element == Approx(2.375).epsilon(1e-12));
  CHECK(kvarn.registry_bpe.average == Approx(2.375).epsilon(1e-12));
  // TurboQuant 2-bit, D = 128: 2 + 16 / 128 (an fp16 norm per token, docs/algorithms.md §20.3).
  CHECK(rows["turbo 2"].pure.bits_per_element == Approx(2.125).epsilon(1e-12));
  CHECK(rows["kvarn k4v2"].pure.bits_per_element == Approx(3.375).epsilon(1e-12));

  // Token accounting: pure rounds T down to G; streaming keeps sinks and a partial flush fp16.
  CHECK(rows["kivi 2"].pure.quantized_tokens == 576);
  CHECK(rows["kivi 2"].streaming.quantized_tokens == 512);
  CHECK(kvarn.pure.quantized_tokens == 512);
  CHECK(kvarn.streaming.quantized_tokens == 512);  // 32 sinks, then four flushes of 128.
  CHECK(rows["oscar 2"].streaming.quantized_tokens == 512);
  CHECK(rows["kivi 2"].pure.records == 576 / 32 * 2);

  for (const auto& [label, a] : rows) {
    INFO(label);
    CHECK(a.pure.bits_per_element == Approx(a.registry_bpe.average).epsilon(1e-12));
    CHECK(a.streaming.bits_per_element == Approx(a.registry_effective_bpe).epsilon(1e-12));
    if (a.row.method == QuantMethod::kFp16) continue;
    CHECK(a.streaming.bits_per_element > a.pure.bits_per_element);
    CHECK(a.streaming.bits_per_element < 16.0);
    CHECK(a.pure.attn_rel_err > 0.0);
  }

  // More bits, less error, for every method and every measure.
  for (const char* m : {"kivi", "quarot", "kvarn", "oscar", "turbo"}) {
    const std::string name(m);
    const QuantRowAccuracy& b2 = rows[name + " 2"];
    const QuantRowAccuracy& b3 = rows[name + " 3"];
    const QuantRowAccuracy& b4 = rows[name + " 4"];
    INFO(name);
    for (auto mode : {&QuantRowAccuracy::pure, &QuantRowAccuracy::streaming}) {
      CHECK((b2.*mode).k_rel_mse > (b3.*mode).k_rel_mse);
      CHECK((b3.*mode).k_rel_mse > (b4.*mode).k_rel_mse);
      CHECK((b2.*mode).v_rel_mse > (b3.*mode).v_rel_mse);
      CHECK((b3.*mode).v_rel_mse > (b4.*mode).v_rel_mse);
      CHECK((b2.*mode).attn_rel_err > (b3.*mode).attn_rel_err);
      CHECK((b3.*mode).attn_rel_err > (b4.*mode).attn_rel_err);
    }
  }
  // k4v2 has 4-bit K (same as kvarn 4) and 2-bit V (same as kvarn 2): records are per block.
  CHECK(rows["kvarn k4v2"].pure.k_rel_mse == rows["kvarn 4"].pure.k_rel_mse);
  CHECK(rows["kvarn k4v2"].pure.v_rel_mse == rows["kvarn 2"].pure.v_rel_mse);
}

TEST_CASE("KvbenchQuant: attention probe is causal softmax with the GQA head mapping", "[tools]") {
  // K is zero except token 14, whose scores dwarf the rest: positions 12 and 13 average V over
  // their prefix, positions 14 and 15 return V of token 14. Query head qh reads KV head qh / 2.
  QuantBenchInput in;
  in.tokens = 16;
  in.heads = 2;
  in.q_heads = 4;
  in.head_dim = 8;
  in.k.assign(16 * 2 * 8, 0.0f);
  in.v.resize(in.k.size());
  in.q.assign(16 * 4 * 8, 1.0f);
  for (int t = 0; t < 16; ++t) {
    for (int h = 0; h < 2; ++h) {
      for (int c = 0; c < 8; ++c) in.v[(t * 2 + h) * 8 + c] = static_cast<float>((h + 1) * t + c);
      for (int c = 0; c < 8 && t == 14; ++c) in.k[(t * 2 + h) * 8 + c] = 10.0f;
    }
  }
  StatusOr<QuantBenchContext> ctx = PrepareQuantBench(in, 4);
  REQUIRE(ctx.ok());
  REQUIRE(ctx->probe_positions == std::vector<int64_t>{12, 13, 14, 15});
  for (int i = 0; i < 4; ++i) {
    const int t = 12 + i;
    for (int qh = 0; qh < 4; ++qh) {
      const int h = qh / 2;
      for (int c = 0; c < 8; ++c) {
        // Mean over j <= t of (h+1) j + c is (h+1) t / 2 + c.
        const double want = t < 14 ? (h + 1) * t / 2.0 + c : (h + 1) * 14.0 + c;
        CHECK(ctx->probe_out[(i * 4 + qh) * 8 + c] == Approx(want).epsilon(1e-6));
      }
    }
  }
  CHECK_FALSE(PrepareQuantBench(in, 17).ok());
  CHECK_FALSE(PrepareQuantBench(in, 0).ok());

  // Without queries the probe draws Gaussian ones, one per KV head.
  in.q.clear();
  in.q_heads = 2;
  ctx = PrepareQuantBench(in, 4);
  REQUIRE(ctx.ok());
  REQUIRE(ctx->probe_q.size() == 4 * 2 * 8);
  CHECK(ctx->probe_q[0] != ctx->probe_q[1]);
}

TEST_CASE("KvbenchQuant: row selection by --methods and --bits", "[tools]") {
  auto labels = [](const std::vector<std::string>& methods, const std::vector<std::string>& bits) {
    StatusOr<std::vector<QuantRowSpec>> rows = SelectQuantRows(methods, bits);
    REQUIRE(rows.ok());
    std::vector<std::string> out;
    for (const QuantRowSpec& r : *rows) out.push_back(QuantRowLabel(r));
    return out;
  };
  CHECK(labels({}, {}).size() == 18);
  CHECK(labels({"kvarn"}, {}) ==
        std::vector<std::string>{"kvarn 2", "kvarn 3", "kvarn 4", "kvarn k4v2"});
  CHECK(labels({}, {"4"}) ==
        std::vector<std::string>{"fp16", "kivi 4", "quarot 4", "kvarn 4", "oscar 4", "turbo 4"});
  CHECK(labels({"fp16", "kivi"}, {"8"}) == std::vector<std::string>{"fp16", "kivi 8"});
  CHECK(labels({"kvarn"}, {"k4v2"}) == std::vector<std::string>{"kvarn k4v2"});
  CHECK(labels({"fp16"}, {}) == std::vector<std::string>{"fp16"});
  CHECK_THAT(SelectQuantRows({"kivi", "bogus"}, {}).status().message(),
             Contains("--methods: method: got \"bogus\""));
  CHECK_THAT(SelectQuantRows({}, {"5"}).status().message(), Contains("--bits: got \"5\""));
  CHECK_THAT(SelectQuantRows({"quarot"}, {"8"}).status().message(),
             Contains("no quantizer row matches"));
}

struct CommandResult {
  int rc = -1;
  std::string out, err;
};

std::string ReadAll(std::FILE* f) {
  std::string s;
  std::rewind(f);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

CommandResult Run(const QuantBenchOptions& options, bool json = false) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  REQUIRE(out != nullptr);
  REQUIRE(err != nullptr);
  CommandResult r;
  r.rc = RunQuantCommand(options, json, out, err);
  r.out = ReadAll(out);
  r.err = ReadAll(err);
  return r;
}

QuantBenchOptions SmallOptions() {
  QuantBenchOptions o;
  o.synthetic = {.tokens = 256, .heads = 1, .head_dim = 128, .seed = 2};
  o.reps = 1;
  return o;
}

// One line on stderr, nothing on stdout, exit status 1.
void ExpectFailure(const QuantBenchOptions& options, const std::string& needle) {
  const CommandResult r = Run(options);
  INFO(r.err);
  CHECK(r.rc == 1);
  CHECK(r.out.empty());
  CHECK_THAT(r.err, Contains("kvbench quant: ") && Contains(needle));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("KvbenchQuant: the command prints JSON or a table and exits 0", "[tools]") {
  QuantBenchOptions o = SmallOptions();
  o.methods = {"kivi", "kvarn"};
  o.bits = {"2"};
  CommandResult r = Run(o, /*json=*/true);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.err.empty());
  CHECK(r.out.front() == '{');
  CHECK_THAT(r.out, Contains("\"label\": \"kivi 2\"") && Contains("\"label\": \"kvarn 2\"") &&
                        Contains("\"bits_per_element\": 2.375") && Contains("\"active\": \"") &&
                        Contains("\"quantize_vs_memcpy\"") && !Contains("nan") && !Contains("inf"));
  r = Run(o);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Contains("kivi 2") && Contains(">=0.50 ") && Contains(">=0.10 ") &&
                        Contains("memcpy of"));
  o.throughput = false;
  r = Run(o);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, !Contains("Throughput"));
}

TEST_CASE("KvbenchQuant: --sinkhorn-iters runs each KVarN row once per count", "[tools]") {
  QuantBenchOptions o = SmallOptions();
  o.methods = {"kivi", "kvarn"};
  o.bits = {"2"};
  o.sinkhorn_iters = {1, 16};
  o.throughput = false;
  CommandResult r = Run(o, /*json=*/true);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Contains("\"label\": \"kivi 2\"") && Contains("\"label\": \"kvarn 2 it1\"") &&
                        Contains("\"label\": \"kvarn 2 it16\"") &&
                        Contains("\"sinkhorn_iters\": 1,") && Contains("\"sinkhorn_iters\": 16,") &&
                        !Contains("\"label\": \"kvarn 2\""));
  // The 0.1x target is the registry's iteration count's; an override row has none.
  o.throughput = true;
  o.methods = {"kvarn"};
  o.sinkhorn_iters = {1};
  r = Run(o);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Contains("kvarn 2 it1") && !Contains(">=0.10 "));
  o.sinkhorn_iters = {};
  r = Run(o);
  REQUIRE(r.rc == 0);
  CHECK_THAT(r.out, Contains(">=0.10 "));
  for (int bad : {0, 65}) {
    o.sinkhorn_iters = {4, bad};
    ExpectFailure(o, "--sinkhorn-iters: got " + std::to_string(bad) + ", expected 1..64");
  }
}

TEST_CASE("KvbenchQuant: bad input exits 1 with one clear message", "[tools]") {
  QuantBenchOptions o = SmallOptions();
  TempDir dir;
  o.input_dir = dir.Path("missing");
  ExpectFailure(o, "missing: no such directory");

  // k.npy only.
  o.input_dir = dir.Path("");
  std::vector<float> kv(256 * 2 * 128, 0.5f);
  REQUIRE(WriteNpy(dir.Path("k.npy"), {256, 2, 128}, kv.data(), NpyDType::kF16).ok());
  ExpectFailure(o, "v.npy: no such file");
  REQUIRE(WriteNpy(dir.Path("v.npy"), {256, 2, 64}, kv.data(), NpyDType::kF16).ok());
  ExpectFailure(o, "v.npy: shape: got (256, 2, 64), expected (256, 2, 128)");
  REQUIRE(WriteNpy(dir.Path("v.npy"), {256, 2, 128}, kv.data()).ok());
  REQUIRE(WriteNpy(dir.Path("q.npy"), {256, 3, 128}, kv.data()).ok());
  ExpectFailure(o, "q.npy: shape: got (256, 3, 128), expected query heads a multiple of the 2");
  REQUIRE(WriteNpy(dir.Path("q.npy"), {255, 2, 128}, kv.data()).ok());
  ExpectFailure(o, "q.npy: shape: got (255, 2, 128), expected (256, *, 128)");
  std::filesystem::remove(dir.Path("q.npy"));
  REQUIRE(WriteNpy(dir.Path("k.npy"), {256, 256}, kv.data()).ok());
  ExpectFailure(o, "k.npy: shape: got (256, 256), expected (tokens, heads, head_dim)");
  kv[1000] = NAN;
  REQUIRE(WriteNpy(dir.Path("k.npy"), {256, 2, 128}, kv.data()).ok());
  ExpectFailure(o, "k.npy");
  kv[1000] = 0.5f;
  std::FILE* junk = std::fopen(dir.Path("k.npy").c_str(), "wb");
  REQUIRE(junk != nullptr);
  std::fputs("not numpy", junk);
  std::fclose(junk);
  ExpectFailure(o, "k.npy: magic");

  o = SmallOptions();
  o.methods = {"kivi", "bogus"};
  ExpectFailure(o, "--methods: method: got \"bogus\"");
  o = SmallOptions();
  o.simd = "neon";
  ExpectFailure(o, "--simd: got \"neon\"");
  o = SmallOptions();
  o.input_form = "bf16";
  ExpectFailure(o, "--input-form: got \"bf16\", expected fp32 or fp16");
  o = SmallOptions();
  o.synthetic.head_dim = 96;  // No Hadamard of size 96.
  ExpectFailure(o, "quarot 2: head_dim: got 96");
  o = SmallOptions();
  o.synthetic.tokens = 100;  // Fewer than one KVarN block.
  ExpectFailure(o, "kvarn 2: tokens: got 100, expected at least block_tokens 128");
  o.synthetic.tokens = 0;
  ExpectFailure(o, "--tokens: got 0");
  o = SmallOptions();
  o.synthetic.q_heads = 3;
  o.synthetic.heads = 2;
  ExpectFailure(o, "--q-heads: got 3");
  o = SmallOptions();
  o.reps = 0;
  ExpectFailure(o, "--reps: got 0");
}

TEST_CASE("KvbenchQuant: --input reads fp16/fp32 dumps, with or without q.npy", "[tools]") {
  const SyntheticKv kv =
      GenerateSyntheticKv({.tokens = 256, .heads = 2, .head_dim = 64, .q_heads = 4, .seed = 9});
  TempDir dir;
  REQUIRE(WriteNpy(dir.Path("k.npy"), {256, 2, 64}, kv.k.data(), NpyDType::kF16).ok());
  REQUIRE(WriteNpy(dir.Path("v.npy"), {256, 2, 64}, kv.v.data(), NpyDType::kF32).ok());
  REQUIRE(WriteNpy(dir.Path("q.npy"), {256, 4, 64}, kv.q.data(), NpyDType::kF16, 2).ok());
  StatusOr<QuantBenchInput> in = LoadQuantBenchInput(dir.Path(""), 5);
  REQUIRE(in.ok());
  CHECK(in->tokens == 256);
  CHECK(in->heads == 2);
  CHECK(in->q_heads == 4);
  CHECK(in->head_dim == 64);
  CHECK(in->queries == "q.npy");
  CHECK(in->k[777] == RoundToHalf(kv.k[777]));
  CHECK(in->v[777] == kv.v[777]);
  CHECK_THAT(in->description, Contains("k.npy <f2 (256, 2, 64)") && Contains("q.npy <f2"));

  // The whole row runs on it (GQA 4 query heads over 2 KV heads).
  StatusOr<QuantBenchContext> ctx = PrepareQuantBench(std::move(*in), 64);
  REQUIRE(ctx.ok());
  StatusOr<QuantRowAccuracy> row = ComputeQuantRow(*ctx, {QuantMethod::kQuaRot, 4, 4});
  REQUIRE(row.ok());
  CHECK(row->pure.attn_rel_err > 0.0);
  CHECK(row->pure.attn_rel_err < 0.5);

  std::filesystem::remove(dir.Path("q.npy"));
  in = LoadQuantBenchInput(dir.Path(""), 5);
  REQUIRE(in.ok());
  CHECK(in->queries == "gaussian");
  CHECK(in->q_heads == 2);
  CHECK(in->q.empty());
}

}  // namespace
}  // namespace kvctl
