// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/config/config.h
// The daemon's configuration: a plain Config value and ONE declarative schema table,
// ConfigSchema(), with one row per key (TOML path, type, default, range, flags, env mirror, doc),
// in the style of Valkey's static_configs[]. The table drives TOML parsing, validation (unknown
// keys are errors; errors name the key, the value and what was expected), env and CLI overrides,
// PrintConfig() and the SIGHUP reload check. configs/README.md documents the same rows (a test
// keeps them equal). Precedence: CLI > env > file > built-in default.
//
// Thread safety: ConfigSchema() is immutable after its first (thread-safe) construction. Config is
// a value: copy it to share it between threads.
//
//   KVCTL_ASSIGN_OR_RETURN(Config cfg, LoadConfig({.file = path, .cli = {{"pool.bytes", "1GiB"}},
//                                                   .env = SystemEnv}));
//   KVCTL_ASSIGN_OR_RETURN(QuantSpec spec, ResolveQuantSpec(cfg, model, head_dim, layer, head));
#ifndef KVCTL_CONTROLLER_CONFIG_CONFIG_H_
#define KVCTL_CONTROLLER_CONFIG_CONFIG_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "common/status.h"
#include "kernels/quant_types.h"

namespace kvctl {

enum class LogLevel : uint8_t { kTrace, kDebug, kInfo, kWarn, kError, kOff };
enum class PoolBackend : uint8_t { kCpu, kCuda };
// pool.verify_on_fetch: which chunks a FETCH verifies (docs/reliability.md "Page checksums").
enum class VerifyOnFetch : uint8_t { kUnverified, kAll };
// Ordered by precedence: a value set by a higher source is never replaced by a lower one.
enum class ConfigSource : uint8_t { kDefault, kFile, kEnv, kCli };
std::string_view ConfigSourceName(ConfigSource source);  // "default", "file", "env", "cli".

struct ServerConfig {
  std::string endpoint;
  LogLevel log_level{};
  int lease_ms = 0;
  int workers = 0;
  int inline_append_tokens = 0;      // Light APPENDs of up to this many tokens skip the workers.
  bool inline_blocks_fetch = false;  // Cheap blocks FETCHes skip the workers.
  int inline_dense_fetch_rows = 0;   // Dense FETCHes of at most this many rows skip the workers.
  int dense_fetch_split_rows = 0;    // Larger dense FETCHes decode on two threads; 0 = never.
  int prepare_split_tokens = 0;      // Larger APPENDs prepare layers on two threads; 0 = never.
  uint64_t max_message_bytes = 0;
  int stats_interval_ms = 0;
  std::string stats_endpoint;  // ZeroMQ PUB of the stats text; "" = off.
  std::string http_address;    // HOST:PORT of /metrics and /healthz (loopback); "" = off.
  int quality_sample_period = 0;
  bool operator==(const ServerConfig&) const = default;
};

struct PoolConfig {
  PoolBackend backend{};
  int cuda_device = 0;
  uint64_t bytes = 0;
  uint64_t page_bytes = 0;
  std::string shm_name;
  uint64_t staging_bytes_per_session = 0;
  int staging_slots = 0;
  bool unlink_stale = true;
  double budget_fraction = 0;
  // Page checksums (docs/reliability.md "Page checksums").
  bool checksums = true;
  VerifyOnFetch verify_on_fetch{};
  int scrub_interval_ms = 0;            // 0 = no scrubber.
  uint64_t scrub_bytes_per_second = 0;  // 0 = no scrubber.
  bool operator==(const PoolConfig&) const = default;
};

// [limits]: what one client can make the daemon allocate outside the pool (docs/reliability.md).
struct LimitsConfig {
  uint64_t host_memory_bytes = 0;  // Host memory for sessions and sequences; 0 = pool.bytes / 4.
  int max_sessions = 0;
  int max_sequences_per_session = 0;
  int stats_max_lines = 0;  // Per-sequence and per-head lines in one STATS answer.
  bool operator==(const LimitsConfig&) const = default;
};

// The [quant] keys. 0 (or -1 for sink_tokens) means "the method's registry default".
struct QuantSettings {
  QuantMethod method{};
  int k_bits = 0;
  int v_bits = 0;
  int block_tokens = 0;
  int k_group_tokens = 0;
  int v_group_channels = 0;
  int sinkhorn_iters = 0;
  bool lossless = false;  // Compression off: rows kept exactly in the session dtype.
  int sink_tokens = 0;
  int flush_tokens = 0;
  int flush_spread_steps = 1;      // SequenceGeometry::flush_spread_steps.
  bool flush_after_reply = false;  // SequenceGeometry::flush_after_reply.
  bool operator==(const QuantSettings&) const = default;
};

// [budget]: how much of each sequence the daemon keeps (docs/budgets.md).
enum class BudgetMode : uint8_t { kNone, kQuantOnly, kEvictOnly, kJoint };
enum class LayerProfile : uint8_t { kUniform, kPyramid, kDemand };
// What an APPEND does when the pool has no pages left for it.
enum class PressurePolicy : uint8_t { kFail, kRequantize };
// Whose records a relief may lower: the appending sequence's only, or any open sequence's.
enum class PressureScope : uint8_t { kSequence, kPool };
// How head re-allocation splits a layer's budget: proportional to each head's marginal utility,
// or greedily by retained attention mass (policies/reasonalloc.h GreedyHeadBudgets).
enum class ReallocSplit : uint8_t { kProportional, kGreedy };
struct BudgetConfig {
  BudgetMode mode{};
  int tokens_per_head = 0;    // Average kept tokens per (layer, KV head); 0 = use token_fraction.
  double token_fraction = 0;  // Kept tokens per head as a fraction of the tokens appended.
  uint64_t bytes = 0;         // Per-sequence byte budget (joint).
  int plan_tokens = 0;        // joint: tokens per head the plan is made for.
  double fp16_fraction = 0;   // quant-only: average bits = 16 * fp16_fraction.
  double eviction_scale = 1;  // joint: distortion of a dropped token vs one at "0 bits".
  double avg_bits = 0;        // quant-only: average bits per element, metadata included.
  LayerProfile layer_profile{};
  std::string profile;  // kvcalib profile: [ratequant] for quant-only, [reasonalloc] for demand.
  double demand_power = 1;  // layer_profile = demand: layer budgets follow demand^demand_power.
  int realloc_period = 0;   // Appended tokens between head re-allocations; 0 = off.
  int floor = 0;            // Per-head starvation floor; 0 = StarvationFloor(window, avg).
  double realloc_ema = 0;
  ReallocSplit realloc_split{};
  PressurePolicy pressure{};
  int pressure_min_bits = 0;  // requantize: no width goes below this.
  PressureScope pressure_scope{};
  bool operator==(const BudgetConfig&) const = default;
};

// [evict]: the token scorer of evict-only / joint budgets. 0 = the policy's default.
enum class EvictPolicy : uint8_t { kStreaming, kH2O, kSnapKV, kRKV };
enum class EvictPooling : uint8_t { kDefault, kMax, kAvg };
enum class EvictGroup : uint8_t { kDefault, kMax, kMean };
enum class EvictSoftmax : uint8_t { kDefault, kCandidates, kCausal };
struct EvictConfig {
  EvictPolicy policy{};
  int sinks = 0;
  int window = 0;
  int obs_window = 0;
  int kernel = 0;
  EvictPooling pooling{};
  EvictGroup group{};
  EvictSoftmax softmax{};
  double lambda = 0;
  int compression_period = 0;
  bool stagger_layers = true;   // EvictionSettings::stagger_layers.
  bool whole_records = true;    // EvictionSettings::whole_records.
  int max_deferred_tokens = 0;  // APPEND_CONTINUES: tokens stored un-evicted before the cap.
  std::string full_heads;       // "layer:head,...": never evicted (ParseFullHeads).
  bool operator==(const EvictConfig&) const = default;
};

// One [[quant.override]] / [[model.override]] entry. k_bits / v_bits 0 = keep the inherited width.
struct QuantOverride {
  int layer = 0;
  int head = -1;  // -1: every KV head of `layer`.
  int k_bits = 0;
  int v_bits = 0;
  bool operator==(const QuantOverride&) const = default;
};

// One [[model]] table. Only the [quant] keys named in `quant_keys` (short names, e.g. "k_bits")
// override [quant]; the other fields of `quant` are unused. `overrides`, when present (even empty),
// replaces the global [[quant.override]] list for this model.
struct ModelConfig {
  std::string name;
  QuantSettings quant;
  std::vector<std::string> quant_keys;
  std::optional<std::vector<QuantOverride>> overrides;
  bool operator==(const ModelConfig&) const = default;
};

// [tier]: the cluster tier (docs/tier.md). Every key is fixed for the daemon's life.
struct TierConfig {
  std::string nodes;         // Seed nodes "host:port,host:port"; "" = no tier.
  std::string key_prefix;    // Every key the daemon writes starts with this and ':'.
  int ttl_seconds = 0;       // Expiry of every key written; 0 = never.
  uint64_t quota_bytes = 0;  // Most bytes of spilled sequences this daemon keeps in the tier.
  uint64_t prefix_quota_bytes = 0;    // Most bytes of unexpired prefixes this daemon saved.
  int spill_idle_ms = 0;              // Spill sequences idle this long; 0 = never.
  int spill_on_pressure_idle_ms = 0;  // A full pool spills sequences idle this long; 0 = never.
  int prefix_block_tokens = 0;        // Granule of the prefix hash chain.
  int timeout_ms = 0;                 // Per command.
  int connect_timeout_ms = 0;         // Per connection attempt.
  uint64_t chunk_bytes = 0;           // Values are stored as chunks of at most this many bytes.
  double local_prefix_fraction = 0;   // Of pool.bytes, for the local prefix cache; 0 = none.
  bool operator==(const TierConfig&) const = default;
};

struct Config {
  Config();  // The built-in defaults: every row of ConfigSchema() at its default.

