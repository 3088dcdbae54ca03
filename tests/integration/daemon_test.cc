// Integration tests: the real kvctl daemon process driven by the C++ client over ZeroMQ.
#include <sys/stat.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "common/half.h"
#include "kernels/quantize.h"
#include "tests/integration/daemon_process.h"
#include "tests/integration/pool_window.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

using testing::DaemonProcess;

constexpr const char* kSmallPool = "bytes = \"64MiB\"\npage_bytes = \"16KiB\"\n";

std::span<const std::byte> AsBytes(const void* p, size_t n) {
  return {static_cast<const std::byte*>(p), n};
}

// [layers, tokens, heads, d] fp16 of a synthetic stream; every layer differs.
std::vector<uint16_t> MakeFp16(int layers, int64_t tokens, int heads, int d, uint64_t seed,
                               bool values) {
  std::vector<uint16_t> out;
  for (int l = 0; l < layers; ++l) {
    SyntheticKv kv = GenerateSyntheticKv({.tokens = tokens,
                                          .heads = heads,
                                          .head_dim = d,
                                          .seed = seed * 100 + static_cast<uint64_t>(l)});
    for (float x : values ? kv.v : kv.k) out.push_back(FloatToHalf(x));
  }
  return out;
}

// Tokens [first, first + n) of a [layers, tokens, ...] buffer.
std::vector<uint16_t> Tokens(const std::vector<uint16_t>& all, int layers, int64_t tokens,
                             int64_t first, int64_t n, size_t row) {
  std::vector<uint16_t> out;
  for (int l = 0; l < layers; ++l) {
    const auto begin = all.begin() + static_cast<std::ptrdiff_t>((l * tokens + first) * row);
    out.insert(out.end(), begin, begin + static_cast<std::ptrdiff_t>(n * row));
  }
  return out;
}

// Appends [0, prefill) of k/v in one inline APPEND, then every later token one decode step at a
// time, as an engine would; checks the daemon's token count after each step.
void AppendPrefillThenDecode(ipc::Client& client, uint64_t sid, uint64_t seq,
                             const std::vector<uint16_t>& k, const std::vector<uint16_t>& v,
                             int layers, int64_t total, int64_t prefill, size_t row) {
  auto kp = Tokens(k, layers, total, 0, prefill, row),
       vp = Tokens(v, layers, total, 0, prefill, row);
  REQUIRE(client
              .AppendInline({sid, seq, 0, static_cast<uint32_t>(prefill)},
                            AsBytes(kp.data(), kp.size() * 2), AsBytes(vp.data(), vp.size() * 2))
              .ok());
  for (int64_t t = prefill; t < total; ++t) {
    auto kt = Tokens(k, layers, total, t, 1, row), vt = Tokens(v, layers, total, t, 1, row);
    auto r =
        client.AppendInline({sid, seq, static_cast<uint64_t>(t), 1},
                            AsBytes(kt.data(), kt.size() * 2), AsBytes(vt.data(), vt.size() * 2));
    REQUIRE(r.ok());
    CHECK(r->tokens_total == static_cast<uint64_t>(t + 1));
  }
}

// Head h of layer l of a [layers, total, heads, d] fp16 buffer as [total, d] floats.
std::vector<float> HeadRows(const std::vector<uint16_t>& all, int l, int h, int64_t total,
                            int heads, int d) {
  std::vector<float> out(static_cast<size_t>(total) * d);
  for (int64_t t = 0; t < total; ++t) {
    for (int c = 0; c < d; ++c) {
      out[t * d + c] = HalfToFloat(all[((l * total + t) * heads + h) * d + c]);
    }
  }
  return out;
}

