// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// Loading (TOML, env, CLI), cross-key validation, printing, the reload check and quantizer
// resolution, all driven by the rows of ConfigSchema() (config_schema.cc).
#include "controller/config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "controller/config/budget_keys.h"

namespace kvctl {
namespace {

using internal::StrCat;

constexpr std::string_view kSections[] = {"server", "pool",   "quant", "budget",
                                          "evict",  "limits", "tier"};

// Keeps the code, puts `prefix` in front of the message.
Status Prefixed(std::string_view prefix, const Status& s) {
  return Status(s.code(), StrCat(prefix, s.message()));
}

std::string Where(std::string_view origin, const toml::source_region& src) {
  if (src.begin.line == 0) return StrCat(origin, ": ");
  return StrCat(origin, ":", src.begin.line, ":", src.begin.column, ": ");
}

std::string NodeText(const toml::node& n) {
  if (n.is_table()) return "a table";
  if (n.is_array()) return "an array";
  if (n.is_string()) return StrCat("\"", n.as_string()->get(), "\"");
  std::ostringstream out;
  n.visit([&](const auto& v) { out << v; });
  return out.str();
}

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// "unknown key pool.byte (did you mean pool.bytes?)", suggesting among `candidates`.
Status UnknownKey(std::string_view where, std::string_view key,
                  const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = 4;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(key, c);
    if (d < best_d) best_d = d, best = c;
  }
  if (!best.empty())
    return InvalidArgument(where, "unknown key ", key, " (did you mean ", best, "?)");
  std::string all;
  for (const std::string& c : candidates) all += (all.empty() ? "" : ", ") + c;
  return InvalidArgument(where, "unknown key ", key, ", expected one of: ", all);
}

std::vector<std::string> KeysOf(ConfigScope scope, std::string_view prefix, bool short_names) {
  std::vector<std::string> keys;
  for (const ConfigOption& o : ConfigSchema()) {
    if (o.scope != scope || o.key.compare(0, prefix.size(), prefix) != 0) continue;
    keys.push_back(short_names ? std::string(o.short_key()) : o.key);
  }
  return keys;
}

// A TOML value for row `o`: the TOML type must match (byte sizes take integers or strings).
StatusOr<ConfigValue> FromNode(const ConfigOption& o, const toml::node& n) {
  std::optional<ConfigValue> v;
  switch (o.type) {
    case ConfigType::kInt:
      if (n.is_integer()) v = n.as_integer()->get();
      break;
    case ConfigType::kBytes:
      if (n.is_integer()) v = n.as_integer()->get();
      if (n.is_string()) return ParseConfigValue(o, n.as_string()->get());
      break;
    case ConfigType::kDouble:
      if (n.is_floating_point()) v = n.as_floating_point()->get();
      if (n.is_integer()) v = static_cast<double>(n.as_integer()->get());
      break;
    case ConfigType::kBool:
      if (n.is_boolean()) v = n.as_boolean()->get();
      break;
    case ConfigType::kString:
    case ConfigType::kEnum:
      if (n.is_string()) return ParseConfigValue(o, n.as_string()->get());
      break;
  }
  if (!v) return InvalidArgument(o.key, ": got ", NodeText(n), ", expected ", DescribeExpected(o));
  KVCTL_RETURN_IF_ERROR(CheckConfigValue(o, *v));
  return *v;
}

void SetGlobal(Config& c, const ConfigOption& o, const ConfigValue& v, ConfigSource source) {
  auto it = c.sources.find(o.key);
  const ConfigSource current = it == c.sources.end() ? ConfigSource::kDefault : it->second;
  if (source < current) return;
  o.set(o.scope == ConfigScope::kGlobal ? static_cast<void*>(&c) : &c.quant, v);
  c.sources[o.key] = source;
}

const toml::table* AsTable(const toml::node& n, std::string_view origin, std::string_view what,
                           Status* error) {
  if (const toml::table* t = n.as_table()) return t;
  *error =
      InvalidArgument(Where(origin, n.source()), what, ": got ", NodeText(n), ", expected a table");
  return nullptr;
}

// [[quant.override]] or [[model.override]]: an array of tables of quant.override.* keys.
StatusOr<std::vector<QuantOverride>> ParseOverrides(const toml::node& n, std::string_view origin,
                                                    std::string_view what) {
  const toml::array* array = n.as_array();
  if (array == nullptr) {
    return InvalidArgument(Where(origin, n.source()), what, ": got ", NodeText(n),
                           ", expected an array of tables ([[", what, "]])");
  }
  std::vector<QuantOverride> out;
  for (const toml::node& element : *array) {
    Status error;
    const toml::table* t = AsTable(element, origin, what, &error);
    if (t == nullptr) return error;
    QuantOverride ov;
    std::set<std::string> given;
    for (auto&& [k, node] : *t) {
      const ConfigOption* o = FindConfigOption(StrCat("quant.override.", k.str()));
      if (o == nullptr) {
        std::vector<std::string> keys;
        for (const std::string& key : KeysOf(ConfigScope::kOverride, "", true)) {
          keys.push_back(StrCat(what, ".", key));
        }
        return UnknownKey(Where(origin, k.source()), StrCat(what, ".", k.str()), keys);
      }
      StatusOr<ConfigValue> v = FromNode(*o, node);
      if (!v.ok()) return Prefixed(Where(origin, node.source()), v.status());
      o->set(&ov, *v);
      given.insert(o->key);
    }
    for (const ConfigOption& o : ConfigSchema()) {
      if (o.scope != ConfigScope::kOverride) continue;
      if (given.count(o.key)) continue;
      if (o.flags & kRequired) {
        return InvalidArgument(Where(origin, t->source()), what, ": missing required key ",
                               o.short_key());
      }
      o.set(&ov, *ParseConfigValue(o, o.default_text));
    }
    out.push_back(ov);
  }
  return out;
}

StatusOr<ModelConfig> ParseModel(const toml::table& t, std::string_view origin) {
  ModelConfig m;
  bool has_name = false;
  std::vector<std::string> allowed = KeysOf(ConfigScope::kQuant, "quant.", true);
  allowed.insert(allowed.begin(), {"name", "override"});
  for (auto&& [k, node] : t) {
    const std::string key(k.str());
    if (key == "override") {
      KVCTL_ASSIGN_OR_RETURN(m.overrides, ParseOverrides(node, origin, "model.override"));
      continue;
    }
    const ConfigOption* o = FindConfigOption(key == "name" ? "model.name" : "quant." + key);
    if (o == nullptr || (o->scope != ConfigScope::kQuant && o->scope != ConfigScope::kModel)) {
      return UnknownKey(Where(origin, k.source()), "model." + key, allowed);
    }
    StatusOr<ConfigValue> v = FromNode(*o, node);
    if (!v.ok()) return Prefixed(Where(origin, node.source()), v.status());
    if (o->scope == ConfigScope::kModel) {
      o->set(&m, *v);
      has_name = true;
    } else {
      o->set(&m.quant, *v);
      m.quant_keys.push_back(key);
    }
  }
  if (!has_name)
    return InvalidArgument(Where(origin, t.source()), "model: missing required key name");
  // Schema order, so equal tables give equal configs whatever order their keys were written in.
  std::vector<std::string> ordered;
  for (const std::string& key : KeysOf(ConfigScope::kQuant, "quant.", true)) {
    if (std::find(m.quant_keys.begin(), m.quant_keys.end(), key) != m.quant_keys.end()) {
      ordered.push_back(key);
    }
  }
  m.quant_keys = std::move(ordered);
  return m;
}

// One of kSections ([quant]'s "override" key holds [[quant.override]]).
Status ApplySection(Config& c, std::string_view section, const toml::table& t,
                    std::string_view origin) {
  const ConfigScope scope = section == "quant" ? ConfigScope::kQuant : ConfigScope::kGlobal;
  const std::string prefix = StrCat(section, ".");
  for (auto&& [k, node] : t) {
    if (section == "quant" && k.str() == "override") {
      KVCTL_ASSIGN_OR_RETURN(c.quant_overrides, ParseOverrides(node, origin, "quant.override"));
      continue;
    }
    const ConfigOption* o = FindConfigOption(prefix + std::string(k.str()));
    if (o == nullptr || o->scope != scope) {
      std::vector<std::string> keys = KeysOf(scope, prefix, false);
      if (section == "quant") keys.push_back("quant.override");
      return UnknownKey(Where(origin, k.source()), prefix + std::string(k.str()), keys);
    }
    StatusOr<ConfigValue> v = FromNode(*o, node);
    if (!v.ok()) return Prefixed(Where(origin, node.source()), v.status());
    SetGlobal(c, *o, *v, ConfigSource::kFile);
  }
  return OkStatus();
}

StatusOr<std::string> ReadFile(const std::string& path) {
  return ReadWholeFile(path, "the config file");
}

// ---- Quantizer resolution helpers -------------------------------------------------------------

bool UsesGroups(QuantMethod m) { return m == QuantMethod::kKivi || m == QuantMethod::kOscar; }

// The most specific override of (layer, head): exact head before -1. Null if none.
const QuantOverride* FindOverride(const std::vector<QuantOverride>& list, int layer, int head) {
  const QuantOverride* all_heads = nullptr;
  for (const QuantOverride& ov : list) {
    if (ov.layer != layer) continue;
    if (ov.head == head) return &ov;
    if (ov.head == -1) all_heads = &ov;
  }
  return all_heads;
}

StatusOr<QuantSpec> BuildSpec(const QuantSettings& s, const QuantOverride* ov, int head_dim) {
  const MethodTraits& traits = TraitsOf(s.method);
  int k = s.k_bits, v = s.v_bits;
  if (ov != nullptr && ov->k_bits != 0) k = ov->k_bits;
  if (ov != nullptr && ov->v_bits != 0) v = ov->v_bits;
  // A method with a single width (fp16) takes it whatever [quant] and the overrides say, so a
  // model switched to fp16 does not trip over bit widths it inherits.
  if (std::has_single_bit(traits.allowed_bits)) k = v = std::countr_zero(traits.allowed_bits);
  KVCTL_ASSIGN_OR_RETURN(QuantSpec spec, MakeQuantSpec(s.method, head_dim, k, v));
  if (s.block_tokens != 0) spec.block_tokens = s.block_tokens;
  if (UsesGroups(s.method)) {
    if (s.k_group_tokens != 0) spec.k_group_tokens = s.k_group_tokens;
    if (s.v_group_channels != 0) spec.v_group_channels = s.v_group_channels;
  } else {
    spec.k_group_tokens = spec.block_tokens;  // Canonical, as MakeQuantSpec pins it.
  }
  if (s.method == QuantMethod::kKvarn) spec.sinkhorn_iters = s.sinkhorn_iters;
  KVCTL_RETURN_IF_ERROR(ValidateQuantSpec(spec));
  return spec;
}

// `joint`: budget.mode = joint. Its plan charges each head the worst-case fp16 tail
// (flush_tokens - 1 rows, docs/joint_planner.md), so an unset flush is the block there: the
// method's 128 would put 119 of a 1/8 plan's 128 fp16-row equivalents per head into the tail at
// 1,024 tokens (docs/quality.md, "Tight budgets": +110 % dPPL against +19.6 % with a flush of 32).
StatusOr<StreamingRules> BuildRules(const QuantSettings& s, const QuantSpec& spec, bool joint) {
  const StreamingRules& d = TraitsOf(s.method).streaming;
  StreamingRules rules;
  rules.sink_tokens = s.sink_tokens >= 0 ? s.sink_tokens : d.sink_tokens;
  const int g = spec.block_tokens;
  rules.flush_tokens = s.flush_tokens > 0 ? s.flush_tokens
                       : joint            ? g
                                          : (d.flush_tokens + g - 1) / g * g;
  KVCTL_RETURN_IF_ERROR(ValidateStreamingRules(spec, rules));
  return rules;
}

const std::vector<QuantOverride>& OverridesFor(const Config& c, const ModelConfig* m) {
  return m != nullptr && m->overrides ? *m->overrides : c.quant_overrides;
}

std::string ModelLabel(const ModelConfig* m) {
  return m == nullptr ? std::string("quant") : StrCat("model \"", m->name, "\"");
}

// Load-time check of one scope. head_dim is not known until HELLO, so the spec is built at a
// head_dim every group setting divides (v_group_channels itself when set, else 128), once
// v_group_channels has been checked on its own: no error names a head_dim nobody gave. HELLO
// re-checks with the real one.
Status ValidateQuantScope(const Config& c, const ModelConfig* m) {
  const QuantSettings s = EffectiveQuantSettings(c, m);
  const std::string label = ModelLabel(m);
  const auto fail = [&](std::string_view where, const Status& st) {
    // INVALID_ARGUMENT whatever the registry said: it is the file that is wrong. [quant]'s own
    // keys read as written ("quant.k_bits: got 5, ..."); a model or override says which one.
    const bool key = m == nullptr && where.empty();
    return InvalidArgument(label, where, key ? "." : ": ", st.message());
  };
  int probe = 128;
  if (UsesGroups(s.method) && s.v_group_channels != 0) {
    const int vg = s.v_group_channels;
    const MethodTraits& traits = TraitsOf(s.method);
    if (traits.rotates && (!std::has_single_bit(static_cast<unsigned>(vg)) || vg < 8 || vg > 256)) {
      return fail("", InvalidArgument("v_group_channels: got ", vg,
                                      ", expected a power of two in 8..256 for ", traits.name,
                                      " (it divides head_dim, which the Hadamard rotation needs "
                                      "to be a power of two <= 256)"));
    }
    if (vg < 8 || vg % 8 != 0) {
      return fail("", InvalidArgument("v_group_channels: got ", vg,
                                      ", expected a multiple of 8 (it divides head_dim)"));
    }
    probe = vg;
  }
  StatusOr<QuantSpec> spec = BuildSpec(s, nullptr, probe);
  if (!spec.ok()) return fail("", spec.status());
  StatusOr<StreamingRules> rules = BuildRules(s, *spec, c.budget.mode == BudgetMode::kJoint);
  if (!rules.ok()) return fail("", rules.status());
  const std::vector<QuantOverride>& list = OverridesFor(c, m);
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < list.size(); ++i) {
    const QuantOverride& ov = list[i];
    const std::string where =
        StrCat(" override #", i + 1, " (layer ", ov.layer, ", head ", ov.head, ")");
    if (ov.k_bits == 0 && ov.v_bits == 0) {
      return InvalidArgument(label, where, ": sets neither k_bits nor v_bits");
    }
    if (!seen.insert({ov.layer, ov.head}).second) {
      return InvalidArgument(label, where,
                             ": duplicate of an earlier override of the same "
                             "(layer, head)");
    }
    StatusOr<QuantSpec> ov_spec = BuildSpec(s, &ov, probe);
    if (!ov_spec.ok()) return fail(where, ov_spec.status());
  }
  return OkStatus();
}

}  // namespace

