// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/config/config.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

namespace kvctl {
namespace {

const std::string kSource = KVCTL_SOURCE_DIR;

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

Config Parsed(std::string_view toml) {
  Config c;
  const Status s = ApplyToml(c, toml, "test.toml");
  INFO(s.ToString());
  REQUIRE(s.ok());
  return c;
}

// ApplyToml then ValidateConfig, as LoadConfig does for a file.
Status Load(std::string_view toml, Config* out = nullptr) {
  Config c;
  KVCTL_RETURN_IF_ERROR(ApplyToml(c, toml, "test.toml"));
  KVCTL_RETURN_IF_ERROR(ValidateConfig(c));
  if (out != nullptr) *out = c;
  return OkStatus();
}

std::string WriteTemp(const std::string& text) {
  static int n = 0;
  const std::string path =
      "/tmp/kvctl_config_test_" + std::to_string(getpid()) + "_" + std::to_string(n++) + ".toml";
  std::ofstream(path) << text;
  return path;
}

EnvLookup MapEnv(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

bool Overridable(const ConfigOption& o) {
  return o.scope == ConfigScope::kGlobal || o.scope == ConfigScope::kQuant;
}

// TOML snippet that sets `o` to `value` (TOML text) in its own section.
std::string Snippet(const ConfigOption& o, const std::string& value) {
  const std::string section = o.key.substr(0, o.key.find('.'));
  return "[" + section + "]\n" + std::string(o.short_key()) + " = " + value + "\n";
}

TEST_CASE("Config: every key has its documented default", "[controller][config]") {
  // The brief's defaults, spelled out so a wrong table row cannot pass by agreeing with itself.
  const std::map<std::string, std::string> expected = {
      {"server.endpoint", "\"ipc:///tmp/kvctl.sock\""},
      {"server.log_level", "\"info\""},
      {"server.lease_ms", "10000"},
      {"server.workers", "2"},
      {"server.inline_append_tokens", "4"},
      {"server.inline_blocks_fetch", "true"},
      {"server.inline_dense_fetch_rows", "4096"},
      {"server.dense_fetch_split_rows", "0"},
      {"server.prepare_split_tokens", "512"},
      {"server.max_message_bytes", "\"256MiB\""},
      {"server.stats_interval_ms", "1000"},
      {"server.stats_endpoint", "\"ipc:///tmp/kvctl-stats.sock\""},
      {"server.http_address", "\"\""},
      {"server.quality_sample_period", "16"},
      {"pool.backend", "\"cpu\""},
      {"pool.cuda_device", "0"},
      {"pool.bytes", "\"256MiB\""},
      {"pool.page_bytes", "\"64KiB\""},
      {"pool.shm_name", "\"/kvctl-pool\""},
      {"pool.staging_bytes_per_session", "\"8MiB\""},
      {"pool.staging_slots", "4"},
      {"pool.unlink_stale", "true"},
      {"pool.budget_fraction", "0.9"},
      {"pool.checksums", "true"},
      {"pool.verify_on_fetch", "\"unverified\""},
      {"pool.scrub_interval_ms", "1000"},
      {"pool.scrub_bytes_per_second", "\"64MiB\""},
      {"quant.method", "\"kvarn\""},
      {"quant.k_bits", "2"},
      {"quant.v_bits", "2"},
      {"quant.block_tokens", "0"},
      {"quant.k_group_tokens", "0"},
      {"quant.v_group_channels", "0"},
      {"quant.sinkhorn_iters", "4"},
      {"quant.lossless", "false"},
      {"quant.sink_tokens", "-1"},
      {"quant.flush_tokens", "0"},
      {"quant.flush_spread_steps", "1"},
      {"quant.flush_after_reply", "false"},
      {"budget.mode", "\"none\""},
      {"budget.tokens_per_head", "0"},
      {"budget.token_fraction", "0.0"},
      {"budget.bytes", "\"0B\""},
      {"budget.plan_tokens", "0"},
      {"budget.fp16_fraction", "0.0"},
      {"budget.eviction_scale", "1.0"},
      {"budget.avg_bits", "0.0"},
      {"budget.layer_profile", "\"uniform\""},
      {"budget.profile", "\"\""},
      {"budget.demand_power", "1.0"},
      {"budget.realloc_period", "0"},
      {"budget.floor", "0"},
      {"budget.realloc_ema", "0.5"},
      {"budget.realloc_split", "\"proportional\""},
      {"budget.pressure", "\"fail\""},
      {"budget.pressure_min_bits", "2"},
      {"budget.pressure_scope", "\"sequence\""},
      {"evict.policy", "\"streaming\""},
      {"evict.sinks", "4"},
      {"evict.window", "0"},
      {"evict.obs_window", "0"},
      {"evict.kernel", "0"},
      {"evict.pooling", "\"default\""},
      {"evict.group", "\"default\""},
      {"evict.softmax", "\"default\""},
      {"evict.lambda", "0.07"},
      {"evict.compression_period", "32"},
      {"evict.stagger_layers", "true"},
      {"evict.whole_records", "true"},
      {"evict.max_deferred_tokens", "131072"},
      {"evict.full_heads", "\"\""},
      {"limits.host_memory_bytes", "\"0B\""},
      {"limits.max_sessions", "1024"},
      {"limits.max_sequences_per_session", "4096"},
      {"limits.stats_max_lines", "500"},
      {"tier.nodes", "\"\""},
      {"tier.key_prefix", "\"kvctl\""},
      {"tier.ttl_seconds", "86400"},
      {"tier.quota_bytes", "\"1GiB\""},
      {"tier.prefix_quota_bytes", "\"4GiB\""},
      {"tier.spill_idle_ms", "0"},
      {"tier.spill_on_pressure_idle_ms", "0"},
      {"tier.prefix_block_tokens", "16"},
      {"tier.timeout_ms", "1000"},
      {"tier.connect_timeout_ms", "200"},
      {"tier.chunk_bytes", "\"256KiB\""},
      {"tier.local_prefix_fraction", "0.25"},
  };
  const Config c;
  size_t checked = 0;
  for (const ConfigOption& o : ConfigSchema()) {
    INFO(o.key);
    CHECK(!o.doc.empty());
    // Exactly one reload behaviour per key.
    CHECK(((o.flags & kImmutable) != 0) != ((o.flags & kReloadable) != 0));
    if (!Overridable(o)) {
      CHECK(o.env.empty());
      continue;
    }
    std::string env = "KVCTL_";
    for (char ch : o.key) env += ch == '.' ? '_' : static_cast<char>(std::toupper(ch));
    CHECK(o.env == env);
    StatusOr<ConfigValue> d = ParseConfigValue(o, o.default_text);
    REQUIRE(d.ok());
    CHECK(*GetConfigValueText(c, o.key) == FormatConfigValue(o, *d));
    REQUIRE(expected.count(o.key) == 1);
    CHECK(*GetConfigValueText(c, o.key) == expected.at(o.key));
    ++checked;
  }
  CHECK(checked == expected.size());
  CHECK(c.pool.bytes == 256u << 20);
  CHECK(c.quant.method == QuantMethod::kKvarn);
  CHECK(c.server.log_level == LogLevel::kInfo);
  CHECK(c.sources.empty());
  // Override table defaults match the struct a caller builds in code.
  Config with_ov = Parsed("[[quant.override]]\nlayer = 3\nk_bits = 4\n");
  REQUIRE(with_ov.quant_overrides.size() == 1);
  CHECK(with_ov.quant_overrides[0] == QuantOverride{.layer = 3, .k_bits = 4});
  CHECK(ValidateConfig(c).ok());
}

TEST_CASE("Config: each bad value names the key, the value and what was expected",
          "[controller][config]") {
  for (const ConfigOption& o : ConfigSchema()) {
    if (!Overridable(o)) continue;
    // (TOML value, text that must appear in the error).
    std::vector<std::pair<std::string, std::string>> bad;
    switch (o.type) {
      case ConfigType::kInt:
        bad = {{std::to_string(static_cast<int64_t>(o.max) + 1),
                std::to_string(static_cast<int64_t>(o.max) + 1)},
               {"\"seven\"", "seven"},
               {"1.5", "1.5"}};
        break;
      case ConfigType::kBytes:
        bad = {{"\"12XB\"", "12XB"}, {"\"10MB\"", "10MB"}, {"-5", "-5"}, {"\"8EiB\"", "8EiB"}};
        break;
      case ConfigType::kDouble: {
        std::ostringstream above;  // Past the maximum: 7.5 for a fraction in 0..1.
        above << o.max + 6.5;
        bad = {{above.str(), above.str()}, {"\"half\"", "half"}};
        break;
      }
      case ConfigType::kBool:
        bad = {{"\"yes\"", "yes"}, {"1", "1"}};
        break;
      case ConfigType::kString:
        bad = {{"5", "5"}};
        break;
      case ConfigType::kEnum:
        bad = {{"\"bogus\"", "bogus"}, {"3", "3"}};
        break;
    }
    for (const auto& [value, shown] : bad) {
      const std::string toml = Snippet(o, value);
      INFO(toml);
      Config c;
      const Status s = ApplyToml(c, toml, "test.toml");
      REQUIRE(!s.ok());
      CHECK(s.code() == StatusCode::kInvalidArgument);
      CHECK(Has(s.message(), "test.toml:2:"));
      CHECK(Has(s.message(), o.key + ": got "));
      CHECK(Has(s.message(), shown));
      CHECK(Has(s.message(), "expected " + DescribeExpected(o).substr(0, 10)));
      CHECK(c == Config());  // A failed file changes nothing.
    }
  }
  // Range and format checks beyond the type.
  for (const auto& [toml, part] : std::vector<std::pair<std::string, std::string>>{
           {"[pool]\npage_bytes = 3000\n", "pool.page_bytes: got 3000B, expected a power-of-two"},
           {"[pool]\npage_bytes = \"128MiB\"\n", "pool.page_bytes: got 128MiB"},
           {"[pool]\nbytes = \"512KiB\"\n", "pool.bytes: got 512KiB, expected a byte size in 1MiB"},
           {"[pool]\nshm_name = \"kvctl\"\n", "pool.shm_name: got \"kvctl\", expected a POSIX"},
           {"[pool]\nshm_name = \"/a/b\"\n", "pool.shm_name: got \"/a/b\""},
           {"[server]\nendpoint = \"http://x\"\n", "server.endpoint: got \"http://x\""},
           {"[server]\nlease_ms = 50\n", "server.lease_ms: got 50, expected an integer in 100.."},
           {"[quant]\nsinkhorn_iters = 0\n", "quant.sinkhorn_iters: got 0"},
           {"[quant]\nmethod = \"gptq\"\n",
            "quant.method: got \"gptq\", expected one of fp16, "
            "kivi, quarot, kvarn, oscar"},
           {"[[quant.override]]\nlayer = -2\nk_bits = 4\n", "quant.override.layer: got -2"},
           {"[[quant.override]]\nlayer = 1\nhead = -3\nk_bits = 4\n",
            "quant.override.head: got -3"},
           {"[[model]]\nname = 7\n", "model.name: got 7, expected a string"},
           {"[server]\nworkers = \"2\"\n", "server.workers: got \"2\", expected an integer"},
           {"[[model]]\nname = \"m\"\nk_bits = 99\n", "quant.k_bits: got 99"},
           {"[pool]\nverify_on_fetch = \"changed\"\n",
            "pool.verify_on_fetch: got \"changed\", expected one of unverified, all"},
           {"[pool]\nverify_on_fetch = true\n", "pool.verify_on_fetch: got true"},
       }) {
    INFO(toml);
    Config c;
    const Status s = ApplyToml(c, toml, "test.toml");
    CHECK(Has(s.message(), part));
  }
  // The same checks on the CLI path, with the text as given.
  Config c;
  Status s = ApplyOverride(c, "pool.bytes", "lots", ConfigSource::kCli);
  CHECK(Has(s.message(), "pool.bytes: got \"lots\", expected a byte size"));
  s = ApplyOverride(c, "server.workers", "0", ConfigSource::kCli);
  CHECK(Has(s.message(), "server.workers: got 0, expected an integer in 1..64"));
  s = ApplyOverride(c, "pool.unlink_stale", "yes", ConfigSource::kCli);
  CHECK(Has(s.message(), "pool.unlink_stale: got \"yes\", expected true or false"));
  s = ApplyOverride(c, "quant.override.layer", "1", ConfigSource::kCli);
  CHECK(Has(s.message(), "set it in the config file"));
  s = ApplyOverride(c, "pool.verify_on_fetch", "every", ConfigSource::kCli);
  CHECK(Has(s.message(), "pool.verify_on_fetch: got \"every\", expected one of unverified, all"));
  CHECK(c == Config());
  // Both values parse, from a file and from the command line.
  REQUIRE(ApplyOverride(c, "pool.verify_on_fetch", "all", ConfigSource::kCli).ok());
  CHECK(c.pool.verify_on_fetch == VerifyOnFetch::kAll);
  Config f;
  REQUIRE(ApplyToml(f, "[pool]\nverify_on_fetch = \"all\"\n", "test.toml").ok());
  CHECK(f.pool.verify_on_fetch == VerifyOnFetch::kAll);
  REQUIRE(ApplyToml(f, "[pool]\nverify_on_fetch = \"unverified\"\n", "test.toml").ok());
  CHECK(f.pool.verify_on_fetch == VerifyOnFetch::kUnverified);
}

TEST_CASE("Config: unknown keys and sections are errors", "[controller][config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[pool]\nbyts = 1\n", "test.toml:2:1: unknown key pool.byts (did you mean pool.bytes?)"},
      {"[pool]\nsize = 1\n", "unknown key pool.size, expected one of: pool.backend"},
      {"[serv]\nworkers = 1\n", "test.toml:1:2: unknown key serv (did you mean server?)"},
      {"bytes = 1\n", "unknown key bytes"},
      {"[quant]\nbits = 2\n", "unknown key quant.bits (did you mean quant.k_bits?)"},
      {"[[quant.override]]\nlayer = 1\nbits = 4\n", "unknown key quant.override.bits"},
      {"[[model]]\nname = \"m\"\nbyts = 1\n", "unknown key model.byts"},
      {"[[model]]\nname = \"m\"\n[[model.override]]\nlayer = 0\nkbits = 4\n",
       "unknown key model.override.kbits (did you mean"},
      {"[[model]]\nk_bits = 4\n", "model: missing required key name"},
      {"[[quant.override]]\nk_bits = 4\n", "quant.override: missing required key layer"},
      {"pool = 3\n", "pool: got 3, expected a table"},
      {"[quant]\noverride = 3\n", "quant.override: got 3, expected an array of tables"},
  };
  for (const auto& [toml, part] : cases) {
    INFO(toml);
    Config c;
    const Status s = ApplyToml(c, toml, "test.toml");
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(Has(s.message(), part));
  }
  Config c;
  const Status s = ApplyOverride(c, "pool.page_byte", "4KiB", ConfigSource::kCli);
  CHECK(Has(s.message(), "unknown key pool.page_byte (did you mean pool.page_bytes?)"));
}

TEST_CASE("Config: bad TOML reports file:line:col", "[controller][config]") {
  Config c;
  Status s = ApplyToml(c, "[pool]\nbytes = = 3\n", "bad.toml");
  CHECK(s.code() == StatusCode::kInvalidArgument);
  CHECK(s.message().rfind("bad.toml:2:", 0) == 0);
  CHECK(Has(s.message(), "TOML syntax error"));
  s = ApplyToml(c, "[server]\nworkers = 2\nworkers = 3\n", "dup.toml");
  CHECK(s.message().rfind("dup.toml:3:", 0) == 0);
  // A missing file is NOT_FOUND with the path.
  StatusOr<Config> loaded = LoadConfig({.file = "/nonexistent/kvctl.toml"});
  CHECK(loaded.status().code() == StatusCode::kNotFound);
  CHECK(Has(loaded.status().message(), "/nonexistent/kvctl.toml"));
  // A file that parses but fails validation names the file position of the value.
  const std::string path = WriteTemp("[server]\n\nworkers = 100\n");
  loaded = LoadConfig({.file = path});
  CHECK(Has(loaded.status().message(), path + ":3:11: server.workers: got 100"));
  std::remove(path.c_str());
}

TEST_CASE("Config: precedence is CLI > env > file > default", "[controller][config]") {
  const std::string path =
      WriteTemp("[pool]\nbytes = \"512MiB\"\n[server]\nworkers = 4\nlog_level = \"warn\"\n");
  StatusOr<Config> c = LoadConfig({
      .file = path,
      .cli = {{"pool.bytes", "2GiB"}, {"quant.k_bits", "4"}},
      .env = MapEnv({{"KVCTL_POOL_BYTES", "1GiB"},
                     {"KVCTL_SERVER_LOG_LEVEL", "debug"},
                     {"KVCTL_QUANT_K_BITS", "8"},
                     {"KVCTL_SERVER_LEASE_MS", ""}}),  // Empty: unset.
  });
  std::remove(path.c_str());
  REQUIRE(c.ok());
  CHECK(c->pool.bytes == 2ull << 30);              // cli over env over file.
  CHECK(c->quant.k_bits == 4);                     // cli over env.
  CHECK(c->server.log_level == LogLevel::kDebug);  // env over file.
  CHECK(c->server.workers == 4);                   // file over default.
  CHECK(c->server.lease_ms == 10000);              // default.
  CHECK(c->sources.at("pool.bytes") == ConfigSource::kCli);
  CHECK(c->sources.at("server.log_level") == ConfigSource::kEnv);
  CHECK(c->sources.at("server.workers") == ConfigSource::kFile);
  CHECK(c->sources.count("server.lease_ms") == 0);

  // Precedence holds whatever order the layers are applied in.
  Config d;
  REQUIRE(ApplyOverride(d, "server.workers", "8", ConfigSource::kCli).ok());
  REQUIRE(ApplyOverride(d, "server.workers", "3", ConfigSource::kEnv).ok());
  REQUIRE(ApplyToml(d, "[server]\nworkers = 5\n", "late.toml").ok());
  CHECK(d.server.workers == 8);
  REQUIRE(ApplyOverride(d, "server.workers", "9", ConfigSource::kCli).ok());
  CHECK(d.server.workers == 9);  // A later value of the same source wins.

  const std::string printed = PrintConfig(*c);
  CHECK(Has(printed, "bytes = \"2GiB\""));
  std::istringstream lines(printed);
  std::map<std::string, std::string> source_of;  // "pool.bytes" -> "cli"
  std::string line, section;
  while (std::getline(lines, line)) {
    if (line.rfind("[", 0) == 0) section = line.substr(1, line.find(']') - 1);
    const size_t eq = line.find(" = "), hash = line.rfind("# ");
    if (eq == std::string::npos || hash == std::string::npos) continue;
    source_of[section + "." + line.substr(0, eq)] = line.substr(hash + 2);
  }
  CHECK(source_of["pool.bytes"] == "cli");
  CHECK(source_of["server.log_level"] == "env");
  CHECK(source_of["server.workers"] == "file");
  CHECK(source_of["server.lease_ms"] == "default");
  // Every [server]/[pool]/[quant] key is printed with a source.
  for (const ConfigOption& o : ConfigSchema()) {
    if (Overridable(o)) CHECK(source_of.count(o.key) == 1);
  }
}

TEST_CASE("Config: the real environment is read through SystemEnv", "[controller][config]") {
  setenv("KVCTL_POOL_PAGE_BYTES", "128KiB", 1);
  StatusOr<Config> c = LoadConfig({.env = SystemEnv});
  REQUIRE(c.ok());
  CHECK(c->pool.page_bytes == 128u << 10);
  setenv("KVCTL_POOL_PAGE_BYTES", "3000", 1);
  c = LoadConfig({.env = SystemEnv});
  CHECK(Has(c.status().message(), "KVCTL_POOL_PAGE_BYTES: pool.page_bytes: got 3000B"));
  // A bad value is an error even where a higher source would win.
  c = LoadConfig({.cli = {{"pool.page_bytes", "8KiB"}}, .env = SystemEnv});
  CHECK(!c.ok());
  unsetenv("KVCTL_POOL_PAGE_BYTES");
  c = LoadConfig({.env = SystemEnv});
  REQUIRE(c.ok());
  CHECK(c->pool.page_bytes == 64u << 10);
}

TEST_CASE("Config: reload refuses changes to immutable keys", "[controller][config]") {
  const Config old;
  Config neu;
  REQUIRE(ApplyToml(neu,
                    "[server]\nlease_ms = 500\nlog_level = \"debug\"\n"
                    "[quant]\nk_bits = 4\n[[quant.override]]\nlayer = 0\nk_bits = 8\n",
                    "r.toml")
              .ok());
  CHECK(CheckReload(old, neu).ok());  // Budgets, quantizer and log level may change.

  REQUIRE(ApplyOverride(neu, "pool.bytes", "512MiB", ConfigSource::kFile).ok());
  Status s = CheckReload(old, neu);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK(Has(s.message(), "pool.bytes: cannot change on reload (\"256MiB\" -> \"512MiB\")"));
  CHECK(Has(s.message(), "restart"));
  CHECK(!Has(s.message(), "lease_ms"));

  REQUIRE(ApplyOverride(neu, "pool.shm_name", "/other", ConfigSource::kFile).ok());
  REQUIRE(ApplyOverride(neu, "server.endpoint", "tcp://127.0.0.1:5555", ConfigSource::kFile).ok());
  s = CheckReload(old, neu);
  CHECK(Has(s.message(), "pool.bytes"));
  CHECK(Has(s.message(), "pool.shm_name"));
  CHECK(Has(s.message(), "server.endpoint"));
}

TEST_CASE("Config: DiffConfig names each changed key with its old and new value",
          "[controller][config]") {
  const Config old;
  CHECK(DiffConfig(old, old).empty());
  const Config neu = Parsed(R"(
[server]
log_level = "debug"
[pool]
bytes = "512MiB"
[limits]
max_sessions = 8
[quant]
method = "kivi"
k_bits = 4
[[quant.override]]
layer = 0
k_bits = 8
[[model]]
name = "m"
v_bits = 4
)");
  const std::vector<ConfigChange> want = {
      {"server.log_level", "\"info\"", "\"debug\"", false, "applies now"},
      {"pool.bytes", "\"256MiB\"", "\"512MiB\"", true, ""},
      {"limits.max_sessions", "1024", "8", false, "applies to requests from now"},
      {"quant.method", "\"kvarn\"", "\"kivi\"", false, "applies to sequences opened from now"},
      {"quant.k_bits", "2", "4", false, "applies to sequences opened from now"},
      {"quant.override", "[]", "[{layer = 0, head = -1, k_bits = 8, v_bits = 0}]", false,
       "applies to sequences opened from now"},
      {"model \"m\"", "none", "{name = \"m\", v_bits = 4}", false,
       "applies to sequences opened from now"},
  };
  const std::vector<ConfigChange> got = DiffConfig(old, neu);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(got[i].key << " " << got[i].old_value << " -> " << got[i].new_value);
    CHECK(got[i] == want[i]);
  }
  // A removed model, and the source alone is no change.
  Config moved = old;
  moved.sources["quant.k_bits"] = ConfigSource::kCli;
  CHECK(DiffConfig(old, moved).empty());
  const std::vector<ConfigChange> removed = DiffConfig(neu, old);
  CHECK(removed.back() == ConfigChange{"model \"m\"", "{name = \"m\", v_bits = 4}", "none", false,
                                       "applies to sequences opened from now"});
}

