// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// quality_cost_bench: what the live quality telemetry (server.quality_sample_period: decode every
// Nth quantized record and compare it with its input) costs, as a share of APPEND time. For each
// period it runs the same workload on a fresh in-process Controller (no socket, so the
// denominator is the daemon's own append work and the share is the largest an engine could see):
// one prefill APPEND of --prefill tokens, then --steps single-token APPENDs, same synthetic data
// every time. Periods run interleaved, --runs times each; the table gives medians and the
// overhead against period 0. docs/stats.md has the numbers and the command.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/half.h"
#include "controller/service/controller.h"
#include "kernels/quant_types.h"
#include "kernels/quantize.h"
#include "tests/support/synthetic_kv.h"

namespace {

using Clock = std::chrono::steady_clock;

struct RunResult {
  double prefill_ms = 0, decode_ms = 0;
  uint64_t samples = 0;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// A zero-copy message over `data` (which outlives it).
zmq::message_t View(const std::vector<uint16_t>& data) {
  return zmq::message_t(const_cast<uint16_t*>(data.data()), data.size() * 2, nullptr, nullptr);
}

uint64_t StatsNumber(const std::string& text, const std::string& key) {
  const size_t at = text.find("\n" + key + ":");
  return at == std::string::npos ? 0 : std::stoull(text.substr(at + key.size() + 2));
}

// Microseconds per record to quantize, and to sample it the way KvSequence's SampleQuality does
// (decode the fresh record, sum squared errors against its input): medians of batches.
struct RecordCost {
  double quantize_us = 0, sample_us = 0;
};

kvctl::StatusOr<RecordCost> MeasureRecordCost(const kvctl::QuantSpec& spec,
                                              const std::vector<float>& k,
                                              const std::vector<float>& v, int heads) {
  const int g = spec.block_tokens, d = spec.head_dim;
  const int64_t stride = static_cast<int64_t>(heads) * d;
  const int blocks = static_cast<int>(k.size() / (static_cast<size_t>(g) * stride));
  if (blocks < 1) return kvctl::InvalidArgument("blocks: got 0, expected >= 1 (more tokens)");
  std::vector<uint8_t> rec(kvctl::BlockLayoutOf(spec).record_bytes);
  std::vector<float> ko(static_cast<size_t>(g) * d), vo(ko.size());
  std::vector<double> quantize, sample;
  double sink = 0;
  for (int batch = 0; batch < 15; ++batch) {
    double q_us = 0, s_us = 0;
    for (int b = 0; b < blocks; ++b) {
      const kvctl::BlockInput in{&k[b * g * stride], &v[b * g * stride], stride, nullptr};
      Clock::time_point t0 = Clock::now();
      KVCTL_RETURN_IF_ERROR(kvctl::QuantizeBlock(spec, in, rec.data()));
      Clock::time_point t1 = Clock::now();
      kvctl::DequantizeBlock(spec, rec.data(), nullptr, ko.data(), vo.data());
      double ek = 0, rk = 0, ev = 0, rv = 0;
      for (int t = 0; t < g; ++t) {
        for (int c = 0; c < d; ++c) {
          const double xk = in.k[t * stride + c], xv = in.v[t * stride + c];
          ek += (ko[t * d + c] - xk) * (ko[t * d + c] - xk), rk += xk * xk;
          ev += (vo[t * d + c] - xv) * (vo[t * d + c] - xv), rv += xv * xv;
        }
      }
      sink += ek / rk + ev / rv;
      const Clock::time_point t2 = Clock::now();
      q_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
      s_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
    }
    quantize.push_back(q_us / blocks);
    sample.push_back(s_us / blocks);
  }
  if (sink < 0) std::printf("(impossible)\n");  // Keeps the error sums from being optimized out.
  return RecordCost{Median(quantize), Median(sample)};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quality_cost_bench: cost of server.quality_sample_period relative to APPEND time"};
  std::string method = "kvarn", periods_text = "0,16,1";
  int k_bits = 2, v_bits = 2, layers = 30, heads = 3, head_dim = 64, prefill = 4096, steps = 2000;
  int runs = 7;
  app.add_option("--method", method, "Quantizer (quant.method)")->capture_default_str();
  app.add_option("--k-bits", k_bits)->capture_default_str();
  app.add_option("--v-bits", v_bits)->capture_default_str();
  app.add_option("--layers", layers)->capture_default_str();
  app.add_option("--heads", heads, "KV heads")->capture_default_str();
  app.add_option("--head-dim", head_dim)->capture_default_str();
  app.add_option("--prefill", prefill, "Tokens of the first APPEND")->capture_default_str();
  app.add_option("--steps", steps, "Single-token APPENDs after it")->capture_default_str();
  app.add_option("--runs", runs, "Runs per period (medians are reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--periods", periods_text, "Comma-separated sample periods; 0 = off")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::vector<int> periods;
  for (size_t start = 0; start <= periods_text.size();) {
    const size_t comma = std::min(periods_text.find(',', start), periods_text.size());
    periods.push_back(std::stoi(periods_text.substr(start, comma - start)));
    start = comma + 1;
  }
  kvctl::StatusOr<kvctl::QuantMethod> parsed_method = kvctl::ParseQuantMethod(method);
  if (!parsed_method.ok()) {
    std::fprintf(stderr, "quality_cost_bench: %s\n", parsed_method.status().ToString().c_str());
    return 1;
  }

  // Inputs, built once: [layers, tokens, heads, head_dim] fp16 for the prefill and each step.
  const int64_t total = prefill + steps;
  const size_t row = static_cast<size_t>(heads) * head_dim;
  std::vector<std::vector<float>> k(layers), v(layers);
  for (int l = 0; l < layers; ++l) {
    kvctl::SyntheticKv kv = kvctl::GenerateSyntheticKv({.tokens = total,
                                                        .heads = heads,
                                                        .head_dim = head_dim,
                                                        .seed = static_cast<uint64_t>(l + 1)});
    k[l] = std::move(kv.k);
    v[l] = std::move(kv.v);
  }
  auto slice = [&](const std::vector<std::vector<float>>& src, int64_t first, int64_t n) {
    std::vector<uint16_t> out;
    out.reserve(static_cast<size_t>(layers) * n * row);
    for (const auto& layer : src) {
      for (size_t i = first * row; i < (first + n) * row; ++i) {
        out.push_back(kvctl::FloatToHalf(layer[i]));
      }
    }
    return out;
  };
  const std::vector<uint16_t> prefill_k = slice(k, 0, prefill), prefill_v = slice(v, 0, prefill);
  std::vector<std::vector<uint16_t>> step_k, step_v;
  for (int s = 0; s < steps; ++s) {
    step_k.push_back(slice(k, prefill + s, 1));
    step_v.push_back(slice(v, prefill + s, 1));
  }

  auto run_once = [&](int period, int id) -> kvctl::StatusOr<RunResult> {
    kvctl::Config config;
    config.server.quality_sample_period = period;
    config.pool.bytes = 1ull << 30;
    config.pool.shm_name = "/kvctl-qbench-" + std::to_string(getpid()) + "-" + std::to_string(id);
    config.pool.staging_slots = 0;
    config.quant.method = *parsed_method;
    config.quant.k_bits = k_bits;
    config.quant.v_bits = v_bits;
    KVCTL_ASSIGN_OR_RETURN(std::unique_ptr<kvctl::Controller> controller,
                           kvctl::Controller::Create(config));
    const Clock::time_point now = Clock::now();
    kvctl::ipc::HelloRequest hello;
    hello.client_name = "quality_cost_bench";
    hello.geometry = {static_cast<uint32_t>(layers), static_cast<uint32_t>(heads), 0,
                      static_cast<uint32_t>(head_dim), kvctl::DType::kF16};
    KVCTL_ASSIGN_OR_RETURN(kvctl::ipc::HelloReply session, controller->Hello(hello, now));
    RunResult result, warmup;
    auto append = [&](uint64_t seq, uint64_t first, uint32_t n, const std::vector<uint16_t>& kd,
                      const std::vector<uint16_t>& vd, double* ms) -> kvctl::Status {
      kvctl::ipc::AppendRequest request{.session_id = session.session_id,
                                        .sequence_id = seq,
                                        .first_position = first,
                                        .n_tokens = n};
      request.k = View(kd);
      request.v = View(vd);
      const Clock::time_point t0 = Clock::now();
      kvctl::StatusOr<kvctl::ipc::AppendReply> reply = controller->Append(request, t0);
      *ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      return reply.status();
    };
    // Sequence 1 is a warm-up whose pages sequence 2 reuses, so the timed run does not pay for
    // first-touch page faults of the fresh shm pool.
    for (uint64_t seq : {1, 2}) {
      RunResult& r = seq == 1 ? warmup : result;
      KVCTL_RETURN_IF_ERROR(controller->Open({session.session_id, seq}, now));
      KVCTL_RETURN_IF_ERROR(
          append(seq, 0, static_cast<uint32_t>(prefill), prefill_k, prefill_v, &r.prefill_ms));
      for (int s = 0; s < steps; ++s) {
        KVCTL_RETURN_IF_ERROR(
            append(seq, static_cast<uint64_t>(prefill + s), 1, step_k[s], step_v[s], &r.decode_ms));
      }
      if (seq == 1) KVCTL_RETURN_IF_ERROR(controller->Close({session.session_id, 1}, now).status());
    }
    KVCTL_ASSIGN_OR_RETURN(std::string stats, controller->Stats({0, "quality"}, Clock::now()));
    result.samples = StatsNumber("\n" + stats, "quality_samples_total");
    return result;
  };

  std::map<int, std::vector<RunResult>> results;
  int id = 0;
  for (int r = 0; r < runs; ++r) {
    // Rotate the order so no period always runs first (cold caches) or last.
    for (size_t i = 0; i < periods.size(); ++i) {
      const int period = periods[(i + r) % periods.size()];
      kvctl::StatusOr<RunResult> result = run_once(period, id++);
      if (!result.ok()) {
        std::fprintf(stderr, "quality_cost_bench: period %d: %s\n", period,
                     result.status().ToString().c_str());
        return 1;
      }
      results[period].push_back(*result);
    }
  }

  std::printf(
      "%s k%d v%d, %d layers x %d KV heads x head_dim %d, fp16 input; prefill %d tokens "
      "+ %d decode steps; %d runs per period, medians\n\n",
      method.c_str(), k_bits, v_bits, layers, heads, head_dim, prefill, steps, runs);
  // "paired": the median over runs of each run's total against the period-0 total of the same
  // run (they ran back to back), which cancels load that drifts between runs.
  std::printf(
      "| period | samples | prefill ms | decode us/step | total ms | overhead vs 0 | "
      "paired |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  double base_total = 0;
  if (results.count(0)) {
    std::vector<double> t;
    for (const RunResult& x : results[0]) t.push_back(x.prefill_ms + x.decode_ms);
    base_total = Median(t);
  }
  for (int period : periods) {
    std::vector<double> pre, dec, tot;
    for (const RunResult& x : results[period]) {
      pre.push_back(x.prefill_ms);
      dec.push_back(x.decode_ms * 1000 / std::max(steps, 1));
      tot.push_back(x.prefill_ms + x.decode_ms);
    }
    const double total_ms = Median(tot);
    char overhead[32] = "-", paired[32] = "-";
    if (base_total > 0) {
      std::snprintf(overhead, sizeof(overhead), "%+.2f%%", 100 * (total_ms / base_total - 1));
      std::vector<double> ratios;
      for (size_t r = 0; r < tot.size(); ++r) {
        const RunResult& b = results[0][r];
        ratios.push_back(tot[r] / (b.prefill_ms + b.decode_ms) - 1);
      }
      std::snprintf(paired, sizeof(paired), "%+.2f%%", 100 * Median(ratios));
    }
    std::printf("| %d | %llu | %.2f | %.1f | %.2f | %s | %s |\n", period,
                static_cast<unsigned long long>(results[period][0].samples), Median(pre),
                Median(dec), total_ms, overhead, paired);
    std::fflush(stdout);
  }
  // A difference of a few percent between separate runs is near the noise of a shared machine;
  // the cost of one sample times the number of samples gives the share more precisely.
  if (base_total <= 0) return 0;
  kvctl::StatusOr<kvctl::QuantSpec> spec =
      kvctl::MakeQuantSpec(*parsed_method, head_dim, k_bits, v_bits);
  if (!spec.ok()) return 0;  // Not a block-quantizing method (fp16).
  kvctl::StatusOr<RecordCost> cost = MeasureRecordCost(*spec, k[0], v[0], heads);
  if (!cost.ok()) {
    std::fprintf(stderr, "quality_cost_bench: %s\n", cost.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "\nper record (%d tokens x head_dim %d): quantize %.1f us, sample (decode + error) "
      "%.1f us\n",
      spec->block_tokens, head_dim, cost->quantize_us, cost->sample_us);
  for (int period : periods) {
    if (period <= 0) continue;
    const double samples = static_cast<double>(results[period][0].samples);
    std::printf(
        "period %d: %.0f samples x %.1f us = %.1f ms = %.2f%% of the period-0 append "
        "time\n",
        period, samples, cost->sample_us, samples * cost->sample_us / 1000,
        100 * samples * cost->sample_us / 1000 / base_total);
  }
  return 0;
}