// ---- Loading ----------------------------------------------------------------------------------

std::optional<std::string> SystemEnv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

Status ApplyToml(Config& config, std::string_view toml_text, std::string_view origin) {
  toml::table root;
  try {
    root = toml::parse(toml_text, std::string(origin));
  } catch (const toml::parse_error& e) {
    return InvalidArgument(Where(origin, e.source()), "TOML syntax error: ", e.description());
  }
  Config out = config;  // A bad file leaves `config` as it was.
  for (auto&& [k, node] : root) {
    const std::string key(k.str());
    Status error;
    if (std::find(std::begin(kSections), std::end(kSections), key) != std::end(kSections)) {
      const toml::table* t = AsTable(node, origin, key, &error);
      if (t == nullptr) return error;
      KVCTL_RETURN_IF_ERROR(ApplySection(out, key, *t, origin));
    } else if (key == "model") {
      const toml::array* models = node.as_array();
      if (models == nullptr) {
        return InvalidArgument(Where(origin, node.source()), "model: got ", NodeText(node),
                               ", expected an array of tables ([[model]])");
      }
      out.models.clear();
      for (const toml::node& element : *models) {
        const toml::table* t = AsTable(element, origin, "model", &error);
        if (t == nullptr) return error;
        KVCTL_ASSIGN_OR_RETURN(ModelConfig m, ParseModel(*t, origin));
        out.models.push_back(std::move(m));
      }
    } else {
      return UnknownKey(Where(origin, k.source()), key,
                        {"server", "pool", "quant", "budget", "evict", "limits", "tier", "model"});
    }
  }
  config = std::move(out);
  return OkStatus();
}