TEST_CASE("Config: every reloadable key says when it applies, restart keys say nothing",
          "[controller][config]") {
  for (const ConfigOption& o : ConfigSchema()) {
    INFO(o.key);
    if (o.flags & kImmutable) CHECK(ReloadTiming(o.key).empty());
    if (o.flags & kReloadable) CHECK(ReloadTiming(o.key).starts_with("applies "));
  }
  CHECK(ReloadTiming("server.stats_interval_ms") == "applies from the next publish");
}

TEST_CASE("Config: a bad width before any model is known names only key, value and expected set",
          "[controller][config]") {
  // Both the --k-bits flag and --set reach ApplyOverride as a command-line key.
  StatusOr<Config> c = LoadConfig({.cli = {{"quant.k_bits", "5"}}});
  REQUIRE(!c.ok());
  CHECK(c.status().code() == StatusCode::kInvalidArgument);
  CHECK(c.status().message() == "quant.k_bits: got 5, expected one of {2, 3, 4, 8} for kvarn");
  c = LoadConfig({.cli = {{"quant.method", "oscar"}, {"quant.v_group_channels", "96"}}});
  REQUIRE(!c.ok());
  CHECK(c.status().message() ==
        "quant.v_group_channels: got 96, expected a power of two in 8..256 for oscar (it divides "
        "head_dim, which the Hadamard rotation needs to be a power of two <= 256)");
  // Keys of every section have command-line and environment forms (configs/README.md).
  c = LoadConfig({.cli = {{"evict.window", "16"}, {"budget.pressure", "requantize"}},
                  .env = [](const std::string& name) -> std::optional<std::string> {
                    if (name == "KVCTL_LIMITS_MAX_SESSIONS") return "7";
                    return std::nullopt;
                  }});
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->evict.window == 16);
  CHECK(c->budget.pressure == PressurePolicy::kRequantize);
  CHECK(c->limits.max_sessions == 7);
  CHECK(c->sources.at("limits.max_sessions") == ConfigSource::kEnv);
}