TEST_CASE("Daemon: fetched KV equals the quantizer library run directly", "[integration]") {
  // The built-in method (KVarN k2v2) with 128 sinks set explicitly: the expected rows below are
  // laid out by that sink count, not by whatever the registry's default is.
  DaemonProcess daemon(std::string(kSmallPool) + "[quant]\nsink_tokens = 128\n");
  auto client = daemon.Connect();
  const int layers = 2, heads = 3, d = 64;
  const int64_t prefill = 300, decode = 100, total = prefill + decode;
  auto hello = client->Hello({.client_name = "it", .geometry = {layers, heads, 0, d, DType::kF16}});
  REQUIRE(hello.ok());
  CHECK(hello->quant.method == static_cast<uint8_t>(QuantMethod::kKvarn));
  const uint64_t sid = hello->session_id;
  REQUIRE(client->Open(sid, 5).ok());
  const size_t row = static_cast<size_t>(heads) * d;
  const auto k = MakeFp16(layers, total, heads, d, 1, false);
  const auto v = MakeFp16(layers, total, heads, d, 1, true);
  AppendPrefillThenDecode(*client, sid, 5, k, v, layers, total, prefill, row);
  auto fetched = client->FetchDense(sid, 5, 0, layers, DType::kF32);
  REQUIRE(fetched.ok());
  const float* fk = static_cast<const float*>(fetched->k.data());
  const float* fv = static_cast<const float*>(fetched->v.data());
  const int64_t* pos = static_cast<const int64_t*>(fetched->positions.data());

  // Expected: 128 fp16 sinks, then 2 KVarN records (tokens 128..383) quantized by the library,
  // then a 16-token fp16 tail.
  const QuantSpec spec = MakeQuantSpec(QuantMethod::kKvarn, d, 2, 2).value();
  size_t r = 0;
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      REQUIRE(fetched->counts[l * heads + h] == total);
      std::vector<float> ek = HeadRows(k, l, h, total, heads, d);
      std::vector<float> ev = HeadRows(v, l, h, total, heads, d);
      std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
      for (int64_t t0 = 128; t0 + 128 <= 384; t0 += 128) {
        REQUIRE(QuantizeBlockRef(spec, {&ek[t0 * d], &ev[t0 * d], d, nullptr}, rec.data()).ok());
        DequantizeBlockRef(spec, rec.data(), nullptr, &ek[t0 * d], &ev[t0 * d]);
      }
      REQUIRE(std::memcmp(fk + r * d, ek.data(), ek.size() * 4) == 0);
      REQUIRE(std::memcmp(fv + r * d, ev.data(), ev.size() * 4) == 0);
      for (int64_t t = 0; t < total; ++t) REQUIRE(pos[r + t] == t);
      r += total;
    }
  }
  // Blocks mode describes the same records, and its window rows, read from the pool, are the
  // dense rows of the 128 sinks and the 16-token tail.
  auto blocks = client->FetchBlocks(sid, 5, 0, layers);
  REQUIRE(blocks.ok());
  CHECK(blocks->indptr.back() == static_cast<uint32_t>(layers * heads * 2));
  CHECK(blocks->window_indptr[1] == 128 + 16);
  CHECK(blocks->window_sinks[0] == 128);
  CHECK(blocks->run_indptr.back() == static_cast<uint32_t>(layers * heads * 2));  // Two runs each.
  CHECK(blocks->layouts[0].row_dtype == DType::kF16);
  const testing::PoolMap pool(hello->shm_name, hello->pool_bytes);
  testing::CheckWindowsMatchDense(pool, *blocks, *fetched);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("Daemon: turbo records fetched from the daemon equal the library's round trip",
          "[integration]") {
  // TurboQuant k3v2 (docs/algorithms.md §20): no sinks, flushes of 128 tokens in 32-token records,
  // set explicitly (the expected layout below assumes them, whatever the registry defaults are).
  DaemonProcess daemon(std::string(kSmallPool) +
                       "[quant]\nmethod = \"turbo\"\nk_bits = 3\nv_bits = 2\nsink_tokens = 0\n"
                       "flush_tokens = 128\n");
  auto client = daemon.Connect();
  const int layers = 2, heads = 2, d = 64;
  const int64_t prefill = 200, decode = 70, total = prefill + decode;
  auto hello = client->Hello({.client_name = "tq", .geometry = {layers, heads, 0, d, DType::kF16}});
  REQUIRE(hello.ok());
  CHECK(hello->quant.method == static_cast<uint8_t>(QuantMethod::kTurbo));
  const uint64_t sid = hello->session_id;
  REQUIRE(client->Open(sid, 3).ok());
  const size_t row = static_cast<size_t>(heads) * d;
  const auto k = MakeFp16(layers, total, heads, d, 4, false);
  const auto v = MakeFp16(layers, total, heads, d, 4, true);
  AppendPrefillThenDecode(*client, sid, 3, k, v, layers, total, prefill, row);
  auto fetched = client->FetchDense(sid, 3, 0, layers, DType::kF32);
  REQUIRE(fetched.ok());
  const float* fk = static_cast<const float*>(fetched->k.data());
  const float* fv = static_cast<const float*>(fetched->v.data());
  // Tokens 0..255 are two flushes of four records each; 256..269 are the fp16 tail.
  const QuantSpec spec = MakeQuantSpec(QuantMethod::kTurbo, d, 3, 2).value();
  const int64_t quantized = 256;
  size_t r = 0;
  double err = 0, ref = 0;
  for (int l = 0; l < layers; ++l) {
    for (int h = 0; h < heads; ++h) {
      REQUIRE(fetched->counts[l * heads + h] == total);
      std::vector<float> ek = HeadRows(k, l, h, total, heads, d);
      std::vector<float> ev = HeadRows(v, l, h, total, heads, d);
      const std::vector<float> original = ek;
      std::vector<uint8_t> rec(BlockLayoutOf(spec).record_bytes);
      for (int64_t t0 = 0; t0 < quantized; t0 += spec.block_tokens) {
        REQUIRE(QuantizeBlockRef(spec, {&ek[t0 * d], &ev[t0 * d], d, nullptr}, rec.data()).ok());
        DequantizeBlockRef(spec, rec.data(), nullptr, &ek[t0 * d], &ev[t0 * d]);
      }
      REQUIRE(std::memcmp(fk + r * d, ek.data(), ek.size() * 4) == 0);
      REQUIRE(std::memcmp(fv + r * d, ev.data(), ev.size() * 4) == 0);
      for (int64_t i = 0; i < quantized * d; ++i) {
        err += (original[i] - ek[i]) * (original[i] - ek[i]), ref += original[i] * original[i];
      }
      r += total;
    }
  }
  // 3-bit K: about the codebook's 0.034 relative error on these rows, and certainly not lossless.
  CHECK(err / ref > 0.01);
  CHECK(err / ref < 0.08);
  auto blocks = client->FetchBlocks(sid, 3, 0, layers);
  REQUIRE(blocks.ok());
  CHECK(blocks->indptr.back() == static_cast<uint32_t>(layers * heads * 8));
  CHECK(blocks->window_indptr[1] == 14);
  CHECK(blocks->window_sinks[0] == 0);
  const testing::PoolMap pool(hello->shm_name, hello->pool_bytes);
  testing::CheckWindowsMatchDense(pool, *blocks, *fetched);
  REQUIRE(!blocks->layouts.empty());
  CHECK(blocks->layouts[0].method == static_cast<uint8_t>(QuantMethod::kTurbo));
  CHECK(blocks->layouts[0].record_bytes == BlockLayoutOf(spec).record_bytes);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("Daemon: 8 concurrent clients x 2000 decode steps keep every byte", "[integration]") {
  DaemonProcess daemon(
      "bytes = \"128MiB\"\npage_bytes = \"16KiB\"\n"
      "[quant]\nlossless = true\n");
  const int clients = 8, steps = 2000, layers = 2, heads = 2, d = 32;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto client = daemon.Connect(10000);
      auto hello = client->Hello({.client_name = "it" + std::to_string(c),
                                  .geometry = {layers, heads, 0, d, DType::kF32}});
      if (!hello.ok() || !client->Open(hello->session_id, 1).ok()) return (void)++failures;
      std::mt19937 rng(static_cast<uint32_t>(c));
      std::uniform_real_distribution<float> u(-4, 4);
      std::vector<float> sent_k, sent_v;  // [steps][layers][heads*d]
      std::vector<float> k(layers * heads * d), v(k.size());
      for (int t = 0; t < steps; ++t) {
        for (float& x : k) x = u(rng);
        for (float& x : v) x = u(rng);
        sent_k.insert(sent_k.end(), k.begin(), k.end());
        sent_v.insert(sent_v.end(), v.begin(), v.end());
        auto r =
            client->AppendInline({hello->session_id, 1, static_cast<uint64_t>(t), 1},
                                 AsBytes(k.data(), k.size() * 4), AsBytes(v.data(), v.size() * 4));
        if (!r.ok() || r->tokens_total != static_cast<uint64_t>(t + 1)) return (void)++failures;
      }
      auto f = client->FetchDense(hello->session_id, 1, 0, layers, DType::kF32);
      if (!f.ok()) return (void)++failures;
      // Fetched order: (layer, head), then tokens. Compare checksums and every value.
      const float* fk = static_cast<const float*>(f->k.data());
      const float* fv = static_cast<const float*>(f->v.data());
      double sum_sent = 0, sum_got = 0;
      size_t row = 0;
      for (int l = 0; l < layers; ++l) {
        for (int h = 0; h < heads; ++h) {
          for (int t = 0; t < steps; ++t, ++row) {
            for (int x = 0; x < d; ++x) {
              const size_t i = ((static_cast<size_t>(t) * layers + l) * heads + h) * d + x;
              sum_sent += sent_k[i] * 1.5 + sent_v[i];
              sum_got += fk[row * d + x] * 1.5 + fv[row * d + x];
              if (fk[row * d + x] != sent_k[i] || fv[row * d + x] != sent_v[i]) ++failures;
            }
          }
        }
      }
      if (sum_sent != sum_got) ++failures;
    });
  }
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("Daemon: bad requests get named errors and change nothing", "[integration]") {
  DaemonProcess daemon(
      "bytes = \"1MiB\"\npage_bytes = \"16KiB\"\nstaging_slots = 0\n"
      "[quant]\nmethod = \"kivi\"\n");
  auto a = daemon.Connect();
  auto b = daemon.Connect();
  const int layers = 2, heads = 4, d = 64;
  auto ha = a->Hello({.client_name = "a", .geometry = {layers, heads, 0, d, DType::kF16}});
  auto hb = b->Hello({.client_name = "b", .geometry = {layers, heads, 0, d, DType::kF16}});
  REQUIRE((ha.ok() && hb.ok()));
  REQUIRE(a->Open(ha->session_id, 1).ok());
  const size_t row = static_cast<size_t>(heads) * d;
  auto k = MakeFp16(layers, 4096, heads, d, 3, false),
       v = MakeFp16(layers, 4096, heads, d, 3, true);
  auto k0 = Tokens(k, layers, 4096, 0, 200, row), v0 = Tokens(v, layers, 4096, 0, 200, row);
  REQUIRE(a->AppendInline({ha->session_id, 1, 0, 200}, AsBytes(k0.data(), k0.size() * 2),
                          AsBytes(v0.data(), v0.size() * 2))
              .ok());
  auto before = a->FetchDense(ha->session_id, 1, 0, layers, DType::kF32);
  REQUIRE(before.ok());
  const std::string before_k(static_cast<const char*>(before->k.data()), before->k.size());

  auto k1 = Tokens(k, layers, 4096, 200, 10, row), v1 = Tokens(v, layers, 4096, 200, 10, row);
  // Wrong first position.
  auto r = a->AppendInline({ha->session_id, 1, 201, 10}, AsBytes(k1.data(), k1.size() * 2),
                           AsBytes(v1.data(), v1.size() * 2));
  CHECK(r.status().message().find("first_position: got 201, expected 200") != std::string::npos);
  // Size mismatch: V one token short.
  r = a->AppendInline({ha->session_id, 1, 200, 10}, AsBytes(k1.data(), k1.size() * 2),
                      AsBytes(v1.data(), v1.size() * 2 - row * 2));
  CHECK(r.status().code() == StatusCode::kInvalidArgument);
  // NaN.
  auto bad = k1;
  bad[5] = 0x7E00;
  r = a->AppendInline({ha->session_id, 1, 200, 10}, AsBytes(bad.data(), bad.size() * 2),
                      AsBytes(v1.data(), v1.size() * 2));
  CHECK(r.status().message().find("nan") != std::string::npos);
  // Another client's sequence and an unknown one.
  r = b->AppendInline({hb->session_id, 1, 200, 10}, AsBytes(k1.data(), k1.size() * 2),
                      AsBytes(v1.data(), v1.size() * 2));
  CHECK(r.status().code() == StatusCode::kNotFound);
  CHECK(b->FetchDense(ha->session_id + 100, 1, 0, 1).status().code() == StatusCode::kNotFound);
  // Staging without a slot, layer range out of bounds.
  CHECK(a->AppendStaging({ha->session_id, 1, 200, 10}, 0, false).status().code() ==
        StatusCode::kFailedPrecondition);
  CHECK(a->FetchDense(ha->session_id, 1, 1, 3).status().message().find("layers: got [1, 3)") !=
        std::string::npos);
  // Beyond the pool: 1 MiB cannot hold the records of 3800 more tokens.
  auto kb = Tokens(k, layers, 4096, 200, 3800, row), vb = Tokens(v, layers, 4096, 200, 3800, row);
  r = a->AppendInline({ha->session_id, 1, 200, 3800}, AsBytes(kb.data(), kb.size() * 2),
                      AsBytes(vb.data(), vb.size() * 2));
  CHECK(r.status().code() == StatusCode::kResourceExhausted);
  // Garbage on a raw socket.
  {
    zmq::context_t ctx;
    zmq::socket_t raw(ctx, zmq::socket_type::dealer);
    raw.set(zmq::sockopt::rcvtimeo, 3000);
    raw.connect(daemon.endpoint());
    raw.send(zmq::str_buffer("this is not kvctl"), zmq::send_flags::none);
    zmq::message_t reply;
    REQUIRE(raw.recv(reply).has_value());
    CHECK(reply.size() >= 18);
  }
  auto after = a->FetchDense(ha->session_id, 1, 0, layers, DType::kF32);
  REQUIRE(after.ok());
  const bool same_k =
      std::string(static_cast<const char*>(after->k.data()), after->k.size()) == before_k;
  CHECK(same_k);
  CHECK(after->counts == before->counts);
  CHECK(a->Ping(ha->session_id).ok());
  CHECK(daemon.Stop() == 0);
}

