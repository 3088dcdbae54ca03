// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvbench quant: the text table, the hand-written JSON and the command entry point.
#include <cmath>
#include <cstdarg>
#include <exception>
#include <string>
#include <vector>

#include "common/json_text.h"
#include "tools/kvbench_command.h"
#include "tools/kvbench_quant.h"

namespace kvctl {
namespace {

// Minimal pretty-printing JSON writer: objects, arrays, strings, numbers, booleans.
class JsonWriter {
 public:
  JsonWriter& Begin(char bracket) {
    Separate();
    out_.push_back(bracket);
    first_.push_back(true);
    return *this;
  }
  JsonWriter& End(char bracket) {
    first_.pop_back();
    Newline();
    out_.push_back(bracket);
    return *this;
  }
  JsonWriter& Key(std::string_view key) {
    Separate();
    AppendString(key);
    out_ += ": ";
    after_key_ = true;
    return *this;
  }
  JsonWriter& String(std::string_view s) {
    Separate();
    AppendString(s);
    return *this;
  }
  // Non-finite values have no JSON spelling; null says "not measured / undefined".
  JsonWriter& Number(double x) {
    Separate();
    if (std::isfinite(x)) {
      Appendf(&out_, "%.9g", x);
    } else {
      out_ += "null";
    }
    return *this;
  }
  JsonWriter& Int(int64_t x) {
    Separate();
    out_ += std::to_string(x);
    return *this;
  }
  JsonWriter& Uint(uint64_t x) {
    Separate();
    out_ += std::to_string(x);
    return *this;
  }
  JsonWriter& Bool(bool b) {
    Separate();
    out_ += b ? "true" : "false";
    return *this;
  }
  std::string Finish() { return out_ + "\n"; }