Status ApplyOverride(Config& config, std::string_view key, std::string_view value,
                     ConfigSource source) {
  const ConfigOption* o = FindConfigOption(key);
  if (o == nullptr) {
    std::vector<std::string> keys = KeysOf(ConfigScope::kGlobal, "", false);
    for (const std::string& k : KeysOf(ConfigScope::kQuant, "", false)) keys.push_back(k);
    return UnknownKey("", key, keys);
  }
  if (o->scope != ConfigScope::kGlobal && o->scope != ConfigScope::kQuant) {
    return InvalidArgument(
        key,
        ": a key of an array of tables; set it in the config file "
        "(only keys of [server], [pool], [quant], [budget], [evict], [limits] and "
        "[tier] can be overridden)");
  }
  KVCTL_ASSIGN_OR_RETURN(ConfigValue v, ParseConfigValue(*o, value));
  SetGlobal(config, *o, v, source);
  return OkStatus();
}

Status ApplyEnvOverrides(Config& config, const EnvLookup& env) {
  for (const ConfigOption& o : ConfigSchema()) {
    if (o.env.empty()) continue;
    const std::optional<std::string> v = env(o.env);
    if (!v || v->empty()) continue;
    const Status s = ApplyOverride(config, o.key, *v, ConfigSource::kEnv);
    if (!s.ok()) return Prefixed(StrCat(o.env, ": "), s);
  }
  return OkStatus();
}