  ServerConfig server;
  PoolConfig pool;
  QuantSettings quant;
  BudgetConfig budget;
  EvictConfig evict;
  LimitsConfig limits;
  TierConfig tier;
  std::vector<QuantOverride> quant_overrides;
  std::vector<ModelConfig> models;
  // Where each [server]/[pool]/[quant]/[budget]/[evict]/[limits] value came from, by key
  // ("pool.bytes"); absent = kDefault.
  std::map<std::string, ConfigSource, std::less<>> sources;

  // Compares values only: two configs that say the same thing are equal wherever it came from.
  bool operator==(const Config& other) const;
};

// ---- The schema table -------------------------------------------------------------------------

enum class ConfigType : uint8_t { kInt, kBytes, kDouble, kBool, kString, kEnum };
// What struct a row's field lives in, and so where the key may appear.
enum class ConfigScope : uint8_t {
  kGlobal,    // Config::server/pool/budget/evict/limits: [server], [pool], [budget], [evict],
              // [limits]; env and CLI overridable.
  kQuant,     // QuantSettings: [quant] (env and CLI overridable) and every [[model]] table.
  kOverride,  // QuantOverride: every [[quant.override]] and [[model.override]] table.
  kModel,     // ModelConfig: every [[model]] table.
};
enum ConfigFlag : uint32_t {
  kImmutable = 1u << 0,   // Fixed for the daemon's life: a reload that changes it is refused.
  kReloadable = 1u << 1,  // A SIGHUP reload applies it (to new sequences where it shapes data).
  kPowerOfTwo = 1u << 2,  // Numeric value must be a power of two.
  kRequired = 1u << 3,    // Must be given in every table of its scope (no default).
};

using ConfigValue = std::variant<int64_t, double, bool, std::string>;  // Enums: index in names.

struct ConfigOption {
  std::string key{};    // "pool.bytes"; "quant.override.layer", "model.name" for table fields.
  ConfigType type{};    // Set by the table from the field's C++ type.
  ConfigScope scope{};  // Set by the table from the field's struct.
  std::string default_text{};  // As written in TOML, unquoted ("256MiB", "info"); "" if kRequired.
  double min = 0, max = 0;     // Inclusive range of kInt, kBytes and kDouble values.
  uint32_t flags = 0;
  std::string env{};                 // "KVCTL_POOL_BYTES"; empty for table fields.
  std::vector<std::string> names{};  // kEnum: allowed names, index = enumerator value.
  std::string doc{};
  // Extra check beyond type and range (e.g. the endpoint scheme): returns "" if `value` is fine,
  // else what was expected ("ipc://PATH or tcp://HOST:PORT"). Null if none.
  std::string (*check)(const ConfigValue& value) = nullptr;
  // Field access on the scope's struct (Config, QuantSettings, QuantOverride or ModelConfig).
  ConfigValue (*get)(const void* scope_struct) = nullptr;
  void (*set)(void* scope_struct, const ConfigValue& value) = nullptr;

