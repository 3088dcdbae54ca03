// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The [tier] rows of the schema table: the cluster tier the daemon spills sequences to and shares
// prefixes through (docs/tier.md).
#include <charconv>
#include <string>
#include <string_view>

#include "controller/config/config_schema_rows.h"

namespace kvctl::config_rows {
namespace {

// "" or a comma-separated list of HOST:PORT seeds (HOST a name or an IPv4 address).
std::string CheckTierNodes(const ConfigValue& v) {
  const std::string& s = std::get<std::string>(v);
  if (s.empty()) return "";
  constexpr const char* kExpected =
      "\"\" or comma-separated HOST:PORT seed nodes of a Redis Cluster, e.g. "
      "\"127.0.0.1:7000,127.0.0.1:7001\"";
  std::string_view rest = s;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view node = rest.substr(0, comma);
    const size_t colon = node.rfind(':');
    if (colon == std::string_view::npos || colon == 0) return kExpected;
    const std::string_view host = node.substr(0, colon);
    const std::string_view port = node.substr(colon + 1);
    int number = 0;
    const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), number);
    if (error != std::errc() || end != port.data() + port.size() || number < 1 || number > 65535) {
      return kExpected;
    }
    for (char c : host) {
      const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-' || c == '_';
      if (!ok) return kExpected;
    }
    if (comma == std::string_view::npos) return "";
    rest = rest.substr(comma + 1);
  }
}

// A key prefix: 1..64 characters without spaces, braces (Redis Cluster hash tags) or ':'.
std::string CheckKeyPrefix(const ConfigValue& v) {
  const std::string& s = std::get<std::string>(v);
  constexpr const char* kExpected =
      "1..64 characters from [A-Za-z0-9._-] (no ':', braces or spaces)";
  if (s.empty() || s.size() > 64) return kExpected;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '-' || c == '_';
    if (!ok) return kExpected;
  }
  return "";
}

}  // namespace