StatusOr<Config> LoadConfig(const ConfigLoadOptions& options) {
  Config config;
  if (!options.file.empty()) {
    KVCTL_ASSIGN_OR_RETURN(std::string text, ReadFile(options.file));
    KVCTL_RETURN_IF_ERROR(ApplyToml(config, text, options.file));
  }
  if (options.env) KVCTL_RETURN_IF_ERROR(ApplyEnvOverrides(config, options.env));
  for (const auto& [key, value] : options.cli) {
    const Status s = ApplyOverride(config, key, value, ConfigSource::kCli);
    if (!s.ok()) return Prefixed("command line: ", s);
  }
  KVCTL_RETURN_IF_ERROR(ValidateConfig(config));
  return config;
}

Status ValidateConfig(const Config& c) {
  const PoolConfig& p = c.pool;
  if (p.page_bytes > p.bytes) {
    return InvalidArgument("pool.page_bytes: got ", FormatByteSize(p.page_bytes),
                           ", expected at most pool.bytes (", FormatByteSize(p.bytes), ")");
  }
  if (p.staging_slots > 0 && p.staging_bytes_per_session > 0) {
    // Same stride as PageAllocator: slots start on 4KiB boundaries.
    const uint64_t staging =
        uint64_t(p.staging_slots) * ((p.staging_bytes_per_session + 4095) / 4096 * 4096);
    if (staging > p.bytes / 2) {
      return InvalidArgument("pool.staging_slots: ", p.staging_slots, " slots of ",
                             FormatByteSize(p.staging_bytes_per_session), " take ",
                             FormatByteSize(staging), ", expected at most half of pool.bytes ",
                             FormatByteSize(p.bytes), " (", FormatByteSize(p.bytes / 2),
                             "); lower pool.staging_slots or pool.staging_bytes_per_session");
    }
    if (p.bytes - staging < p.page_bytes) {
      return InvalidArgument("pool.page_bytes: got ", FormatByteSize(p.page_bytes),
                             ", expected at most the ", FormatByteSize(p.bytes - staging),
                             " left after staging");
    }
  }
  if (p.checksums && p.scrub_interval_ms > 0 && p.scrub_bytes_per_second > 0 &&
      p.scrub_bytes_per_second * static_cast<uint64_t>(p.scrub_interval_ms) / 1000 < p.page_bytes) {
    return InvalidArgument(
        "pool.scrub_bytes_per_second: got ", FormatByteSize(p.scrub_bytes_per_second),
        " with pool.scrub_interval_ms ", p.scrub_interval_ms,
        ", expected at least one page (pool.page_bytes ", FormatByteSize(p.page_bytes),
        ") per period; raise it, lengthen the period, or set either to 0 to "
        "turn the scrubber off");
  }
  KVCTL_RETURN_IF_ERROR(ValidateQuantScope(c, nullptr));
  std::set<std::string> names;
  for (const ModelConfig& m : c.models) {
    if (m.name.empty()) return InvalidArgument("model.name: got \"\", expected a model name");
    if (!names.insert(m.name).second) {
      return InvalidArgument("model.name: got \"", m.name, "\" twice, expected unique names");
    }
    KVCTL_RETURN_IF_ERROR(ValidateQuantScope(c, &m));
  }
  return ValidateBudgetConfig(c);
}