TEST_CASE("Config: quant.method turbo loads, resolves and refuses widths it lacks",
          "[controller][config]") {
  StatusOr<Config> c = LoadConfig({.cli = {{"quant.method", "turbo"}, {"quant.k_bits", "3"}}});
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  CHECK(c->quant.method == QuantMethod::kTurbo);
  c = LoadConfig({.cli = {{"quant.method", "turbo"}, {"quant.k_bits", "8"}}});
  REQUIRE(!c.ok());
  CHECK(c.status().code() == StatusCode::kInvalidArgument);
  CHECK(c.status().message() == "quant.k_bits: got 8, expected one of {2, 3, 4} for turbo");
  c = LoadConfig({.cli = {{"quant.method", "turbo2"}}});
  REQUIRE(!c.ok());
  CHECK(c.status().message().find("turbo2") != std::string::npos);
  CHECK(c.status().message().find("oscar, turbo") != std::string::npos);
}

TEST_CASE("Config: sinks and flush default per method, and explicit keys win",
          "[controller][config]") {
  // Issue #18's measured defaults (docs/quality.md "Sinks and flush per method"): with neither
  // key set, each method gets its own sink count and flush, at the head_dim of the session.
  const std::pair<const char*, StreamingRules> kDefaults[] = {
      {"kivi", {16, 128}},  {"quarot", {0, 128}}, {"kvarn", {32, 128}},
      {"oscar", {32, 128}}, {"turbo", {0, 128}},  {"fp16", {0, 32}}};
  for (const auto& [method, rules] : kDefaults) {
    INFO(method);
    StatusOr<Config> c = LoadConfig({.cli = {{"quant.method", method}}});
    REQUIRE(c.ok());
    CHECK(c->quant.sink_tokens == -1);
    CHECK(c->quant.flush_tokens == 0);
    StatusOr<StreamingRules> r = ResolveStreamingRules(*c, "m", 64);
    REQUIRE(r.ok());
    CHECK(*r == rules);
    CHECK(TraitsOf(*ParseQuantMethod(method)).streaming == rules);
    // An explicit key wins over the method's default, each on its own.
    c = LoadConfig({.cli = {{"quant.method", method}, {"quant.sink_tokens", "0"}}});
    REQUIRE(c.ok());
    CHECK(*ResolveStreamingRules(*c, "m", 64) == StreamingRules{0, rules.flush_tokens});
    c = LoadConfig({.cli = {{"quant.method", method}, {"quant.flush_tokens", "256"}}});
    REQUIRE(c.ok());
    CHECK(*ResolveStreamingRules(*c, "m", 64) == StreamingRules{rules.sink_tokens, 256});
  }
  // A [[model]] that switches method gets that method's defaults; [quant]'s explicit sinks stay.
  Config c;
  REQUIRE(
      Load("[quant]\nmethod = \"kivi\"\n[[model]]\nname = \"K\"\nmethod = \"kvarn\"\n", &c).ok());
  CHECK(*ResolveStreamingRules(c, "K", 64) == StreamingRules{32, 128});
  CHECK(*ResolveStreamingRules(c, "other", 64) == StreamingRules{16, 128});
  REQUIRE(Load("[quant]\nmethod = \"kivi\"\nsink_tokens = 4\n[[model]]\nname = \"K\"\n"
               "method = \"kvarn\"\n",
               &c)
              .ok());
  CHECK(*ResolveStreamingRules(c, "K", 64) == StreamingRules{4, 128});
  // An explicit flush that is no multiple of the method's block is refused at load, naming both.
  const Status bad = Load("[quant]\nmethod = \"kvarn\"\nflush_tokens = 96\n");
  CHECK(bad.code() == StatusCode::kInvalidArgument);
  CHECK(Has(bad.message(), "quant.flush_tokens: got 96"));
  CHECK(Has(bad.message(), "128"));
}

