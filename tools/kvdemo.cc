// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// kvdemo: a short client session against a running kvctl daemon, the README's main job. It plays
// an engine with SmolLM2-135M's KV geometry (30 layers, 3 KV heads, head_dim 64, fp16): prefill,
// then token-by-token decode (through the shared-memory staging slot when the daemon offers one),
// then a dense fetch compared with what was sent, and the daemon's STATS.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/half.h"
#include "ipc/client.h"
#include "tests/support/synthetic_kv.h"

namespace {

using kvctl::Status;

int Fail(const char* what, const Status& s) {
  std::fprintf(stderr, "kvdemo: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

// [layers, tokens, heads, D] fp16 bytes of tokens [first, first + n).
std::vector<uint16_t> Slice(const std::vector<std::vector<float>>& layers, int64_t first, int64_t n,
                            int heads, int d) {
  std::vector<uint16_t> out;
  out.reserve(layers.size() * n * heads * d);
  for (const auto& layer : layers) {
    for (int64_t i = first * heads * d; i < (first + n) * heads * d; ++i) {
      out.push_back(kvctl::FloatToHalf(layer[i]));
    }
  }
  return out;
}

std::span<const std::byte> Bytes(const std::vector<uint16_t>& v) {
  return {reinterpret_cast<const std::byte*>(v.data()), v.size() * 2};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"kvdemo: a short engine-like session against a running kvctl daemon"};
  std::string endpoint = "ipc:///tmp/kvctl.sock";
  int prefill = 512, decode = 64;
  app.add_option("--endpoint", endpoint, "Daemon endpoint")->capture_default_str();
  app.add_option("--prefill", prefill, "Prompt tokens appended at once")->capture_default_str();
  app.add_option("--decode", decode, "Tokens then appended one at a time")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const int layers = 30, heads = 3, d = 64;
  const int64_t total = prefill + decode;
  if (prefill < 1 || decode < 0) {
    std::fprintf(stderr, "kvdemo: --prefill must be >= 1 and --decode >= 0\n");
    return 1;
  }

  auto client = kvctl::ipc::Client::Connect(endpoint, 5000);
  if (!client.ok()) return Fail("connect", client.status());
  kvctl::ipc::HelloRequest hello;
  hello.client_name = "kvdemo";
  hello.model_name = "SmolLM2-135M-Instruct";
  hello.geometry = {layers, heads, 0, d, kvctl::DType::kF16};
  auto session = (*client)->Hello(hello);
  if (!session.ok()) {
    std::fprintf(stderr, "kvdemo: is the daemon running on %s?\n", endpoint.c_str());
    return Fail("HELLO", session.status());
  }
  const uint64_t sid = session->session_id;
  std::printf(
      "session %llu: quantizer %u, k%u v%u, block %u tokens, %u sinks, flush %u; "
      "staging %llu bytes\n",
      static_cast<unsigned long long>(sid), session->quant.method, session->quant.k_bits,
      session->quant.v_bits, session->quant.block_tokens, session->quant.sink_tokens,
      session->quant.flush_tokens, static_cast<unsigned long long>(session->staging_bytes));
  if (Status s = (*client)->Open(sid, 1).status(); !s.ok()) return Fail("OPEN", s);

  std::vector<std::vector<float>> k(layers), v(layers);
  for (int l = 0; l < layers; ++l) {
    kvctl::SyntheticKv kv = kvctl::GenerateSyntheticKv(
        {.tokens = total, .heads = heads, .head_dim = d, .seed = static_cast<uint64_t>(l + 1)});
    k[l] = std::move(kv.k);
    v[l] = std::move(kv.v);
  }
  auto t0 = std::chrono::steady_clock::now();
  auto kb = Slice(k, 0, prefill, heads, d), vb = Slice(v, 0, prefill, heads, d);
  auto appended =
      (*client)->AppendInline({sid, 1, 0, static_cast<uint32_t>(prefill)}, Bytes(kb), Bytes(vb));
  if (!appended.ok()) return Fail("APPEND prefill", appended.status());
  const double prefill_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  // Decode: through the session's staging slot when there is one (no tensor bytes on the
  // socket), inline otherwise. The slot lies in the session's own staging object (the pool is
  // read-only to clients), or in the pool for daemons before that.
  uint8_t* staging = nullptr;
  size_t map_bytes = 0;
  const std::string& staging_object =
      session->staging_shm_name.empty() ? session->shm_name : session->staging_shm_name;
  if (session->staging_bytes > 0 && !staging_object.empty()) {
    const int fd = shm_open(staging_object.c_str(), O_RDWR, 0);
    if (fd >= 0) {
      map_bytes = session->staging_shm_name.empty()
                      ? session->pool_bytes
                      : session->staging_offset + session->staging_bytes;
      void* p = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      close(fd);
      if (p != MAP_FAILED) staging = static_cast<uint8_t*>(p) + session->staging_offset;
    }
  }
  t0 = std::chrono::steady_clock::now();
  for (int64_t t = prefill; t < total; ++t) {
    kb = Slice(k, t, 1, heads, d);
    vb = Slice(v, t, 1, heads, d);
    const kvctl::ipc::AppendArgs args{sid, 1, static_cast<uint64_t>(t), 1};
    if (staging != nullptr) {
      std::memcpy(staging, kb.data(), kb.size() * 2);
      std::memcpy(staging + kb.size() * 2, vb.data(), vb.size() * 2);
      appended = (*client)->AppendStaging(args, session->staging_offset, false);
    } else {
      appended = (*client)->AppendInline(args, Bytes(kb), Bytes(vb));
    }
    if (!appended.ok()) return Fail("APPEND decode", appended.status());
  }
  const double decode_us =
      decode > 0 ? std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                           .count() /
                       decode
                 : 0;
  if (staging != nullptr) munmap(staging - session->staging_offset, map_bytes);

  auto fetched = (*client)->FetchDense(sid, 1, 0, layers, kvctl::DType::kF32);
  if (!fetched.ok()) return Fail("FETCH", fetched.status());
  double err_k = 0, ref_k = 0, err_v = 0, ref_v = 0;
  const float* fk = static_cast<const float*>(fetched->k.data());
  const float* fv = static_cast<const float*>(fetched->v.data());
  size_t row = 0;
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      const uint32_t count = fetched->counts[l * heads + h];
      for (uint32_t t = 0; t < count; ++t, ++row) {
        for (int c = 0; c < d; ++c) {
          const float xk = k[l][(t * heads + h) * d + c], xv = v[l][(t * heads + h) * d + c];
          err_k += std::pow(fk[row * d + c] - xk, 2), ref_k += xk * xk;
          err_v += std::pow(fv[row * d + c] - xv, 2), ref_v += xv * xv;
        }
      }
    }
  }
  std::printf(
      "appended %lld tokens (prefill %d in %.1f ms, then %d decode steps at %.0f us "
      "each, %s)\n",
      static_cast<long long>(appended->tokens_total), prefill, prefill_ms, decode, decode_us,
      staging ? "shared-memory staging" : "inline");
  std::printf("quantized %llu of %llu tokens per head; fetched back: relative MSE K %.4f, V %.4f\n",
              static_cast<unsigned long long>(appended->tokens_quantized),
              static_cast<unsigned long long>(appended->tokens_total), err_k / ref_k,
              err_v / ref_v);
  auto stats = (*client)->Stats(sid, "");
  if (!stats.ok()) return Fail("STATS", stats.status());
  std::printf("\n--- STATS ---\n%s", stats->c_str());
  if (Status s = (*client)->Close(sid, 1).status(); !s.ok()) return Fail("CLOSE", s);
  return 0;
}