// ---- Printing and reload ----------------------------------------------------------------------

StatusOr<std::string> GetConfigValueText(const Config& config, std::string_view key) {
  const ConfigOption* o = FindConfigOption(key);
  if (o == nullptr || (o->scope != ConfigScope::kGlobal && o->scope != ConfigScope::kQuant)) {
    return NotFound(key,
                    ": not a key of [server], [pool], [quant], [budget], [evict], [limits] or "
                    "[tier]");
  }
  const void* obj =
      o->scope == ConfigScope::kGlobal ? static_cast<const void*>(&config) : &config.quant;
  return FormatConfigValue(*o, o->get(obj));
}

std::string PrintConfig(const Config& c) {
  std::ostringstream out;
  out << "# kvctl effective configuration. The comment after each value is its source:\n"
         "# default, file, env (KVCTL_*) or cli.\n";
  const auto line = [&](std::string_view key, const std::string& value, std::string_view source) {
    std::string text = StrCat(key, " = ", value);
    if (!source.empty()) {
      text.resize(std::max<size_t>(text.size() + 2, 40), ' ');
      text += StrCat("# ", source);
    }
    out << text << "\n";
  };
  const auto print_overrides = [&](const std::vector<QuantOverride>& list, std::string_view name) {
    for (const QuantOverride& ov : list) {
      out << "\n[[" << name << "]]\n";
      for (const ConfigOption& o : ConfigSchema()) {
        if (o.scope == ConfigScope::kOverride)
          line(o.short_key(), FormatConfigValue(o, o.get(&ov)), "");
      }
    }
  };
  for (std::string_view section : kSections) {
    out << "\n[" << section << "]\n";
    for (const ConfigOption& o : ConfigSchema()) {
      if (o.key.compare(0, section.size() + 1, StrCat(section, ".")) != 0) continue;
      if (o.scope != ConfigScope::kGlobal && o.scope != ConfigScope::kQuant) continue;
      auto it = c.sources.find(o.key);
      const ConfigSource source = it == c.sources.end() ? ConfigSource::kDefault : it->second;
      line(o.short_key(), *GetConfigValueText(c, o.key), ConfigSourceName(source));
    }
  }
  if (!c.quant_overrides.empty()) out << "\n# [[quant.override]] tables come from the file.";
  print_overrides(c.quant_overrides, "quant.override");
  for (const ModelConfig& m : c.models) {
    out << "\n[[model]]  # file\n";
    const ConfigOption* name = FindConfigOption("model.name");
    line("name", FormatConfigValue(*name, name->get(&m)), "");
    for (const ConfigOption& o : ConfigSchema()) {
      if (o.scope != ConfigScope::kQuant) continue;
      const std::string_view k = o.short_key();
      if (std::find(m.quant_keys.begin(), m.quant_keys.end(), k) == m.quant_keys.end()) continue;
      line(k, FormatConfigValue(o, o.get(&m.quant)), "");
    }
    if (m.overrides && m.overrides->empty()) line("override", "[]", "");
    if (m.overrides) print_overrides(*m.overrides, "model.override");
  }
  return out.str();
}