TEST_CASE("Config: joint mode flushes every block unless quant.flush_tokens says otherwise",
          "[controller][config]") {
  // The joint plan charges each head flush_tokens - 1 fp16 tail rows (docs/joint_planner.md), so
  // an unset flush is the method's block there; sinks keep the method's default.
  const std::pair<const char*, StreamingRules> kJointDefaults[] = {
      {"kivi", {16, 32}}, {"kvarn", {32, 128}}, {"turbo", {0, 32}}, {"quarot", {0, 32}}};
  for (const auto& [method, rules] : kJointDefaults) {
    INFO(method);
    StatusOr<Config> c = LoadConfig({.cli = {{"quant.method", method}}});
    REQUIRE(c.ok());
    // The profile a joint config names is read at load; the rules depend on the mode only.
    c->budget.mode = BudgetMode::kJoint;
    StatusOr<StreamingRules> r = ResolveStreamingRules(*c, "m", 64);
    REQUIRE(r.ok());
    CHECK(*r == rules);
    c->budget.mode = BudgetMode::kEvictOnly;  // Other modes keep the method's flush.
    CHECK(ResolveStreamingRules(*c, "m", 64)->flush_tokens ==
          TraitsOf(*ParseQuantMethod(method)).streaming.flush_tokens);
  }
  // An explicit flush wins, and a larger block moves the joint default with it.
  StatusOr<Config> c =
      LoadConfig({.cli = {{"quant.method", "kivi"}, {"quant.flush_tokens", "64"}}});
  REQUIRE(c.ok());
  c->budget.mode = BudgetMode::kJoint;
  CHECK(*ResolveStreamingRules(*c, "m", 64) == StreamingRules{16, 64});
  c = LoadConfig({.cli = {{"quant.method", "turbo"}, {"quant.block_tokens", "8"}}});
  REQUIRE(c.ok());
  c->budget.mode = BudgetMode::kJoint;
  CHECK(*ResolveStreamingRules(*c, "m", 64) == StreamingRules{0, 8});
}

