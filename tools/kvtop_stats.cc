// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvtop_stats.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <tuple>

namespace kvctl::kvtop {
namespace {

std::vector<std::string_view> Split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string_view::npos ? s.npos : end - start));
    if (end == std::string_view::npos) return out;
    start = end + 1;
  }
}

// `layer_3`, `head_3_1`, `seq_7_2`: a lower-case word, then one or more `_digits` groups.
bool IsEntityKey(std::string_view key) {
  const std::vector<std::string_view> parts = Split(key, '_');
  if (parts.size() < 2 || parts[0].empty()) return false;
  for (char c : parts[0]) {
    if (!std::islower(static_cast<unsigned char>(c))) return false;
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    if (parts[i].empty() || parts[i].find_first_not_of("0123456789") != std::string_view::npos) {
      return false;
    }
  }
  return true;
}

std::optional<double> ToNumber(std::string_view s) {
  if (!IsJsonNumber(s)) return std::nullopt;
  return std::strtod(std::string(s).c_str(), nullptr);
}

double NumOr0(const StatsEntity& e, std::string_view key) {
  const std::string* v = e.Find(key);
  return v ? ToNumber(*v).value_or(0) : 0;
}

// The integers after the entity's word: `head_3_1` -> {3, 1}.
std::vector<uint64_t> EntityIndices(std::string_view name) {
  std::vector<uint64_t> out;
  const std::vector<std::string_view> parts = Split(name, '_');
  for (size_t i = 1; i < parts.size(); ++i) {
    out.push_back(std::strtoull(std::string(parts[i]).c_str(), nullptr, 10));
  }
  return out;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

}  // namespace

const std::string* StatsEntity::Find(std::string_view key) const {
  for (const auto& [k, v] : fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

const StatsSection* StatsText::Section(std::string_view name) const {
  for (const StatsSection& s : sections) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const std::string* StatsText::Field(std::string_view section, std::string_view key) const {
  const StatsSection* s = Section(section);
  if (s == nullptr) return nullptr;
  for (const auto& [k, v] : s->fields) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::optional<double> StatsText::Number(std::string_view section, std::string_view key) const {
  const std::string* v = Field(section, key);
  return v ? ToNumber(*v) : std::nullopt;
}

bool IsJsonNumber(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i > start;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

StatusOr<StatsText> ParseStatsText(std::string_view text) {
  StatsText out;
  StatsSection* section = nullptr;
  int line_no = 0;
  for (std::string_view line : Split(text, '\n')) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line[0] == '#') {
      const size_t start = line.find_first_not_of("# ");
      std::string name(start == std::string_view::npos ? "" : line.substr(start));
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      // A repeated header continues its section, so every section name appears once.
      auto same = std::find_if(out.sections.begin(), out.sections.end(),
                               [&](const StatsSection& s) { return s.name == name; });
      section = same != out.sections.end() ? &*same
                                           : &out.sections.emplace_back(StatsSection{name, {}, {}});
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) {
      return InvalidArgument("stats line ", line_no, ": got \"", line,
                             "\", expected `# Section`, `field:value` or `entity:k=v,...`");
    }
    if (section == nullptr) section = &out.sections.emplace_back(StatsSection{"server", {}, {}});
    const std::string_view key = line.substr(0, colon), value = line.substr(colon + 1);
    if (IsEntityKey(key) && value.find('=') != std::string_view::npos) {
      StatsEntity entity{std::string(key), {}};
      for (std::string_view kv : Split(value, ',')) {
        const size_t eq = kv.find('=');
        if (eq == std::string_view::npos) continue;
        entity.fields.emplace_back(std::string(kv.substr(0, eq)), std::string(kv.substr(eq + 1)));
      }
      section->entities.push_back(std::move(entity));
    } else {
      section->fields.emplace_back(std::string(key), std::string(value));
    }
  }
  if (out.sections.empty()) return InvalidArgument("stats text: got no lines, expected sections");
  return out;
}

double Snapshot::Num(std::string_view section, std::string_view key) const {
  return text.Number(section, key).value_or(0);
}

std::string Snapshot::Str(std::string_view section, std::string_view key) const {
  const std::string* v = text.Field(section, key);
  return v ? *v : std::string();
}

std::vector<HeadRow> Snapshot::HeadsOf(int layer) const {
  std::vector<HeadRow> out;
  for (const HeadRow& h : heads) {
    if (h.layer == layer) out.push_back(h);
  }
  return out;
}

Snapshot BuildSnapshot(StatsText text) {
  Snapshot s;
  s.text = std::move(text);
  for (const StatsSection& section : s.text.sections) {
    for (const StatsEntity& e : section.entities) {
      const std::vector<uint64_t> idx = EntityIndices(e.name);
      if (StartsWith(e.name, "layer_") && idx.size() == 1) {
        s.layers.push_back({static_cast<int>(idx[0]), NumOr0(e, "tokens"), NumOr0(e, "bytes"),
                            NumOr0(e, "bits_per_element"), NumOr0(e, "budget_tokens"),
                            NumOr0(e, "evictions")});
      } else if (StartsWith(e.name, "head_") && idx.size() == 2) {
        s.heads.push_back({static_cast<int>(idx[0]), static_cast<int>(idx[1]), NumOr0(e, "tokens"),
                           NumOr0(e, "k_bits"), NumOr0(e, "v_bits"), NumOr0(e, "bits_per_element"),
                           NumOr0(e, "k_rel_error"), NumOr0(e, "v_rel_error"),
                           NumOr0(e, "quality_samples")});
      } else if (StartsWith(e.name, "seq_") && idx.size() == 2) {
        const std::string* client = e.Find("client");
        s.sequences.push_back({idx[0], idx[1], client ? *client : std::string(),
                               NumOr0(e, "tokens"), NumOr0(e, "bytes"), NumOr0(e, "evictions"),
                               NumOr0(e, "age_s")});
      }
    }
  }
  std::sort(s.layers.begin(), s.layers.end(),
            [](const LayerRow& a, const LayerRow& b) { return a.layer < b.layer; });
  std::sort(s.heads.begin(), s.heads.end(), [](const HeadRow& a, const HeadRow& b) {
    return std::tie(a.layer, a.head) < std::tie(b.layer, b.head);
  });
  return s;
}

Rates ComputeRates(const Snapshot& before, double t0_s, const Snapshot& after, double t1_s) {
  Rates r;
  const double dt = t1_s - t0_s;
  if (dt <= 0 || before.Str("server", "pid") != after.Str("server", "pid")) return r;
  bool went_down = false;
  auto rate = [&](std::string_view key) {
    const std::optional<double> a = before.text.Number("ipc", key);
    const std::optional<double> b = after.text.Number("ipc", key);
    if (!a || !b) return 0.0;
    if (*b < *a) went_down = true;
    return (*b - *a) / dt;
  };
  r.requests = rate("requests_total");
  r.errors = rate("errors_total");
  r.appends = rate("append_requests_total");
  r.fetches = rate("fetch_requests_total");
  r.bytes_in = rate("bytes_in_total");
  r.bytes_out = rate("bytes_out_total");
  r.valid = !went_down;
  return r;
}

}  // namespace kvctl::kvtop
