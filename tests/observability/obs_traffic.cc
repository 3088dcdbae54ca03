// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// obs_traffic: an engine-like client for the observability tests and docs. One session with N
// sequences (sequence i gets prefill + 64*i tokens, so tables have something to sort), then
// optional decode steps, then it holds the session open (PING renews the lease) for --hold-s
// seconds so kvtop and /metrics see live sequences. Prints "ready session=<id>" after the prefill
// and "done" at the end, one line each, flushed, for tests that wait on them.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <span>
#include <thread>
#include <vector>

#include "common/half.h"
#include "ipc/client.h"
#include "tests/support/synthetic_kv.h"

namespace {

int Fail(const char* what, const kvctl::Status& s) {
  std::fprintf(stderr, "obs_traffic: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"obs_traffic: a client that keeps sequences open, for kvtop and /metrics tests"};
  std::string endpoint = "ipc:///tmp/kvctl.sock", client_name = "obs-traffic";
  int sequences = 2, layers = 12, heads = 4, head_dim = 64, prefill = 512, steps = 0;
  int step_interval_ms = 0;
  double hold_s = 0;
  bool close = false;
  app.add_option("--endpoint", endpoint)->capture_default_str();
  app.add_option("--client", client_name)->capture_default_str();
  app.add_option("--sequences", sequences)->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--layers", layers)->check(CLI::Range(1, 128))->capture_default_str();
  app.add_option("--heads", heads)->check(CLI::Range(1, 64))->capture_default_str();
  app.add_option("--head-dim", head_dim)->capture_default_str();
  app.add_option("--prefill", prefill, "Tokens of sequence 0; sequence i gets 64*i more")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  app.add_option("--steps", steps, "Decode steps (1 token per sequence each)")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
  app.add_option("--step-interval-ms", step_interval_ms)->capture_default_str();
  app.add_option("--hold-s", hold_s, "Seconds to keep the session open afterwards")
      ->capture_default_str();
  app.add_flag("--close", close, "Close the sequences at the end");
  CLI11_PARSE(app, argc, argv);

  auto client = kvctl::ipc::Client::Connect(endpoint, 10000);
  if (!client.ok()) return Fail("connect", client.status());
  kvctl::ipc::HelloRequest hello;
  hello.client_name = client_name;
  hello.model_name = "obs-synthetic";
  hello.geometry = {static_cast<uint32_t>(layers), static_cast<uint32_t>(heads), 0,
                    static_cast<uint32_t>(head_dim), kvctl::DType::kF16};
  auto session = (*client)->Hello(hello);
  if (!session.ok()) return Fail("HELLO", session.status());
  const uint64_t sid = session->session_id;

  const int64_t max_tokens = prefill + 64LL * (sequences - 1) + steps;
  const kvctl::SyntheticKv kv = kvctl::GenerateSyntheticKv(
      {.tokens = max_tokens, .heads = heads, .head_dim = head_dim, .seed = 7});
  // [layers, n, heads, head_dim] fp16 of tokens [first, first + n); every layer gets the same rows.
  auto slice = [&](const std::vector<float>& src, int64_t first, int64_t n) {
    std::vector<uint16_t> out;
    const size_t row = static_cast<size_t>(heads) * head_dim;
    out.reserve(static_cast<size_t>(layers) * n * row);
    for (int l = 0; l < layers; ++l) {
      for (size_t i = first * row; i < (first + n) * row; ++i) {
        out.push_back(kvctl::FloatToHalf(src[i]));
      }
    }
    return out;
  };
  auto bytes = [](const std::vector<uint16_t>& v) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(v.data()), v.size() * 2);
  };
  std::vector<int64_t> length(static_cast<size_t>(sequences));
  for (int i = 0; i < sequences; ++i) {
    const uint64_t qid = static_cast<uint64_t>(i + 1);
    if (auto s = (*client)->Open(sid, qid).status(); !s.ok()) return Fail("OPEN", s);
    length[i] = prefill + 64LL * i;
    const auto k = slice(kv.k, 0, length[i]), v = slice(kv.v, 0, length[i]);
    auto r = (*client)->AppendInline({sid, qid, 0, static_cast<uint32_t>(length[i])}, bytes(k),
                                     bytes(v));
    if (!r.ok()) return Fail("APPEND prefill", r.status());
  }
  std::printf("ready session=%llu\n", static_cast<unsigned long long>(sid));
  std::fflush(stdout);

  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < sequences; ++i) {
      const auto k = slice(kv.k, length[i], 1), v = slice(kv.v, length[i], 1);
      auto r = (*client)->AppendInline(
          {sid, static_cast<uint64_t>(i + 1), static_cast<uint64_t>(length[i]), 1}, bytes(k),
          bytes(v));
      if (!r.ok()) return Fail("APPEND decode", r.status());
      ++length[i];
    }
    if (step_interval_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(step_interval_ms));
    }
  }
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(hold_s * 1000));
  while (std::chrono::steady_clock::now() < until) {
    if (auto s = (*client)->Ping(sid).status(); !s.ok()) return Fail("PING", s);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  if (close) {
    for (int i = 0; i < sequences; ++i) {
      if (auto s = (*client)->Close(sid, static_cast<uint64_t>(i + 1)).status(); !s.ok()) {
        return Fail("CLOSE", s);
      }
    }
  }
  std::printf("done\n");
  std::fflush(stdout);
  return 0;
}