TEST_CASE("Config: PrintConfig output loads back to the same config", "[controller][config]") {
  Config c = Parsed(R"(
[server]
endpoint = "tcp://127.0.0.1:7000"
[pool]
bytes = 1073741824
budget_fraction = 1
shm_name = "/with \"quote\""
[quant]
method = "oscar"
k_group_tokens = 16
[[quant.override]]
layer = 2
head = 1
v_bits = 4
[[model]]
name = "org/A"
method = "kivi"
sink_tokens = 4
[[model.override]]
layer = 0
k_bits = 8
[[model]]
name = "B"
override = []
)");
  REQUIRE(ApplyOverride(c, "server.workers", "7", ConfigSource::kCli).ok());
  const std::string printed = PrintConfig(c);
  INFO(printed);
  Config back;
  const Status s = ApplyToml(back, printed, "printed.toml");
  INFO(s.ToString());
  REQUIRE(s.ok());
  CHECK(back == c);
  CHECK(back.models.at(1).overrides.has_value());
  CHECK(back.models.at(1).overrides->empty());
  CHECK(back.models.at(0).quant_keys == std::vector<std::string>{"method", "sink_tokens"});
}

TEST_CASE("Config: cross-key validation", "[controller][config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[pool]\nbytes = \"1MiB\"\npage_bytes = \"2MiB\"\n",
       "pool.page_bytes: got 2MiB, expected at most pool.bytes (1MiB)"},
      {"[pool]\nbytes = \"64MiB\"\nstaging_slots = 8\n",
       "pool.staging_slots: 8 slots of 8MiB take 64MiB, expected at most half of pool.bytes "
       "64MiB (32MiB)"},
      {"[quant]\nmethod = \"kivi\"\nk_bits = 5\n",
       "quant.k_bits: got 5, expected one of {2, 3, "
       "4, 8} for kivi"},
      {"[quant]\nblock_tokens = 100\n", "quant.block_tokens: got 100"},
      {"[quant]\nflush_tokens = 100\n",
       "quant.flush_tokens: got 100, expected a multiple of "
       "block_tokens 128"},
      {"[quant]\nmethod = \"kivi\"\nblock_tokens = 32\nk_group_tokens = 64\n",
       "k_group_tokens: got 64"},
      {"[quant]\nmethod = \"oscar\"\nv_group_channels = 24\n",
       "quant.v_group_channels: got 24, expected a power of two in 8..256 for oscar"},
      {"[quant]\nmethod = \"kivi\"\nv_group_channels = 12\n",
       "quant.v_group_channels: got 12, expected a multiple of 8 (it divides head_dim)"},
      {"[[quant.override]]\nlayer = 1\n", "quant override #1 (layer 1, head -1): sets neither"},
      {"[[quant.override]]\nlayer = 1\nk_bits = 4\n[[quant.override]]\nlayer = 1\nv_bits = 4\n",
       "quant override #2 (layer 1, head -1): duplicate"},
      {"[[quant.override]]\nlayer = 1\nk_bits = 5\n",
       "quant override #1 (layer 1, head -1): "
       "k_bits: got 5"},
      {"[[model]]\nname = \"a\"\n[[model]]\nname = \"a\"\n", "model.name: got \"a\" twice"},
      {"[[model]]\nname = \"\"\n", "model.name: got \"\""},
      {"[[model]]\nname = \"m\"\nmethod = \"quarot\"\nv_bits = 16\n",
       "model \"m\": v_bits: got 16"},
      {"[[model]]\nname = \"m\"\n[[model.override]]\nlayer = 3\nhead = 0\nk_bits = 7\n",
       "model \"m\" override #1 (layer 3, head 0): k_bits: got 7"},
  };
  for (const auto& [toml, part] : cases) {
    INFO(toml);
    const Status s = Load(toml);
    CHECK(s.code() == StatusCode::kInvalidArgument);
    CHECK(Has(s.message(), part));
    CHECK(!Has(s.message(), "checked at load"));  // No head_dim the user never gave.
  }
  CHECK(Load("[pool]\nbytes = \"64MiB\"\nstaging_slots = 4\n").ok());  // 32MiB: exactly half.
  CHECK(Load("[pool]\nstaging_bytes_per_session = 0\nstaging_slots = 4096\n").ok());
  CHECK(Load("[quant]\nmethod = \"fp16\"\n").ok());  // fp16 takes 16 bits whatever k_bits says.
}