namespace {

std::string InlineOverrides(const std::vector<QuantOverride>& list) {
  std::string out = "[";
  for (const QuantOverride& ov : list) {
    out += out.size() > 1 ? ", {" : "{";
    bool first = true;
    for (const ConfigOption& o : ConfigSchema()) {
      if (o.scope != ConfigScope::kOverride) continue;
      out += StrCat(first ? "" : ", ", o.short_key(), " = ", FormatConfigValue(o, o.get(&ov)));
      first = false;
    }
    out += "}";
  }
  return out + "]";
}

// A [[model]] table as one line of inline TOML: its name, the [quant] keys it sets, its overrides.
std::string InlineModel(const ModelConfig& m) {
  const ConfigOption* name = FindConfigOption("model.name");
  std::string out = StrCat("{name = ", FormatConfigValue(*name, name->get(&m)));
  for (const std::string& key : m.quant_keys) {
    const ConfigOption* o = FindConfigOption("quant." + key);
    out += StrCat(", ", key, " = ", FormatConfigValue(*o, o->get(&m.quant)));
  }
  if (m.overrides) out += StrCat(", override = ", InlineOverrides(*m.overrides));
  return out + "}";
}

const ModelConfig* ModelNamed(const std::vector<ModelConfig>& models, const std::string& name) {
  for (const ModelConfig& m : models) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

}  // namespace

std::string_view ReloadTiming(std::string_view key) {
  const ConfigOption* o = FindConfigOption(key);
  if (o != nullptr && (o->flags & kImmutable)) return "";
  if (key == "server.log_level") return "applies now";
  if (key == "server.lease_ms") return "applies now to every session's lease";
  if (key == "server.stats_interval_ms") return "applies from the next publish";
  if (key.starts_with("limits.")) return "applies to requests from now";
  // [quant], [budget], [evict], quality sampling, overrides and models shape a sequence when it
  // is opened; stored records keep what they were written with.
  return "applies to sequences opened from now";
}

std::vector<ConfigChange> DiffConfig(const Config& old, const Config& neu) {
  std::vector<ConfigChange> changes;
  const auto add = [&](std::string key, std::string a, std::string b, bool restart) {
    std::string_view applies = ReloadTiming(key);
    changes.push_back({std::move(key), std::move(a), std::move(b), restart, applies});
  };
  for (const ConfigOption& o : ConfigSchema()) {
    if (o.scope != ConfigScope::kGlobal && o.scope != ConfigScope::kQuant) continue;
    const ConfigValue a =
        o.get(o.scope == ConfigScope::kGlobal ? static_cast<const void*>(&old) : &old.quant);
    const ConfigValue b =
        o.get(o.scope == ConfigScope::kGlobal ? static_cast<const void*>(&neu) : &neu.quant);
    if (a == b) continue;
    add(o.key, FormatConfigValue(o, a), FormatConfigValue(o, b), (o.flags & kImmutable) != 0);
  }
  if (old.quant_overrides != neu.quant_overrides) {
    add("quant.override", InlineOverrides(old.quant_overrides),
        InlineOverrides(neu.quant_overrides), false);
  }
  std::vector<std::string> names;
  for (const ModelConfig& m : old.models) names.push_back(m.name);
  for (const ModelConfig& m : neu.models) {
    if (ModelNamed(old.models, m.name) == nullptr) names.push_back(m.name);
  }
  for (const std::string& name : names) {
    const ModelConfig* a = ModelNamed(old.models, name);
    const ModelConfig* b = ModelNamed(neu.models, name);
    if (a != nullptr && b != nullptr && *a == *b) continue;
    add(StrCat("model \"", name, "\""), a ? InlineModel(*a) : "none", b ? InlineModel(*b) : "none",
        false);
  }
  return changes;
}

Status CheckReload(const Config& old, const Config& neu) {
  std::string refused;
  for (const ConfigChange& c : DiffConfig(old, neu)) {
    if (!c.needs_restart) continue;
    refused += StrCat(refused.empty() ? "" : "; ", c.key, ": cannot change on reload (",
                      c.old_value, " -> ", c.new_value, ")");
  }
  if (refused.empty()) return OkStatus();
  return FailedPrecondition(refused, "; restart the daemon to change it");
}

// ---- Quantizer resolution ---------------------------------------------------------------------

const ModelConfig* FindModel(const Config& config, std::string_view model_name) {
  const auto base = [](std::string_view s) { return s.substr(s.rfind('/') + 1); };
  for (const ModelConfig& m : config.models) {
    if (m.name == model_name) return &m;
  }
  for (const ModelConfig& m : config.models) {
    if (base(m.name) == base(model_name)) return &m;
  }
  return nullptr;
}

QuantSettings EffectiveQuantSettings(const Config& config, const ModelConfig* model) {
  QuantSettings s = config.quant;
  if (model == nullptr) return s;
  for (const std::string& key : model->quant_keys) {
    const ConfigOption* o = FindConfigOption("quant." + key);
    KVCTL_CHECK(o != nullptr && o->scope == ConfigScope::kQuant);
    o->set(&s, o->get(&model->quant));
  }
  return s;
}

StatusOr<QuantSpec> ResolveQuantSpec(const Config& config, std::string_view model_name,
                                     int head_dim, int layer, int head) {
  if (layer < 0 || head < 0) {
    return InvalidArgument("layer, head: got (", layer, ", ", head, "), expected both >= 0");
  }
  const ModelConfig* m = FindModel(config, model_name);
  const QuantOverride* ov = FindOverride(OverridesFor(config, m), layer, head);
  StatusOr<QuantSpec> spec = BuildSpec(EffectiveQuantSettings(config, m), ov, head_dim);
  if (!spec.ok()) {
    return Prefixed(StrCat(ModelLabel(m), " for model \"", model_name, "\" layer ", layer, " head ",
                           head, ": "),
                    spec.status());
  }
  return spec;
}

StatusOr<StreamingRules> ResolveStreamingRules(const Config& config, std::string_view model_name,
                                               int head_dim) {
  const ModelConfig* m = FindModel(config, model_name);
  const QuantSettings s = EffectiveQuantSettings(config, m);
  const std::string prefix = StrCat(ModelLabel(m), " for model \"", model_name, "\": ");
  StatusOr<QuantSpec> spec = BuildSpec(s, nullptr, head_dim);
  if (!spec.ok()) return Prefixed(prefix, spec.status());
  StatusOr<StreamingRules> rules = BuildRules(s, *spec, config.budget.mode == BudgetMode::kJoint);
  if (!rules.ok()) return Prefixed(prefix, rules.status());
  return rules;
}

}  // namespace kvctl