std::vector<ConfigOption> TierRows() {
  constexpr uint32_t kImm = kImmutable;
  return {
      Row<&Config::tier, &TierConfig::nodes>(
          {.key = "tier.nodes",
           .default_text = "",
           .flags = kImm,
           .env = "KVCTL_TIER_NODES",
           .doc = "Seed nodes of the Redis Cluster that holds spilled sequences and shared "
                  "prefixes, HOST:PORT[,HOST:PORT...]; the daemon learns the rest of the cluster "
                  "from them. \"\" = no tier (SAVE_PREFIX answers FAILED_PRECONDITION, OPEN_PREFIX "
                  "opens empty).",
           .check = &CheckTierNodes}),
      Row<&Config::tier, &TierConfig::key_prefix>(
          {.key = "tier.key_prefix",
           .default_text = "kvctl",
           .flags = kImm,
           .env = "KVCTL_TIER_KEY_PREFIX",
           .doc = "Start of every key the daemon writes (PREFIX:p:... prefixes, PREFIX:s:... "
                  "spilled sequences): daemons that share prefixes use the same one.",
           .check = &CheckKeyPrefix}),
      Row<&Config::tier, &TierConfig::ttl_seconds>(
          {.key = "tier.ttl_seconds",
           .default_text = "86400",
           .min = 0,
           .max = 31536000,
           .flags = kImm,
           .env = "KVCTL_TIER_TTL_SECONDS",
           .doc = "Expiry of every key written; 0 = never (then only CLOSE, BYE and lease "
                  "expiry delete spilled sequences, and saved prefixes stay until deleted by "
                  "hand or by the cluster's maxmemory policy)."}),
      Row<&Config::tier, &TierConfig::quota_bytes>(
          {.key = "tier.quota_bytes",
           .default_text = "1GiB",
           .min = 0,
           .max = 1024 * kTiB,
           .flags = kImm,
           .env = "KVCTL_TIER_QUOTA_BYTES",
           .doc = "Most bytes of spilled sequences this daemon keeps in the tier; a spill past "
                  "it is skipped and the sequence stays in the pool. Saved prefixes have their "
                  "own bound, tier.prefix_quota_bytes."}),
      Row<&Config::tier, &TierConfig::prefix_quota_bytes>(
          {.key = "tier.prefix_quota_bytes",
           .default_text = "4GiB",
           .min = 0,
           .max = 1024 * kTiB,
           .flags = kImm,
           .env = "KVCTL_TIER_PREFIX_QUOTA_BYTES",
           .doc = "Most bytes of saved prefixes this daemon keeps in the tier: the prefixes it "
                  "saved whose tier.ttl_seconds has not run out (a key saved again counts once). "
                  "A SAVE_PREFIX past it gets RESOURCE_EXHAUSTED, so clients cannot fill the "
                  "cluster through the daemon."}),
      Row<&Config::tier, &TierConfig::spill_idle_ms>(
          {.key = "tier.spill_idle_ms",
           .default_text = "0",
           .min = 0,
           .max = 86400000,
           .flags = kImm,
           .env = "KVCTL_TIER_SPILL_IDLE_MS",
           .doc = "A sequence with no APPEND or FETCH for this long is written to the tier and "
                  "its pool pages are freed; its next APPEND or FETCH restores it. 0 = never."}),
      Row<&Config::tier, &TierConfig::spill_on_pressure_idle_ms>(
          {.key = "tier.spill_on_pressure_idle_ms",
           .default_text = "0",
           .min = 0,
           .max = 86400000,
           .flags = kImm,
           .env = "KVCTL_TIER_SPILL_ON_PRESSURE_IDLE_MS",
           .doc = "When an APPEND finds the pool full, sequences of any session idle at least "
                  "this long are spilled to the tier, least recently used first, before widths "
                  "are lowered for it (budget.pressure_scope = \"pool\"). 0 = never."}),
      Row<&Config::tier, &TierConfig::prefix_block_tokens>(
          {.key = "tier.prefix_block_tokens",
           .default_text = "16",
           .min = 1,
           .max = 65536,
           .flags = kImm,
           .env = "KVCTL_TIER_PREFIX_BLOCK_TOKENS",
           .doc = "Granule of the prefix hash chain: prefixes are saved and found at multiples "
                  "of this many tokens. Daemons that share prefixes use the same value."}),
      Row<&Config::tier, &TierConfig::local_prefix_fraction>(
          {.key = "tier.local_prefix_fraction",
           .default_text = "0.25",
           .min = 0,
           .max = 1,
           .flags = kImm,
           .env = "KVCTL_TIER_LOCAL_PREFIX_FRACTION",
           .doc = "Share of pool.bytes the daemon's local prefix cache may hold: prefixes "
                  "SAVE_PREFIX stored or OPEN_PREFIX restored stay in the pool, and sequences "
                  "opened from them share their pages copy-on-write (docs/tier.md). Works "
                  "without tier.nodes. Prefixes no sequence reads are dropped first when the "
                  "pool is full. 0 = no local cache."}),
      Row<&Config::tier, &TierConfig::timeout_ms>(
          {.key = "tier.timeout_ms",
           .default_text = "1000",
           .min = 10,
           .max = 600000,
           .flags = kImm,
           .env = "KVCTL_TIER_TIMEOUT_MS",
           .doc = "Longest wait for one cluster command; a node that does not answer in time "
                  "is treated as down for that command."}),
      Row<&Config::tier, &TierConfig::connect_timeout_ms>(
          {.key = "tier.connect_timeout_ms",
           .default_text = "200",
           .min = 10,
           .max = 60000,
           .flags = kImm,
           .env = "KVCTL_TIER_CONNECT_TIMEOUT_MS",
           .doc = "Longest wait to connect to one cluster node."}),
      Row<&Config::tier, &TierConfig::chunk_bytes>(
          {.key = "tier.chunk_bytes",
           .default_text = "256KiB",
           .min = 4 * kKiB,
           .max = 512 * kMiB,
           .flags = kImm,
           .env = "KVCTL_TIER_CHUNK_BYTES",
           .doc = "Stored values are split into chunks of at most this size, spread over the "
                  "cluster's masters and written and read pipelined (256KiB measured fastest "
                  "for 1-32 MiB values, docs/tier.md)."}),
  };
}

}  // namespace kvctl::config_rows