 private:
  void Newline() {
    out_.push_back('\n');
    out_.append(2 * first_.size(), ' ');
  }
  void Separate() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (first_.empty()) return;
    if (!first_.back()) out_.push_back(',');
    first_.back() = false;
    Newline();
  }
  void AppendString(std::string_view s) { AppendJsonQuoted(&out_, s); }

  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

void ModeJson(JsonWriter& j, const ModeAccuracy& m) {
  j.Key("quantized_tokens").Int(m.quantized_tokens);
  j.Key("records").Int(m.records);
  j.Key("bytes").Int(m.bytes);
  j.Key("bits_per_element").Number(m.bits_per_element);
  j.Key("k_rel_mse").Number(m.k_rel_mse);
  j.Key("v_rel_mse").Number(m.v_rel_mse);
  j.Key("attn_rel_err").Number(m.attn_rel_err);
}

std::string TargetText(double ratio, double target) {
  if (target <= 0) return "-";
  std::string s;
  Appendf(&s, ">=%.2f %s", target, ratio >= target ? "PASS" : "MISS");
  return s;
}

}  // namespace

std::string FormatQuantTable(const QuantBenchReport& r) {
  const QuantBenchInput& in = r.input;
  std::string s;
  Appendf(&s, "kvbench quant%s\n", r.quick ? " (--quick)" : "");
  Appendf(&s, "input:   %s\n", in.description.c_str());
  Appendf(&s,
          "probe:   last %d positions, queries from %s; causal softmax(q k^T / sqrt(%d)) V, query "
          "head qh reads KV head qh / %d\n",
          r.attn_queries, in.queries.c_str(), in.head_dim, in.q_heads / in.heads);
  Appendf(&s, "simd:    %s active (CPU supports %s)\n\n", r.active_simd.c_str(),
          r.detected_simd.c_str());

  s += "Accuracy: rMSE = ||x - x^||^2 / ||x||^2, attn = ||o - o^|| / ||o|| over the probe\n";
  s += "  pure: tokens [0, Tq) quantized, Tq = T rounded down to block_tokens (G), no sinks/tail\n";
  s += "  streaming: method rules (sinks fp16, flush every F tokens, tail fp16); eff b/e over T\n";
  Appendf(&s, "%-24s | %-32s | %s\n", "", "pure", "streaming");
  Appendf(&s, "%-11s %4s %7s | %-10s %-10s %-10s | %5s %5s %8s  %-10s %-10s %s\n", "row", "G",
          "b/e", "K rMSE", "V rMSE", "attn err", "sinks", "F", "eff b/e", "K rMSE", "V rMSE",
          "attn err");
  bool leftover = false;
  for (const QuantBenchRow& row : r.rows) {
    const QuantRowAccuracy& a = row.accuracy;
    leftover = leftover || a.pure.quantized_tokens < in.tokens;
    Appendf(&s, "%-11s %4d %7.4f | %-10.3e %-10.3e %-10.3e | %5d %5d %8.4f  %-10.3e %-10.3e %.3e\n",
            QuantRowLabel(a.row).c_str(), a.spec.block_tokens, a.pure.bits_per_element,
            a.pure.k_rel_mse, a.pure.v_rel_mse, a.pure.attn_rel_err, a.rules.sink_tokens,
            a.rules.flush_tokens, a.streaming.bits_per_element, a.streaming.k_rel_mse,
            a.streaming.v_rel_mse, a.streaming.attn_rel_err);
  }
  if (leftover) {
    s += "  (pure: the T - Tq leftover tokens stay fp16 in the probe and are not in rMSE/b/e)\n";
  }
  s +=
      "  b/e is counted from the bytes written (records + side + fp16) and matches the registry.\n";
  if (!r.throughput) return s;

  Appendf(&s,
          "\nThroughput, one thread: GB/s of fp16 K+V input (Tq x %d x %d x 2 B x 2), median "
          "thread CPU time of %d runs after 1 warm-up\n",
          in.heads, in.head_dim, r.reps);
  Appendf(&s, "memcpy of %.1f MB (T x H x D x 2 B x 2): %.2f GB/s\n", r.memcpy_bytes / 1e6,
          r.memcpy_gbps);
  Appendf(&s,
          "read of the %s input once (no work): %.2f GB/s, %.4f x memcpy (a quantizer's bound)\n",
          r.input_form.c_str(), r.read_gbps, r.read_gbps / r.memcpy_gbps);
  Appendf(&s, "%-11s %8s %9s  %-12s %8s %9s | %9s %11s | %8s %9s\n", "row", "quant", "x memcpy",
          "target", "dequant", "x memcpy", "ref quant", "ref dequant", "quant", "[T,H,D]");
  for (const QuantBenchRow& row : r.rows) {
    const QuantThroughput& p = row.perf;
    const double q_ratio = p.quantize_gbps / r.memcpy_gbps;
    Appendf(&s, "%-11s %8.3f %9.4f  %-12s %8.3f %9.4f | %9.3f %11.3f | %8.3f %9.4f\n",
            QuantRowLabel(row.accuracy.row).c_str(), p.quantize_gbps, q_ratio,
            TargetText(q_ratio, row.target).c_str(), p.dequantize_gbps,
            p.dequantize_gbps / r.memcpy_gbps, p.ref_quantize_gbps, p.ref_dequantize_gbps,
            p.token_rows_quantize_gbps, p.token_rows_quantize_gbps / r.memcpy_gbps);
  }
  s += "  quant/dequant: QuantizeBlocks (one batch per head)/DequantizeBlock at the active SIMD "
       "level; ref: the scalar *Ref path\n";
  s += "  input: " + r.input_form +
       " rows of one head contiguous, head by head, as the daemon's flush hands them over "
       "(--input-form fp32|fp16);\n  quant [T,H,D]: QuantizeBlock block by block, reading the "
       "[T, H, D] tensor in place (rows H x D apart), x memcpy\n";
  s += "  targets (benchmark, not asserted): kivi/quarot/oscar quantize >= 0.5x memcpy, kvarn (the "
       "registry's " +
       std::to_string(TraitsOf(QuantMethod::kKvarn).defaults.sinkhorn_iters) +
       " Sinkhorn iterations) >= 0.1x\n";
  return s;
}

std::string FormatQuantJson(const QuantBenchReport& r) {
  JsonWriter j;
  j.Begin('{');
  j.Key("command").String("quant");
  j.Key("quick").Bool(r.quick);
  j.Key("simd").Begin('{');
  j.Key("active").String(r.active_simd);
  j.Key("detected").String(r.detected_simd);
  j.End('}');
  const QuantBenchInput& in = r.input;
  j.Key("input").Begin('{');
  j.Key("source").String(in.source);
  j.Key("description").String(in.description);
  j.Key("queries").String(in.queries);
  j.Key("tokens").Int(in.tokens);
  j.Key("heads").Int(in.heads);
  j.Key("q_heads").Int(in.q_heads);
  j.Key("head_dim").Int(in.head_dim);
  j.Key("seed").Uint(in.seed);
  j.End('}');
  j.Key("attn_queries").Int(r.attn_queries);
  j.Key("reps").Int(r.reps);
  j.Key("throughput_measured").Bool(r.throughput);
  j.Key("memcpy").Begin('{');
  j.Key("bytes").Number(r.memcpy_bytes);
  j.Key("gbps").Number(r.throughput ? r.memcpy_gbps : NAN);
  j.End('}');
  j.Key("input_form").String(r.input_form);
  j.Key("input_read").Begin('{');
  j.Key("gbps").Number(r.throughput ? r.read_gbps : NAN);
  j.Key("vs_memcpy").Number(r.throughput ? r.read_gbps / r.memcpy_gbps : NAN);
  j.End('}');
  j.Key("rows").Begin('[');
  for (const QuantBenchRow& row : r.rows) {
    const QuantRowAccuracy& a = row.accuracy;
    j.Begin('{');
    j.Key("label").String(QuantRowLabel(a.row));
    j.Key("method").String(QuantMethodName(a.row.method));
    j.Key("k_bits").Int(a.spec.k_bits);
    j.Key("v_bits").Int(a.spec.v_bits);
    j.Key("block_tokens").Int(a.spec.block_tokens);
    j.Key("k_group_tokens").Int(a.spec.k_group_tokens);
    j.Key("v_group_channels").Int(a.spec.v_group_channels);
    j.Key("sinkhorn_iters").Int(a.spec.sinkhorn_iters);
    j.Key("bits_per_element").Number(a.registry_bpe.average);
    j.Key("bits_per_element_k").Number(a.registry_bpe.k);
    j.Key("bits_per_element_v").Number(a.registry_bpe.v);
    j.Key("pure").Begin('{');
    ModeJson(j, a.pure);
    j.End('}');
    j.Key("streaming").Begin('{');
    j.Key("sink_tokens").Int(a.rules.sink_tokens);
    j.Key("flush_tokens").Int(a.rules.flush_tokens);
    j.Key("effective_bits_per_element").Number(a.registry_effective_bpe);
    ModeJson(j, a.streaming);
    j.End('}');
    if (r.throughput) {
      const QuantThroughput& p = row.perf;
      const double q_ratio = p.quantize_gbps / r.memcpy_gbps;
      j.Key("throughput").Begin('{');
      j.Key("tokens").Int(p.tokens);
      j.Key("fp16_bytes").Number(p.bytes);
      j.Key("quantize_gbps").Number(p.quantize_gbps);
      j.Key("dequantize_gbps").Number(p.dequantize_gbps);
      j.Key("quantize_vs_memcpy").Number(q_ratio);
      j.Key("token_rows_quantize_gbps").Number(p.token_rows_quantize_gbps);
      j.Key("token_rows_quantize_vs_memcpy").Number(p.token_rows_quantize_gbps / r.memcpy_gbps);
      j.Key("dequantize_vs_memcpy").Number(p.dequantize_gbps / r.memcpy_gbps);
      j.Key("ref_quantize_gbps").Number(p.ref_quantize_gbps);
      j.Key("ref_dequantize_gbps").Number(p.ref_dequantize_gbps);
      j.Key("quantize_target_vs_memcpy").Number(row.target > 0 ? row.target : NAN);
      j.Key("target_met");
      if (row.target > 0) {
        j.Bool(q_ratio >= row.target);
      } else {
        j.Number(NAN);  // null: no target for this method.
      }
      j.End('}');
    }
    j.End('}');
  }
  j.End(']');
  j.End('}');
  return j.Finish();
}

int RunQuantCommand(const QuantBenchOptions& options, bool json, std::FILE* out, std::FILE* err) {
  return RunBenchCommand(
      "kvbench quant", [&] { return RunQuantBench(options); },
      [&](const auto& report) { return json ? FormatQuantJson(report) : FormatQuantTable(report); },
      out, err);
}

}  // namespace kvctl