TEST_CASE("Config: overrides and models resolve per (layer, head)", "[controller][config]") {
  Config c;
  const Status loaded = Load(R"(
[quant]
method = "kvarn"
[[quant.override]]
layer = 1
k_bits = 4
[[quant.override]]
layer = 1
head = 2
k_bits = 8
v_bits = 4
[[model]]
name = "org/M"
method = "kivi"
k_bits = 4
[[model.override]]
layer = 0
v_bits = 8
[[model]]
name = "N"
override = []
[[model]]
name = "F"
method = "fp16"
[[model]]
name = "S"
block_tokens = 256
sink_tokens = 4
)",
                             &c);
  INFO(loaded.ToString());
  REQUIRE(loaded.ok());
  const auto spec = [&](std::string_view model, int layer, int head, int head_dim = 128) {
    StatusOr<QuantSpec> s = ResolveQuantSpec(c, model, head_dim, layer, head);
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    return *s;
  };
  const auto bits = [](const QuantSpec& s) { return std::pair{s.k_bits, s.v_bits}; };

  // No model entry: [quant] and the global overrides; the registry supplies the rest.
  CHECK(spec("other", 0, 0) == *MakeQuantSpec(QuantMethod::kKvarn, 128, 2, 2));
  CHECK(bits(spec("other", 1, 0)) == std::pair{4, 2});  // (1, -1).
  CHECK(bits(spec("other", 1, 2)) == std::pair{8, 4});  // Exact head beats -1.
  CHECK(bits(spec("other", 2, 2)) == std::pair{2, 2});
  CHECK(spec("other", 0, 0, 64).head_dim == 64);

  // Model "org/M", also reached by its short name; its override list replaces the global one.
  CHECK(FindModel(c, "org/M") == FindModel(c, "M"));
  CHECK(FindModel(c, "x/M") == FindModel(c, "M"));
  CHECK(FindModel(c, "nobody") == nullptr);
  const QuantSpec m00 = spec("M", 0, 1);
  CHECK(m00.method == QuantMethod::kKivi);
  CHECK(bits(m00) == std::pair{4, 8});
  CHECK(bits(spec("org/M", 1, 2)) == std::pair{4, 2});  // Global overrides do not apply.
  CHECK(m00.block_tokens == 32);                        // kivi registry default.

  // "override = []" drops the global list; everything else is [quant].
  CHECK(bits(spec("N", 1, 2)) == std::pair{2, 2});
  // fp16 ignores [quant] bit widths.
  CHECK(bits(spec("F", 3, 0)) == std::pair{16, 16});

  // Streaming rules: the method's registry defaults unless set (docs/quality.md "Sinks and flush
  // per method"); the default flush rounds up to whole blocks.
  StatusOr<StreamingRules> r = ResolveStreamingRules(c, "other", 128);
  REQUIRE(r.ok());
  CHECK(*r == StreamingRules{32, 128});
  r = ResolveStreamingRules(c, "S", 128);
  REQUIRE(r.ok());
  CHECK(*r == StreamingRules{4, 256});
  CHECK(spec("S", 0, 0).block_tokens == 256);
  r = ResolveStreamingRules(c, "M", 128);  // The model's method picks its own default sinks.
  REQUIRE(r.ok());
  CHECK(*r == StreamingRules{16, 128});

  // head_dim is checked when it is known, and the error says for whom.
  StatusOr<QuantSpec> bad = ResolveQuantSpec(c, "other", 96, 1, 2);
  CHECK(bad.status().code() == StatusCode::kInvalidArgument);
  CHECK(Has(bad.status().message(), "model \"other\" layer 1 head 2: head_dim: got 96"));
  CHECK(!ResolveStreamingRules(c, "other", 96).ok());
  CHECK(!ResolveQuantSpec(c, "other", 128, -1, 0).ok());
  // Every resolved spec has a layout (what the allocator sizes records with).
  CHECK(BlockLayoutOf(spec("M", 0, 1)).record_bytes > 0);
}

