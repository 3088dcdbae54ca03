// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The schema table (one row per key) and the typed field access behind it. Parsing and printing
// one value is in config_value.cc; loading, printing and quantizer resolution in config.cc.
#include <string>
#include <type_traits>

#include "controller/config/config.h"
#include "controller/config/config_schema_rows.h"
#include "controller/pool/pool.h"

namespace kvctl {
namespace {

using namespace config_rows;  // NOLINT: the row builders and byte units of this table.

// ---- Extra checks -----------------------------------------------------------------------------

std::string CheckEndpoint(const ConfigValue& v) {
  const std::string& s = std::get<std::string>(v);
  for (std::string_view scheme : {"ipc://", "tcp://"}) {
    if (s.size() > scheme.size() && s.compare(0, scheme.size(), scheme) == 0) return "";
  }
  return "a ZeroMQ endpoint: ipc://PATH or tcp://127.0.0.1:PORT (loopback only)";
}

std::string CheckOptionalEndpoint(const ConfigValue& v) {
  if (std::get<std::string>(v).empty()) return "";
  return CheckEndpoint(v);
}

std::string CheckHttpAddress(const ConfigValue& v) {
  const std::string& s = std::get<std::string>(v);
  if (s.empty()) return "";
  const size_t colon = s.rfind(':');
  const std::string host = colon == std::string::npos ? "" : s.substr(0, colon);
  const std::string port = colon == std::string::npos ? "" : s.substr(colon + 1);
  const bool loopback = host == "127.0.0.1" || host == "localhost" || host == "[::1]";
  const bool numeric = !port.empty() && port.size() <= 5 &&
                       port.find_first_not_of("0123456789") == std::string::npos &&
                       std::stoi(port) <= 65535;
  if (loopback && numeric) return "";
  return "\"\" or a loopback HOST:PORT (127.0.0.1, localhost or [::1])";
}

std::string CheckShmName(const ConfigValue& v) {
  if (ValidateShmName(std::get<std::string>(v)).ok()) return "";
  return "a POSIX shm name: '/' then 1..254 characters, none of them '/'";
}

std::vector<std::string> MethodNames() {
  std::vector<std::string> names;
  for (int i = 0; i < kNumQuantMethods; ++i) {
    names.emplace_back(TraitsOf(static_cast<QuantMethod>(i)).name);
  }
  return names;
}

std::vector<ConfigOption> BuildSchema() {
  constexpr uint32_t kImm = kImmutable;
  constexpr uint32_t kRel = kReloadable;
  std::vector<ConfigOption> rows = {
      // [server]
      Row<&Config::server, &ServerConfig::endpoint>(
          {.key = "server.endpoint",
           .default_text = "ipc:///tmp/kvctl.sock",
           .flags = kImm,
           .env = "KVCTL_SERVER_ENDPOINT",
           .doc = "ZeroMQ endpoint the daemon binds. ipc:// sockets are created with mode 0600; "
                  "tcp:// should be loopback unless CurveZMQ keys are configured.",
           .check = &CheckEndpoint}),
      Row<&Config::server, &ServerConfig::log_level>(
          {.key = "server.log_level",
           .default_text = "info",
           .flags = kRel,
           .env = "KVCTL_SERVER_LOG_LEVEL",
           .names = {"trace", "debug", "info", "warn", "error", "off"},
           .doc = "Log verbosity."}),
      Row<&Config::server, &ServerConfig::lease_ms>(
          {.key = "server.lease_ms",
           .default_text = "10000",
           .min = 100,
           .max = 3600000,
           .flags = kRel,
           .env = "KVCTL_SERVER_LEASE_MS",
           .doc = "A session that sends nothing for this long is dropped and its sequences are "
                  "freed (a dead engine cannot pin pool memory)."}),
      Row<&Config::server, &ServerConfig::workers>(
          {.key = "server.workers",
           .default_text = "2",
           .min = 1,
           .max = 64,
           .flags = kImm,
           .env = "KVCTL_SERVER_WORKERS",
           .doc = "Threads that run quantization and fetches behind the socket."}),
      Row<&Config::server, &ServerConfig::inline_append_tokens>(
          {.key = "server.inline_append_tokens",
           .default_text = "4",
           .min = 0,
           .max = 64,
           .flags = kImm,
           .env = "KVCTL_SERVER_INLINE_APPEND_TOKENS",
           .doc = "An APPEND of at most this many tokens that only stores rows (no flush into "
                  "records, no eviction, no pressure relief, a free sequence lock) is answered on "
                  "the socket's I/O thread when no other request is on a worker, saving two "
                  "thread hand-offs per decode step; 0 = every APPEND goes to a worker."}),
      Row<&Config::server, &ServerConfig::inline_blocks_fetch>(
          {.key = "server.inline_blocks_fetch",
           .default_text = "true",
           .flags = kImm,
           .env = "KVCTL_SERVER_INLINE_BLOCKS_FETCH",
           .doc = "A blocks-mode FETCH (a page-table walk of a few microseconds) is answered on "
                  "the socket's I/O thread when its sequence lock is free, no other request is on "
                  "a worker and, with pool.checksums on, at most 64 KiB of the pool chunks it "
                  "refers to are left to verify (pool.verify_on_fetch); otherwise it goes to a "
                  "worker."}),
      Row<&Config::server, &ServerConfig::inline_dense_fetch_rows>(
          {.key = "server.inline_dense_fetch_rows",
           .default_text = "4096",
           .min = 0,
           .max = 65536,
           .flags = kImm,
           .env = "KVCTL_SERVER_INLINE_DENSE_FETCH_ROWS",
           .doc = "A dense FETCH that decodes at most this many rows in all (tokens x KV heads "
                  "x layers asked for) is answered on the socket's I/O thread under the same "
                  "conditions as an inline blocks FETCH, saving the two thread hand-offs (about "
                  "50 us of a 1K-token layer's 300-500 us on a 2-vCPU guest); the I/O thread is "
                  "then busy for the decode, about 110 us for 3,072 KVarN 2-bit rows of head_dim "
                  "64. 0 = every dense FETCH goes to a worker."}),
      Row<&Config::server, &ServerConfig::dense_fetch_split_rows>(
          {.key = "server.dense_fetch_split_rows",
           .default_text = "0",
           .min = 0,
           .max = 1 << 30,
           .flags = kRel,
           .env = "KVCTL_SERVER_DENSE_FETCH_SPLIT_ROWS",
           .doc = "A dense FETCH that decodes more rows than this (tokens x KV heads x layers "
                  "asked for) is decoded by the worker that serves it and the daemon's fetch "
                  "helper thread together, in parts of 8 units (records or 256 stored rows) both "
                  "take from one counter; when the helper is busy with another FETCH the worker "
                  "decodes it alone. The same bytes either way. Shortens the median wait (8K "
                  "tokens of a SmolLM2 layer on a 2-vCPU guest: 1.5x -> 1.3x a raw round trip), "
                  "but there the client's p99 rose from 3-5 ms to 21-37 ms in most runs, lost "
                  "after the handler, cause not found. 0 (the default) = one thread per FETCH."}),
      Row<&Config::server, &ServerConfig::prepare_split_tokens>(
          {.key = "server.prepare_split_tokens",
           .default_text = "512",
           .min = 0,
           .max = 1 << 30,
           .flags = kRel,
           .env = "KVCTL_SERVER_PREPARE_SPLIT_TOKENS",
           .doc = "An APPEND served by a worker whose Prepare stage works over at least this "
                  "many tokens (its own; for the APPEND that ends a prefill sent with "
                  "APPEND_CONTINUES, the pieces stored before it too) prepares its layers "
                  "(scoring, eviction plans, encoding of the records) on that worker and the "
                  "daemon's prepare helper thread together, one layer at a time from one "
                  "counter; when the helper is busy with another APPEND the worker prepares them "
                  "alone. The same records and state either way. 0 = one thread per APPEND."}),
      Row<&Config::server, &ServerConfig::max_message_bytes>(
          {.key = "server.max_message_bytes",
           .default_text = "256MiB",
           .min = 64 * kKiB,
           .max = 4 * kGiB,
           .flags = kImm,
           .env = "KVCTL_SERVER_MAX_MESSAGE_BYTES",
           .doc = "Largest request accepted, all its frames together (inline K/V of remote "
                  "engines); a larger one gets an INVALID_ARGUMENT error from the transport, and "
                  "a single frame above it disconnects the sender."}),
      Row<&Config::server, &ServerConfig::stats_interval_ms>(
          {.key = "server.stats_interval_ms",
           .default_text = "1000",
           .min = 100,
           .max = 600000,
           .flags = kRel,
           .env = "KVCTL_SERVER_STATS_INTERVAL_MS",
           .doc = "Period of the stats publisher (kvtop, /metrics)."}),
      Row<&Config::server, &ServerConfig::stats_endpoint>(
          {.key = "server.stats_endpoint",
           .default_text = "ipc:///tmp/kvctl-stats.sock",
           .flags = kImm,
           .env = "KVCTL_SERVER_STATS_ENDPOINT",
           .doc = "ZeroMQ PUB endpoint where the stats text is published every "
                  "stats_interval_ms (kvtop subscribes); \"\" = off.",
           .check = CheckOptionalEndpoint}),
      Row<&Config::server, &ServerConfig::http_address>(
          {.key = "server.http_address",
           .default_text = "",
           .flags = kImm,
           .env = "KVCTL_SERVER_HTTP_ADDRESS",
           .doc = "Loopback HOST:PORT serving Prometheus /metrics and /healthz over HTTP, e.g. "
                  "127.0.0.1:9464; \"\" = off.",
           .check = CheckHttpAddress}),
      Row<&Config::server, &ServerConfig::quality_sample_period>(
          {.key = "server.quality_sample_period",
           .default_text = "16",
           .min = 0,
           .max = 1000000,
           .flags = kRel,
           .env = "KVCTL_SERVER_QUALITY_SAMPLE_PERIOD",
           .doc = "Live quality telemetry: every Nth quantized record of each (layer, head) is "
                  "decoded and its relative error recorded, and an evicting head with queries "
                  "measures the attention mass it retains on its first compression and every "
                  "Nth after it (new sequences); 0 = off."}),
      // [pool]
      Row<&Config::pool, &PoolConfig::backend>(
          {.key = "pool.backend",
           .default_text = "cpu",
           .flags = kImm,
           .env = "KVCTL_POOL_BACKEND",
           .names = {"cpu", "cuda"},
           .doc = "Where the pool lives: cpu = POSIX shared memory; cuda = device memory shared "
                  "by CUDA IPC, with a host copy the daemon works on (refused when this build "
                  "has no CUDA or no device is visible)."}),
      Row<&Config::pool, &PoolConfig::cuda_device>(
          {.key = "pool.cuda_device",
           .default_text = "0",
           .min = 0,
           .max = 1023,
           .flags = kImm,
           .env = "KVCTL_POOL_CUDA_DEVICE",
           .doc = "CUDA device ordinal of the cuda pool (as CUDA_VISIBLE_DEVICES numbers them); "
                  "ignored by the cpu pool."}),
      Row<&Config::pool, &PoolConfig::bytes>(
          {.key = "pool.bytes",
           .default_text = "256MiB",
           .min = kMiB,
           .max = 4 * kTiB,
           .flags = kImm,
           .env = "KVCTL_POOL_BYTES",
           .doc = "Total pool size, staging slots included; reserved at startup and never "
                  "exceeded."}),
      Row<&Config::pool, &PoolConfig::page_bytes>(
          {.key = "pool.page_bytes",
           .default_text = "64KiB",
           .min = 4 * kKiB,
           .max = 64 * kMiB,
           .flags = kImm | kPowerOfTwo,
           .env = "KVCTL_POOL_PAGE_BYTES",
           .doc = "Allocation unit of the pool; block records are packed into pages."}),
      Row<&Config::pool, &PoolConfig::shm_name>(
          {.key = "pool.shm_name",
           .default_text = "/kvctl-pool",
           .flags = kImm,
           .env = "KVCTL_POOL_SHM_NAME",
           .doc = "POSIX shared-memory name of the cpu pool (/dev/shm/<name>, mode 0600).",
           .check = &CheckShmName}),
      Row<&Config::pool, &PoolConfig::staging_bytes_per_session>(
          {.key = "pool.staging_bytes_per_session",
           .default_text = "8MiB",
           .min = 0,
           .max = kGiB,
           .flags = kImm,
           .env = "KVCTL_POOL_STAGING_BYTES_PER_SESSION",
           .doc = "Size of one staging slot, where an engine writes new K/V for APPEND; 0 "
                  "disables staging (K/V then travel inline)."}),
      Row<&Config::pool, &PoolConfig::staging_slots>(
          {.key = "pool.staging_slots",
           .default_text = "4",
           .min = 0,
           .max = 4096,
           .flags = kImm,
           .env = "KVCTL_POOL_STAGING_SLOTS",
           .doc = "Sessions that can hold a staging slot at once; the slots are carved from "
                  "pool.bytes and may take at most half of it."}),
      Row<&Config::pool, &PoolConfig::unlink_stale>(
          {.key = "pool.unlink_stale",
           .default_text = "true",
           .flags = kImm,
           .env = "KVCTL_POOL_UNLINK_STALE",
           .doc = "Remove a leftover shm object of the same name that no process holds (its "
                  "daemon died: kill -9, a crash), so the same start command works again; false "
                  "refuses to start and keeps it for inspection. An object a running daemon "
                  "holds is never removed."}),
      Row<&Config::pool, &PoolConfig::budget_fraction>(
          {.key = "pool.budget_fraction",
           .default_text = "0.9",
           .min = 0.1,
           .max = 1.0,
           .flags = kRel,
           .env = "KVCTL_POOL_BUDGET_FRACTION",
           .doc = "Fraction of the pages the budget planner fills; it evicts or lowers bits "
                  "before usage passes it."}),
      Row<&Config::pool, &PoolConfig::checksums>(
          {.key = "pool.checksums",
           .default_text = "true",
           .flags = kImm,
           .env = "KVCTL_POOL_CHECKSUMS",
           .doc = "Keep a CRC32C of every stored pool page in daemon memory, verify it on FETCH "
                  "and in the scrubber, and answer DATA_LOSS for a sequence whose pages changed "
                  "behind the daemon's back; false turns checksums and the scrubber off."}),
      Row<&Config::pool, &PoolConfig::verify_on_fetch>(
          {.key = "pool.verify_on_fetch",
           .default_text = "unverified",
           .flags = kImm,
           .env = "KVCTL_POOL_VERIFY_ON_FETCH",
           .names = {"unverified", "all"},
           .doc = "Which 4 KiB pool chunks a FETCH verifies before it answers: unverified = "
                  "those not verified by a FETCH since they were last written (a FETCH costs "
                  "what changed since the last one; a change after that is found by the "
                  "scrubber); all = every chunk it reads or refers to (grows with the "
                  "sequence). Only with pool.checksums = true."}),
      Row<&Config::pool, &PoolConfig::scrub_interval_ms>(
          {.key = "pool.scrub_interval_ms",
           .default_text = "1000",
           .min = 0,
           .max = 3600000,
           .flags = kImm,
           .env = "KVCTL_POOL_SCRUB_INTERVAL_MS",
           .doc = "Period of the background scrubber, which verifies the checksums of stored "
                  "pages without a FETCH; 0 = no scrubber."}),
      Row<&Config::pool, &PoolConfig::scrub_bytes_per_second>(
          {.key = "pool.scrub_bytes_per_second",
           .default_text = "64MiB",
           .min = 0,
           .max = 64 * kGiB,
           .flags = kImm,
           .env = "KVCTL_POOL_SCRUB_BYTES_PER_SECOND",
           .doc = "Most page bytes the scrubber verifies per second (each period verifies up to "
                  "this x scrub_interval_ms / 1000); 0 = no scrubber."}),
      // [limits]
      Row<&Config::limits, &LimitsConfig::host_memory_bytes>(
          {.key = "limits.host_memory_bytes",
           .default_text = "0",
           .min = 0,
           .max = 4 * kTiB,
           .flags = kRel,
           .env = "KVCTL_LIMITS_HOST_MEMORY_BYTES",
           .doc = "Host memory the daemon may spend on sessions and sequences outside the pool "
                  "(per-stream tables, positions, scorer state), counted before it allocates: a "
                  "HELLO, OPEN or APPEND that would pass it gets RESOURCE_EXHAUSTED; 0 = a "
                  "quarter of pool.bytes, at least 64MiB."}),
      Row<&Config::limits, &LimitsConfig::max_sessions>(
          {.key = "limits.max_sessions",
           .default_text = "1024",
           .min = 1,
           .max = 1000000,
           .flags = kRel,
           .env = "KVCTL_LIMITS_MAX_SESSIONS",
           .doc = "Open sessions at once; one more HELLO gets RESOURCE_EXHAUSTED."}),
      Row<&Config::limits, &LimitsConfig::max_sequences_per_session>(
          {.key = "limits.max_sequences_per_session",
           .default_text = "4096",
           .min = 1,
           .max = 1000000,
           .flags = kRel,
           .env = "KVCTL_LIMITS_MAX_SEQUENCES_PER_SESSION",
           .doc = "Open sequences per session; one more OPEN gets RESOURCE_EXHAUSTED."}),
      Row<&Config::limits, &LimitsConfig::stats_max_lines>(
          {.key = "limits.stats_max_lines",
           .default_text = "500",
           .min = 1,
           .max = 1000,
           .flags = kRel,
           .env = "KVCTL_LIMITS_STATS_MAX_LINES",
           .doc = "Per-sequence, per-layer and per-head lines in one STATS answer; the rest are "
                  "counted in <section>_omitted, so STATS always fits one reply."}),
      // [quant]
      Row<&QuantSettings::method>(
          {.key = "quant.method",
           .default_text = "kvarn",
           .flags = kRel,
           .env = "KVCTL_QUANT_METHOD",
           .names = MethodNames(),
           .doc = "Quantizer of new sequences (kernels/quant_types.h registry)."}),
      Row<&QuantSettings::k_bits>(
          {.key = "quant.k_bits",
           .default_text = "2",
           .min = 1,
           .max = 16,
           .flags = kRel,
           .env = "KVCTL_QUANT_K_BITS",
           .doc = "Code width of K; the method's allowed widths are checked (fp16: 16)."}),
      Row<&QuantSettings::v_bits>({.key = "quant.v_bits",
                                   .default_text = "2",
                                   .min = 1,
                                   .max = 16,
                                   .flags = kRel,
                                   .env = "KVCTL_QUANT_V_BITS",
                                   .doc = "Code width of V."}),
      Row<&QuantSettings::block_tokens>(
          {.key = "quant.block_tokens",
           .default_text = "0",
           .min = 0,
           .max = 1024,
           .flags = kRel,
           .env = "KVCTL_QUANT_BLOCK_TOKENS",
           .doc = "Tokens per block record; 0 = method default (kvarn 128, others 32)."}),
      Row<&QuantSettings::k_group_tokens>(
          {.key = "quant.k_group_tokens",
           .default_text = "0",
           .min = 0,
           .max = 1024,
           .flags = kRel,
           .env = "KVCTL_QUANT_K_GROUP_TOKENS",
           .doc = "Tokens sharing one K scale per channel (kivi, oscar; ignored by the others); "
                  "0 = method default."}),
      Row<&QuantSettings::v_group_channels>(
          {.key = "quant.v_group_channels",
           .default_text = "0",
           .min = 0,
           .max = 1024,
           .flags = kRel,
           .env = "KVCTL_QUANT_V_GROUP_CHANNELS",
           .doc = "Channels sharing one V scale per token (kivi, oscar; ignored by the others); "
                  "0 = method default."}),
      Row<&QuantSettings::lossless>(
          {.key = "quant.lossless",
           .default_text = "false",
           .flags = kRel,
           .env = "KVCTL_QUANT_LOSSLESS",
           .doc = "Compression off: keep every token exactly as sent, in the session dtype, and "
                  "never quantize (the baseline for exactness checks; method and bits are "
                  "ignored)."}),
      Row<&QuantSettings::sinkhorn_iters>(
          {.key = "quant.sinkhorn_iters",
           .default_text = "4",
           .min = 1,
           .max = 64,
           .flags = kRel,
           .env = "KVCTL_QUANT_SINKHORN_ITERS",
           .doc = "KVarN variance-normalisation iterations (ignored by the other methods)."}),
      Row<&QuantSettings::sink_tokens>(
          {.key = "quant.sink_tokens",
           .default_text = "-1",
           .min = -1,
           .max = 65536,
           .flags = kRel,
           .env = "KVCTL_QUANT_SINK_TOKENS",
           .doc = "First tokens of a sequence kept fp16 forever; -1 = method default "
                  "(kvarn, oscar 32; kivi 16; quarot, turbo, fp16 0)."}),
      Row<&QuantSettings::flush_tokens>(
          {.key = "quant.flush_tokens",
           .default_text = "0",
           .min = 0,
           .max = 65536,
           .flags = kRel,
           .env = "KVCTL_QUANT_FLUSH_TOKENS",
           .doc = "fp16 tail length that triggers quantization, a multiple of block_tokens; 0 = "
                  "method default rounded up to a multiple of block_tokens (budget.mode = joint: "
                  "block_tokens, since the plan charges each head flush_tokens - 1 fp16 rows)."}),
      Row<&QuantSettings::flush_spread_steps>(
          {.key = "quant.flush_spread_steps",
           .default_text = "1",
           .min = 1,
           .max = kMaxFlushSpreadSteps,
           .flags = kRel,
           .env = "KVCTL_QUANT_FLUSH_SPREAD_STEPS",
           .doc = "Appends over which a sequence spreads the flushes of its quantized layers "
                  "that fall due together (at most flush_tokens): at most ceil(layers / steps) "
                  "layers quantize their tails per append, the others hold up to steps - 1 more "
                  "fp16 rows meanwhile (the same records, written later). 1 = every layer on the "
                  "step its tail reaches flush_tokens. Trades the decode step that carries the "
                  "whole flush for a few steps that carry part of it."}),
      Row<&QuantSettings::flush_after_reply>(
          {.key = "quant.flush_after_reply",
           .default_text = "false",
           .flags = kRel,
           .env = "KVCTL_QUANT_FLUSH_AFTER_REPLY",
           .doc = "A decode step whose tails reach flush_tokens only stores its rows and is "
                  "answered; a worker then encodes that flush's records (nothing an engine "
                  "reads changes) and the next APPEND writes them. A tail may pass "
                  "flush_tokens by up to 15 rows while the encoding is not done; then the "
                  "APPEND flushes itself. The same records. Sequences with eviction flush on "
                  "the request path as before."}),
      // [budget]
      Row<&Config::budget, &BudgetConfig::mode>(
          {.key = "budget.mode",
           .default_text = "none",
           .flags = kRel,
           .env = "KVCTL_BUDGET_MODE",
           .names = {"none", "quant-only", "evict-only", "joint"},
           .doc = "Budget lever of new sequences: none = keep every token at the [quant] widths; "
                  "quant-only = per-head widths from the RateQuant profile at budget.avg_bits; "
                  "evict-only = per-head token budgets enforced during APPEND by [evict]; joint "
                  "= one byte budget split into per-head kept tokens and widths by the joint "
                  "planner from budget.profile."}),
      Row<&Config::budget, &BudgetConfig::tokens_per_head>(
          {.key = "budget.tokens_per_head",
           .default_text = "0",
           .min = 0,
           .max = 16777216,
           .flags = kRel,
           .env = "KVCTL_BUDGET_TOKENS_PER_HEAD",
           .doc = "evict-only: average tokens kept per (layer, KV head), sinks and window "
                  "included; a hard cap after every APPEND. 0 = use budget.token_fraction or "
                  "budget.fp16_fraction."}),
      Row<&Config::budget, &BudgetConfig::token_fraction>(
          {.key = "budget.token_fraction",
           .default_text = "0.0",
           .min = 0,
           .max = 1,
           .flags = kRel,
           .env = "KVCTL_BUDGET_TOKEN_FRACTION",
           .doc = "evict-only: average tokens kept per head as a fraction of the tokens appended "
                  "so far (never below the floor); 0 = use budget.tokens_per_head or "
                  "budget.fp16_fraction."}),
      Row<&Config::budget, &BudgetConfig::bytes>(
          {.key = "budget.bytes",
           .default_text = "0B",
           .min = 0,
           .max = 4 * kTiB,
           .flags = kRel,
           .env = "KVCTL_BUDGET_BYTES",
           .doc = "joint: payload bytes one sequence may hold; 0 = use budget.fp16_fraction. "
                  "Other modes refuse it."}),
      Row<&Config::budget, &BudgetConfig::plan_tokens>(
          {.key = "budget.plan_tokens",
           .default_text = "0",
           .min = 0,
           .max = 16777216,
           .flags = kRel,
           .env = "KVCTL_BUDGET_PLAN_TOKENS",
           .doc = "joint: the sequence length (tokens per head) the joint plan is made for; "
                  "each head's kept-token cap and widths are fixed at OPEN from it."}),
      Row<&Config::budget, &BudgetConfig::fp16_fraction>(
          {.key = "budget.fp16_fraction",
           .default_text = "0.0",
           .min = 0,
           .max = 1,
           .flags = kRel,
           .env = "KVCTL_BUDGET_FP16_FRACTION",
           .doc = "quant-only: size as a fraction of fp16, i.e. average bits = 16 x this; "
                  "0 = use budget.avg_bits. joint: the byte budget as this fraction of the fp16 "
                  "bytes of budget.plan_tokens tokens. evict-only: a memory budget instead of "
                  "a token count: each head keeps as many tokens as its records and fp16 rows "
                  "(sinks, half a flush of tail on average) fit in this fraction of the fp16 "
                  "bytes of the tokens appended so far."}),
      Row<&Config::budget, &BudgetConfig::eviction_scale>(
          {.key = "budget.eviction_scale",
           .default_text = "1.0",
           .min = 0.01,
           .max = 100,
           .flags = kRel,
           .env = "KVCTL_BUDGET_EVICTION_SCALE",
           .doc = "joint: the exchange rate between the planner's two levers, the predicted "
                  "distortion of an evicted token as a multiple of one quantized to 0 bits "
                  "(docs/joint_planner.md); larger keeps more tokens at lower widths."}),
      Row<&Config::budget, &BudgetConfig::avg_bits>(
          {.key = "budget.avg_bits",
           .default_text = "0.0",
           .min = 0,
           .max = 16,
           .flags = kRel,
           .env = "KVCTL_BUDGET_AVG_BITS",
           .doc = "quant-only: average bits per K/V element, metadata included, that the "
                  "RateQuant allocation of budget.profile spends; 0 = use budget.fp16_fraction."}),
      Row<&Config::budget, &BudgetConfig::layer_profile>(
          {.key = "budget.layer_profile",
           .default_text = "uniform",
           .flags = kRel,
           .env = "KVCTL_BUDGET_LAYER_PROFILE",
           .names = {"uniform", "pyramid", "demand"},
           .doc = "How evict-only splits the token budget over layers: uniform, pyramid "
                  "(PyramidKV schedule) or demand (ReasonAlloc-like, from the [reasonalloc] table "
                  "of budget.profile)."}),
      Row<&Config::budget, &BudgetConfig::profile>(
          {.key = "budget.profile",
           .default_text = "",
           .flags = kRel,
           .env = "KVCTL_BUDGET_PROFILE",
           .doc = "Path of a kvcalib fit profile; read at load and on SIGHUP. Needed by "
                  "quant-only and by layer_profile = demand; \"\" = none."}),
      Row<&Config::budget, &BudgetConfig::demand_power>(
          {.key = "budget.demand_power",
           .default_text = "1.0",
           .min = 0,
           .max = 4,
           .flags = kRel,
           .env = "KVCTL_BUDGET_DEMAND_POWER",
           .doc = "layer_profile = demand: each layer's share of the budget follows its demand "
                  "raised to this power; 1 = proportional (ReasonAlloc-like), 0.5 = square root "
                  "(softer), 0 = uniform."}),
      Row<&Config::budget, &BudgetConfig::realloc_period>(
          {.key = "budget.realloc_period",
           .default_text = "0",
           .min = 0,
           .max = 1000000,
           .flags = kRel,
           .env = "KVCTL_BUDGET_REALLOC_PERIOD",
           .doc = "evict-only: every this many appended tokens each layer's budget is re-split "
                  "over its heads by attention utility (needs Q: h2o, snapkv, rkv), the layers in "
                  "turns with evict.stagger_layers; 0 = even split."}),
      Row<&Config::budget, &BudgetConfig::floor>(
          {.key = "budget.floor",
           .default_text = "0",
           .min = 0,
           .max = 16777216,
           .flags = kRel,
           .env = "KVCTL_BUDGET_FLOOR",
           .doc = "Starvation floor: no head's budget goes below this many tokens; 0 = "
                  "max(window + 8, average / 4). Never below the protected sinks + window."}),
      Row<&Config::budget, &BudgetConfig::realloc_ema>(
          {.key = "budget.realloc_ema",
           .default_text = "0.5",
           .min = 0.01,
           .max = 1,
           .flags = kRel,
           .env = "KVCTL_BUDGET_REALLOC_EMA",
           .doc = "Weight of the newest head utility in its moving average."}),
      Row<&Config::budget, &BudgetConfig::realloc_split>(
          {.key = "budget.realloc_split",
           .default_text = "proportional",
           .flags = kRel,
           .env = "KVCTL_BUDGET_REALLOC_SPLIT",
           .names = {"proportional", "greedy"},
           .doc = "How head re-allocation splits a layer's budget: greedy = every head its floor, "
                  "then the rest a few tokens at a time to the head whose next tokens hold the "
                  "most observed attention mass; proportional = floor + the rest in proportion "
                  "to each head's utility (the mass budget/4 more tokens would win back)."}),
      Row<&Config::budget, &BudgetConfig::pressure>(
          {.key = "budget.pressure",
           .default_text = "fail",
           .flags = kRel,
           .env = "KVCTL_BUDGET_PRESSURE",
           .names = {"fail", "requantize"},
           .doc = "When the pool has no pages for an APPEND: fail = RESOURCE_EXHAUSTED, nothing "
                  "changes; requantize = first lower the widths of the sequence's stored records "
                  "(cheapest predicted distortion per byte, budget.profile curves if it fits), "
                  "then retry."}),
      Row<&Config::budget, &BudgetConfig::pressure_min_bits>(
          {.key = "budget.pressure_min_bits",
           .default_text = "2",
           .min = 1,
           .max = 16,
           .flags = kRel,
           .env = "KVCTL_BUDGET_PRESSURE_MIN_BITS",
           .doc = "requantize: no head's K or V width is lowered below this."}),
      Row<&Config::budget, &BudgetConfig::pressure_scope>(
          {.key = "budget.pressure_scope",
           .default_text = "sequence",
           .flags = kRel,
           .env = "KVCTL_BUDGET_PRESSURE_SCOPE",
           .names = {"sequence", "pool"},
           .doc = "requantize: whose stored widths a full pool lowers: the appending sequence's "
                  "only, or (pool) then also other open sequences' opened with requantize."}),
      // [evict]
      Row<&Config::evict, &EvictConfig::policy>(
          {.key = "evict.policy",
           .default_text = "streaming",
           .flags = kRel,
           .env = "KVCTL_EVICT_POLICY",
           .names = {"streaming", "h2o", "snapkv", "rkv"},
           .doc = "Token scorer when budget.mode evicts: streaming (sinks + newest, no Q), h2o "
                  "(accumulated attention), snapkv (observation window), rkv (importance and "
                  "redundancy). h2o, snapkv and rkv need Q with every APPEND."}),
      Row<&Config::evict, &EvictConfig::sinks>(
          {.key = "evict.sinks",
           .default_text = "4",
           .min = 0,
           .max = 65536,
           .flags = kRel,
           .env = "KVCTL_EVICT_SINKS",
           .doc = "First tokens never evicted (quant.sink_tokens fp16 sinks are never evicted "
                  "either)."}),
      Row<&Config::evict, &EvictConfig::window>(
          {.key = "evict.window",
           .default_text = "0",
           .min = 0,
           .max = 65536,
           .flags = kRel,
           .env = "KVCTL_EVICT_WINDOW",
           .doc = "Newest tokens never evicted; 0 = max(8, the observation window)."}),
      Row<&Config::evict, &EvictConfig::obs_window>(
          {.key = "evict.obs_window",
           .default_text = "0",
           .min = 0,
           .max = 4096,
           .flags = kRel,
           .env = "KVCTL_EVICT_OBS_WINDOW",
           .doc = "Query rows that observe (snapkv, rkv; also the attention mass of h2o and "
                  "streaming); 0 = policy default (snapkv 32, others 8). At most evict.window."}),
      Row<&Config::evict, &EvictConfig::kernel>(
          {.key = "evict.kernel",
           .default_text = "0",
           .min = 0,
           .max = 63,
           .flags = kRel,
           .env = "KVCTL_EVICT_KERNEL",
           .doc = "Pooling kernel of snapkv / rkv importance, odd; 0 = policy default (snapkv 5, "
                  "rkv 7)."}),
      Row<&Config::evict, &EvictConfig::pooling>(
          {.key = "evict.pooling",
           .default_text = "default",
           .flags = kRel,
           .env = "KVCTL_EVICT_POOLING",
           .names = {"default", "max", "avg"},
           .doc = "Pooling of snapkv / rkv importance; default = snapkv avg, rkv max."}),
      Row<&Config::evict, &EvictConfig::group>(
          {.key = "evict.group",
           .default_text = "default",
           .flags = kRel,
           .env = "KVCTL_EVICT_GROUP",
           .names = {"default", "max", "mean"},
           .doc = "How snapkv / rkv reduce a GQA group's query heads: max = max of the logits, "
                  "one softmax (R-KV); mean = a softmax per query head, then the mean "
                  "(SnapKV); default = snapkv mean, rkv max."}),
      Row<&Config::evict, &EvictConfig::softmax>(
          {.key = "evict.softmax",
           .default_text = "default",
           .flags = kRel,
           .env = "KVCTL_EVICT_SOFTMAX",
           .names = {"default", "candidates", "causal"},
           .doc = "Keys an observation query's softmax normalises over (snapkv / rkv): "
                  "candidates = those before the recent window (R-KV); causal = every key it "
                  "sees, window included (SnapKV); default = snapkv causal, rkv candidates."}),
      Row<&Config::evict, &EvictConfig::lambda>(
          {.key = "evict.lambda",
           .default_text = "0.07",
           .min = 0,
           .max = 1,
           .flags = kRel,
           .env = "KVCTL_EVICT_LAMBDA",
           .doc = "rkv: score = lambda * importance - (1 - lambda) * redundancy."}),
      Row<&Config::evict, &EvictConfig::compression_period>(
          {.key = "evict.compression_period",
           .default_text = "32",
           .min = 1,
           .max = 65536,
           .flags = kRel,
           .env = "KVCTL_EVICT_COMPRESSION_PERIOD",
           .doc = "A head over its budget is compressed to budget - period + 1 tokens, so the "
                  "next period - 1 tokens need no scoring (R-KV's buffer); 1 = evict to the "
                  "budget at every overflow (costly on quantized layers: docs/budgets.md)."}),
      Row<&Config::evict, &EvictConfig::stagger_layers>(
          {.key = "evict.stagger_layers",
           .default_text = "true",
           .flags = kRel,
           .env = "KVCTL_EVICT_STAGGER_LAYERS",
           .doc = "Each layer compresses on its own step of the compression period (layer l at "
                  "the steps where tokens + l * period / layers is a multiple of the period) "
                  "when it holds more than budget - period + 1 tokens, instead of every layer on "
                  "the step they all overflow: at most ceil(layers / period) layers score and "
                  "re-pack per decode step. The same budgets hold; with a growing budget "
                  "(token_fraction) a layer compresses every period steps, a few tokens each "
                  "time (docs/budgets.md). Head re-allocation (budget.realloc_period) takes "
                  "turns the same way after a layer's first re-split. false = each layer when it "
                  "overflows, all on one step, and every layer re-splits on the same append."}),
      Row<&Config::evict, &EvictConfig::whole_records>(
          {.key = "evict.whole_records",
           .default_text = "true",
           .flags = kRel,
           .env = "KVCTL_EVICT_WHOLE_RECORDS",
           .doc = "streaming: a compression whose cut falls inside the oldest quantized record "
                  "evicts up to the record's end, so whole records are dropped and none is "
                  "decoded and quantized again (up to block_tokens - 1 more tokens evicted, the "
                  "budget never exceeded). false = evict exactly to budget - period + 1 and "
                  "re-pack every record behind the cut."}),
      Row<&Config::evict, &EvictConfig::max_deferred_tokens>(
          {.key = "evict.max_deferred_tokens",
           .default_text = "131072",
           .min = 0,
           .max = 16777216,
           .flags = kRel,
           .env = "KVCTL_EVICT_MAX_DEFERRED_TOKENS",
           .doc = "A prefill sent as several APPENDs flagged APPEND_CONTINUES is evicted once, "
                  "at its last APPEND; a sequence stores at most this many tokens so, beyond "
                  "its budget, and an APPEND past it evicts as if unflagged (STATS "
                  "deferral_cap_hits). 0 = never defer (docs/eviction.md)."}),
      Row<&Config::evict, &EvictConfig::full_heads>(
          {.key = "evict.full_heads",
           .default_text = "",
           .flags = kRel,
           .env = "KVCTL_EVICT_FULL_HEADS",
           .doc = "evict-only: (layer, KV head) pairs that keep every token, as \"layer:head\" "
                  "comma-separated, e.g. \"17:1,20:2\" (the copying heads "
                  "tools/kveval_heads_sim.py ranks). The others' average budget shrinks so that "
                  "the sequence keeps the same total: (L x H x budget - R x tokens) / (L x H - R) "
                  "for R such pairs, never below the floor. Needs budget.layer_profile = "
                  "\"uniform\" and budget.realloc_period = 0; \"\" = none (docs/eviction.md)."}),
      // [[quant.override]] and [[model.override]]
      Row<&QuantOverride::layer>({.key = "quant.override.layer",
                                  .min = 0,
                                  .max = 4095,
                                  .flags = kRel | kRequired,
                                  .doc = "Layer the override applies to."}),
      Row<&QuantOverride::head>(
          {.key = "quant.override.head",
           .default_text = "-1",
           .min = -1,
           .max = 1023,
           .flags = kRel,
           .doc = "KV head of that layer; -1 = all its heads (an exact head wins over -1)."}),
      Row<&QuantOverride::k_bits>({.key = "quant.override.k_bits",
                                   .default_text = "0",
                                   .min = 0,
                                   .max = 16,
                                   .flags = kRel,
                                   .doc = "K code width there; 0 = keep the inherited width."}),
      Row<&QuantOverride::v_bits>({.key = "quant.override.v_bits",
                                   .default_text = "0",
                                   .min = 0,
                                   .max = 16,
                                   .flags = kRel,
                                   .doc = "V code width there; 0 = keep the inherited width."}),
      // [[model]]
      Row<&ModelConfig::name>(
          {.key = "model.name",
           .flags = kRel | kRequired,
           .doc = "Model name sent by the client in HELLO (full name or the part after the "
                  "last '/'). The table may also set any [quant] key and hold [[model.override]] "
                  "tables, for that model only."}),
  };
  for (ConfigOption& row : TierRows()) rows.push_back(std::move(row));
  return rows;
}

}  // namespace

std::string_view ConfigSourceName(ConfigSource source) {
  switch (source) {
    case ConfigSource::kDefault:
      return "default";
    case ConfigSource::kFile:
      return "file";
    case ConfigSource::kEnv:
      return "env";
    case ConfigSource::kCli:
      return "cli";
  }
  return "unknown";
}

std::string_view ConfigOption::short_key() const {
  return std::string_view(key).substr(key.rfind('.') + 1);
}

const std::vector<ConfigOption>& ConfigSchema() {
  static const std::vector<ConfigOption> schema = BuildSchema();
  return schema;
}

const ConfigOption* FindConfigOption(std::string_view key) {
  for (const ConfigOption& o : ConfigSchema()) {
    if (o.key == key) return &o;
  }
  return nullptr;
}

Config::Config() {
  for (const ConfigOption& o : ConfigSchema()) {
    if (o.scope != ConfigScope::kGlobal && o.scope != ConfigScope::kQuant) continue;
    StatusOr<ConfigValue> v = ParseConfigValue(o, o.default_text);
    KVCTL_CHECK(v.ok());  // The table's own defaults; a test parses every one.
    o.set(o.scope == ConfigScope::kGlobal ? static_cast<void*>(this) : &quant, *v);
  }
}

bool Config::operator==(const Config& other) const {
  return server == other.server && pool == other.pool && quant == other.quant &&
         budget == other.budget && evict == other.evict && tier == other.tier &&
         quant_overrides == other.quant_overrides && models == other.models;
}

}  // namespace kvctl