uint64_t PoolBytesUsed(ipc::Client& client) {
  auto text = client.Stats(0, "pool");
  REQUIRE(text.ok());
  const size_t at = text->find("bytes_used:");
  REQUIRE(at != std::string::npos);
  return std::stoull(text->substr(at + 11));
}

TEST_CASE("Daemon: leases free a silent client's pages", "[integration]") {
  DaemonProcess daemon(kSmallPool, "lease_ms = 300\n");
  auto client = daemon.Connect();
  auto monitor = daemon.Connect();
  auto hello = client->Hello({.client_name = "quiet", .geometry = {1, 1, 0, 64, DType::kF32}});
  REQUIRE(hello.ok());
  CHECK(hello->lease_ms == 300);
  REQUIRE(client->Open(hello->session_id, 9).ok());
  std::vector<float> k(500 * 64, 0.5f), v(k.size(), -0.5f);
  REQUIRE(client
              ->AppendInline({hello->session_id, 9, 0, 500}, AsBytes(k.data(), k.size() * 4),
                             AsBytes(v.data(), v.size() * 4))
              .ok());
  CHECK(PoolBytesUsed(*monitor) > 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  CHECK(PoolBytesUsed(*monitor) == 0);
  CHECK(client->FetchDense(hello->session_id, 9, 0, 1).status().code() == StatusCode::kNotFound);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("Daemon: SIGHUP reloads quantizer settings and refuses pool changes", "[integration]") {
  DaemonProcess daemon(std::string(kSmallPool) + "[quant]\nmethod = \"kivi\"\n");
  auto client = daemon.Connect();
  ipc::HelloRequest hello{.client_name = "r", .geometry = {1, 2, 0, 64, DType::kF16}};
  CHECK(client->Hello(hello)->quant.method == static_cast<uint8_t>(QuantMethod::kKivi));
  auto rewrite = [&](const std::string& from, const std::string& to) {
    std::ifstream in(daemon.config_path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(text.find(from) != std::string::npos);
    text.replace(text.find(from), from.size(), to);
    std::ofstream(daemon.config_path()) << text;
  };
  auto hup = [&] {
    daemon.Signal(SIGHUP);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  };
  rewrite("method = \"kivi\"", "method = \"oscar\"");
  hup();
  CHECK(client->Hello(hello)->quant.method == static_cast<uint8_t>(QuantMethod::kOscar));
  // A pool size change is refused: the daemon keeps serving with the last good config.
  rewrite("method = \"oscar\"\n", "method = \"quarot\"\n");
  rewrite("bytes = \"64MiB\"", "bytes = \"128MiB\"");
  hup();
  CHECK(client->Hello(hello)->quant.method == static_cast<uint8_t>(QuantMethod::kOscar));
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("Daemon: SIGTERM stops cleanly and removes the socket and the pool", "[integration]") {
  DaemonProcess daemon(kSmallPool);
  auto client = daemon.Connect(500);
  auto hello = client->Hello({.client_name = "t", .geometry = {1, 1, 0, 64, DType::kF16}});
  REQUIRE(hello.ok());
  struct stat st;
  REQUIRE(stat(daemon.socket_path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  REQUIRE(stat(("/dev/shm" + daemon.shm_name()).c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0400);  // Read-only to clients (docs/reliability.md).
  CHECK(daemon.Stop(SIGTERM) == 0);
  CHECK(stat(daemon.socket_path().c_str(), &st) != 0);
  CHECK(stat(("/dev/shm" + daemon.shm_name()).c_str(), &st) != 0);
  // The client gets an error, not a hang; a restarted daemon serves it again.
  CHECK_FALSE(client->Ping().ok());
  daemon.Start();
  CHECK(client->Ping().ok());
  CHECK(client->Ping(hello->session_id).status().code() == StatusCode::kNotFound);
  CHECK(client->Hello({.client_name = "t", .geometry = {1, 1, 0, 64, DType::kF16}}).ok());
  CHECK(daemon.Stop(SIGINT) == 0);
}

}  // namespace
}  // namespace kvctl