TEST_CASE("Config: default.toml sets every key, to the built-in default but its quantizer",
          "[controller][config]") {
  StatusOr<Config> c = LoadConfig({.file = kSource + "/configs/default.toml"});
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  // The shipped file quantizes a demo-sized sequence from its first token (KIVI 4-bit, no sinks,
  // 32-token flushes: README "Two commands"); the built-in defaults keep the registry's KVarN
  // 2-bit with its 32 sinks. Nothing else may differ.
  Config expected;
  expected.quant.method = QuantMethod::kKivi;
  expected.quant.k_bits = 4;
  expected.quant.v_bits = 4;
  expected.quant.block_tokens = 32;
  expected.quant.sink_tokens = 0;
  expected.quant.flush_tokens = 32;
  CHECK(*c == expected);
  CHECK(Config().quant.method == QuantMethod::kKvarn);
  for (const ConfigOption& o : ConfigSchema()) {
    if (!Overridable(o)) continue;
    INFO(o.key);
    REQUIRE(c->sources.count(o.key) == 1);  // Present in the file.
    CHECK(c->sources.at(o.key) == ConfigSource::kFile);
  }
  CHECK(c->quant_overrides.empty());
  CHECK(c->models.empty());
}

std::vector<std::string> Cells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (size_t i = 1; i < row.size(); ++i) {
    if (row[i] == '|') {
      while (!cell.empty() && cell.back() == ' ') cell.pop_back();
      while (!cell.empty() && cell.front() == ' ') cell.erase(0, 1);
      cells.push_back(cell);
      cell.clear();
    } else {
      cell += row[i];
    }
  }
  return cells;
}