  std::string_view short_key() const;  // The part after the last '.': "bytes".
};

// Every key, in documentation order.
const std::vector<ConfigOption>& ConfigSchema();
// The row for `key` ("pool.bytes", "quant.override.head"); null if there is none.
const ConfigOption* FindConfigOption(std::string_view key);

// Text <-> value for one row. Parse checks type, range, power of two, enum names and `check`;
// errors read "<key>: got <text>, expected <what>".
StatusOr<ConfigValue> ParseConfigValue(const ConfigOption& option, std::string_view text);
Status CheckConfigValue(const ConfigOption& option, const ConfigValue& value);
std::string FormatConfigValue(const ConfigOption& option, const ConfigValue& value);  // TOML.
// What a valid value looks like: "an integer in 1..64", "one of cpu, cuda".
std::string DescribeExpected(const ConfigOption& option);

// "512MiB", "1GiB", "4096", "64 KiB" (binary units B, KiB, MiB, GiB, TiB; whole numbers only).
StatusOr<uint64_t> ParseByteSize(std::string_view text);
std::string FormatByteSize(uint64_t bytes);  // Largest exact unit: 268435456 -> "256MiB".

// ---- Loading ----------------------------------------------------------------------------------

// Returns the value of an environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
std::optional<std::string> SystemEnv(const std::string& name);  // getenv().

struct ConfigLoadOptions {
  std::string file{};  // TOML file; empty: built-in defaults only.
  std::vector<std::pair<std::string, std::string>> cli{};  // (key, value) from the command line.
  EnvLookup env{};                                         // Null: ignore the environment.
};

// Defaults, then the file, then KVCTL_* env, then CLI; then ValidateConfig.
StatusOr<Config> LoadConfig(const ConfigLoadOptions& options);

// Applies a TOML document on top of `config` (source kFile). `origin` names it in errors
// ("configs/x.toml:3:9: pool.bytes: got ..."). Unknown keys and bad values are errors.
Status ApplyToml(Config& config, std::string_view toml_text, std::string_view origin);
// Applies the env mirror of every [server] ... [limits] key that `env` reports set and non-empty.
Status ApplyEnvOverrides(Config& config, const EnvLookup& env);
// Sets a [server], [pool], [quant], [budget], [evict] or [limits] `key` from text. Validated even
// when `source` is below the key's current source, in which case the value is left alone
// (precedence CLI > env > file > default).
Status ApplyOverride(Config& config, std::string_view key, std::string_view value,
                     ConfigSource source);

// Checks across keys that no single row can: page vs pool size, staging carve-out, model names,
// override duplicates, bit widths and block sizes against each method (head_dim is checked later,
// by ResolveQuantSpec, when a client names its model).
Status ValidateConfig(const Config& config);

// The current value of a [server] ... [limits] key as TOML text ("\"256MiB\"", "2").
StatusOr<std::string> GetConfigValueText(const Config& config, std::string_view key);
// The effective config as a loadable TOML document; each value ends with "# <source>".
std::string PrintConfig(const Config& config);

// OK if `neu` may replace `old` on SIGHUP; FAILED_PRECONDITION naming every immutable key that
// differs ("pool.bytes: cannot change on reload (256MiB -> 1GiB); restart the daemon").
Status CheckReload(const Config& old, const Config& neu);

// One value a reload would change, for the daemon's log ("reload: quant.k_bits 2 -> 4 (applies
// to sequences opened from now)").
struct ConfigChange {
  std::string key;        // "quant.k_bits"; "quant.override" (the whole list); "model \"m\"".
  std::string old_value;  // TOML text ("2", "\"kivi\"", an inline table or array); "none".
  std::string new_value;
  bool needs_restart = false;  // A kImmutable key: a reload that changes it is refused.
  std::string_view applies;    // When the new value takes effect ("applies now", ...).
  bool operator==(const ConfigChange&) const = default;
};
// Every difference between `old` and `neu`: the keys of [server] ... [limits] in schema order,
// then the [[quant.override]] list, then each [[model]] table by name (added, removed or changed).
std::vector<ConfigChange> DiffConfig(const Config& old, const Config& neu);
// When a reloaded value of `key` takes effect; "" for keys that cannot change on reload.
std::string_view ReloadTiming(std::string_view key);

// ---- Quantizer resolution ---------------------------------------------------------------------

// The [[model]] entry for a model name sent in HELLO: an entry matches the full name or its part
// after the last '/' ("HuggingFaceTB/SmolLM2-135M" matches "SmolLM2-135M"); exact matches first.
const ModelConfig* FindModel(const Config& config, std::string_view model_name);
// [quant] with the keys of `model` (may be null) applied.
QuantSettings EffectiveQuantSettings(const Config& config, const ModelConfig* model);

// The quantizer of (layer, head) for `model_name` at `head_dim`: registry defaults of the method
// (MakeQuantSpec), then the [quant]/[[model]] keys, then the most specific override ((layer, head)
// before (layer, -1)); validated with ValidateQuantSpec. Errors name the model, layer and head.
StatusOr<QuantSpec> ResolveQuantSpec(const Config& config, std::string_view model_name,
                                     int head_dim, int layer, int head);
// Sink and flush sizes for `model_name`: the method's defaults unless set (flush rounded up to a
// multiple of block_tokens), validated with ValidateStreamingRules.
StatusOr<StreamingRules> ResolveStreamingRules(const Config& config, std::string_view model_name,
                                               int head_dim);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_CONFIG_CONFIG_H_