TEST_CASE("Config: configs/README.md documents exactly the schema keys", "[controller][config]") {
  std::ifstream in(kSource + "/configs/README.md");
  REQUIRE(in);
  // Rows of the key tables: | `key` | type | default | range | on SIGHUP | env | meaning |
  std::map<std::string, std::vector<std::string>> documented;
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells = Cells(line);
    if (cells.size() != 7 || cells[0].find('.') == std::string::npos) continue;
    const std::string key = cells[0].substr(1, cells[0].size() - 2);
    CHECK(documented.count(key) == 0);
    documented[key] = cells;
  }
  std::set<std::string> schema_keys;
  const char* kTypes[] = {"int", "bytes", "double", "bool", "string", "enum"};
  for (const ConfigOption& o : ConfigSchema()) {
    INFO(o.key);
    schema_keys.insert(o.key);
    REQUIRE(documented.count(o.key) == 1);
    const std::vector<std::string>& cells = documented[o.key];
    CHECK(cells[1] == kTypes[static_cast<int>(o.type)]);
    CHECK(cells[2] == (o.flags & kRequired ? "required" : "`" + o.default_text + "`"));
    CHECK(cells[4] == (o.flags & kImmutable ? "restart" : "reload"));
    CHECK(cells[5] == (o.env.empty() ? "—" : "`" + o.env + "`"));
    CHECK(!cells[6].empty());
  }
  for (const auto& [key, cells] : documented) {
    INFO(key);
    CHECK(schema_keys.count(key) == 1);
  }
}

TEST_CASE("Config: the SmolLM2-135M preset resolves every layer and head", "[controller][config]") {
  StatusOr<Config> c = LoadConfig({.file = kSource + "/configs/smollm2-135m.toml"});
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  for (int layer = 0; layer < 30; ++layer) {
    for (int head = 0; head < 3; ++head) {
      StatusOr<QuantSpec> s = ResolveQuantSpec(*c, "HuggingFaceTB/SmolLM2-135M", 64, layer, head);
      INFO(layer << "," << head << ": " << s.status().ToString());
      REQUIRE(s.ok());
      CHECK(s->method == QuantMethod::kKvarn);
      CHECK(s->block_tokens == 64);
      const bool boundary = layer == 0 || layer == 29;
      CHECK(s->k_bits == (boundary ? 8 : 4));
      CHECK(s->v_bits == (boundary ? 4 : 2));
    }
  }
  StatusOr<StreamingRules> r = ResolveStreamingRules(*c, "SmolLM2-135M", 64);
  REQUIRE(r.ok());
  CHECK(*r == StreamingRules{128, 128});
  // The sizing comment in the preset: 3840-byte records for k4v2, 64 tokens, head_dim 64.
  CHECK(BlockLayoutOf(*ResolveQuantSpec(*c, "SmolLM2-135M", 64, 5, 0)).record_bytes == 3840);
}

TEST_CASE("Config: byte sizes", "[controller][config]") {
  CHECK(*ParseByteSize("4096") == 4096);
  CHECK(*ParseByteSize("64KiB") == 65536);
  CHECK(*ParseByteSize("512MiB") == 512ull << 20);
  CHECK(*ParseByteSize("1GiB") == 1ull << 30);
  CHECK(*ParseByteSize(" 2 tib ") == 2ull << 40);
  CHECK(*ParseByteSize("7B") == 7);
  for (const char* bad : {"", "1.5GiB", "10MB", "1k", "GiB", "-1", "99999999999TiB", "1 GiB x"}) {
    INFO(bad);
    CHECK(!ParseByteSize(bad).ok());
  }
  CHECK(FormatByteSize(256ull << 20) == "256MiB");
  CHECK(FormatByteSize(1536) == "1536B");
  CHECK(FormatByteSize(3ull << 40) == "3TiB");
  CHECK(FormatByteSize(0) == "0B");
}

}  // namespace
}  // namespace kvctl
