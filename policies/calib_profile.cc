// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// The calibration profile: the layer-demand pass and the [ratequant] + [reasonalloc] TOML file.
#include "policies/calib_profile.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "common/file_util.h"
#include "policies/toml_text.h"

namespace kvctl {
namespace {

using internal::StrCat;

constexpr int kProfileVersion = 1;

std::string_view TypeName(const toml::node& n) {
  if (n.is_table()) return "a table";
  if (n.is_array()) return "an array";
  if (n.is_string()) return "a string";
  if (n.is_integer()) return "an integer";
  if (n.is_floating_point()) return "a float";
  if (n.is_boolean()) return "a boolean";
  return "a date or time";
}

// Typed, strict reads from the [reasonalloc] table.
class Reader {
 public:
  explicit Reader(const toml::table& t) : t_(t) {}

  Status CheckKeys(const std::set<std::string>& known) const {
    for (const auto& [key, node] : t_) {
      if (!known.count(std::string(key.str()))) {
        return InvalidArgument("reasonalloc.", key.str(), ": unknown key");
      }
    }
    for (const std::string& k : known) {
      if (!t_.contains(k)) return InvalidArgument("reasonalloc.", k, ": missing");
    }
    return OkStatus();
  }
  StatusOr<int64_t> Int(const char* key, int64_t lo, int64_t hi) const {
    const toml::node& n = *t_.get(key);
    if (!n.is_integer()) {
      return InvalidArgument("reasonalloc.", key, ": got ", TypeName(n), ", expected an integer");
    }
    const int64_t v = n.as_integer()->get();
    if (v < lo || v > hi) {
      return InvalidArgument("reasonalloc.", key, ": got ", v, ", expected ", lo, "..", hi);
    }
    return v;
  }
  StatusOr<std::string> String(const char* key) const {
    const toml::node& n = *t_.get(key);
    if (!n.is_string()) {
      return InvalidArgument("reasonalloc.", key, ": got ", TypeName(n), ", expected a string");
    }
    return n.as_string()->get();
  }
  // A finite number in (lo, hi]; integers are accepted.
  static StatusOr<double> Number(const toml::node& n, const std::string& path, double lo,
                                 double hi) {
    std::optional<double> v = n.is_number() ? n.value<double>() : std::nullopt;
    if (!v) return InvalidArgument(path, ": got ", TypeName(n), ", expected a number");
    if (!std::isfinite(*v) || *v <= lo || *v > hi) {
      return InvalidArgument(path, ": got ", *v, ", expected a finite number in (", lo, ", ", hi,
                             "]");
    }
    return *v;
  }
  StatusOr<const toml::array*> Array(const char* key, int64_t size) const {
    const toml::array* a = t_.get(key)->as_array();
    if (!a) {
      return InvalidArgument("reasonalloc.", key, ": got ", TypeName(*t_.get(key)),
                             ", expected an array");
    }
    if (static_cast<int64_t>(a->size()) != size) {
      return InvalidArgument("reasonalloc.", key, ": got ", a->size(),
                             " entries, expected one per layer (", size, ")");
    }
    return a;
  }

 private:
  const toml::table& t_;
};

StatusOr<LayerDemandProfile> ParseDemandTable(const toml::table& t) {
  const Reader r(t);
  KVCTL_RETURN_IF_ERROR(
      r.CheckKeys({"version", "layers", "kv_heads", "measure", "tau", "group_reduce",
                   "queries_per_sequence", "sequences", "samples", "demand"}));
  KVCTL_ASSIGN_OR_RETURN(const int64_t version, r.Int("version", 1, 1 << 20));
  if (version != kProfileVersion) {
    return InvalidArgument("reasonalloc.version: got ", version, ", expected ", kProfileVersion);
  }
  LayerDemandProfile d;
  KVCTL_ASSIGN_OR_RETURN(const int64_t layers, r.Int("layers", 1, 4096));
  KVCTL_ASSIGN_OR_RETURN(const int64_t heads, r.Int("kv_heads", 1, 4096));
  d.layers = static_cast<int>(layers);
  d.kv_heads = static_cast<int>(heads);
  KVCTL_ASSIGN_OR_RETURN(const std::string measure, r.String("measure"));
  if (measure == "coverage") {
    d.measure = DemandMeasure::kCoverage;
  } else if (measure == "entropy") {
    d.measure = DemandMeasure::kEntropy;
  } else {
    return InvalidArgument("reasonalloc.measure: got '", measure,
                           "', expected 'coverage' or 'entropy'");
  }
  KVCTL_ASSIGN_OR_RETURN(d.tau, Reader::Number(*t.get("tau"), "reasonalloc.tau", 0, 1));
  KVCTL_ASSIGN_OR_RETURN(const std::string reduce, r.String("group_reduce"));
  if (reduce == "max") {
    d.reduce = GroupReduce::kMax;
  } else if (reduce == "mean") {
    d.reduce = GroupReduce::kMean;
  } else {
    return InvalidArgument("reasonalloc.group_reduce: got '", reduce,
                           "', expected 'max' or 'mean'");
  }
  KVCTL_ASSIGN_OR_RETURN(const int64_t queries, r.Int("queries_per_sequence", 1, 4096));
  d.queries_per_sequence = static_cast<int>(queries);
  KVCTL_ASSIGN_OR_RETURN(d.sequences, r.Int("sequences", 1, int64_t{1} << 40));
  KVCTL_ASSIGN_OR_RETURN(const toml::array* samples, r.Array("samples", layers));
  KVCTL_ASSIGN_OR_RETURN(const toml::array* demand, r.Array("demand", layers));
  for (int64_t l = 0; l < layers; ++l) {
    const toml::node& s = *samples->get(static_cast<size_t>(l));
    if (!s.is_integer() || s.as_integer()->get() < 1) {
      return InvalidArgument(
          "reasonalloc.samples[", l, "]: got ",
          s.is_integer() ? std::to_string(s.as_integer()->get()) : std::string(TypeName(s)),
          ", expected an integer >= 1");
    }
    d.samples.push_back(s.as_integer()->get());
    KVCTL_ASSIGN_OR_RETURN(const double v,
                           Reader::Number(*demand->get(static_cast<size_t>(l)),
                                          StrCat("reasonalloc.demand[", l, "]"), 0, 1e18));
    d.demand.push_back(v);
  }
  return d;
}

}  // namespace

std::string_view GroupReduceName(GroupReduce reduce) {
  return reduce == GroupReduce::kMax ? "max" : "mean";
}

std::string_view DemandMeasureName(DemandMeasure measure) {
  return measure == DemandMeasure::kCoverage ? "coverage" : "entropy";
}

std::vector<int64_t> DemandQueryPositions(int64_t tokens, int queries) {
  std::vector<int64_t> out;
  if (tokens < 1 || queries < 1) return out;
  const int64_t lo = tokens / 2, hi = tokens - 1;
  for (int i = 0; i < queries; ++i) {
    const int64_t p = queries == 1 ? hi : lo + (hi - lo) * i / (queries - 1);
    if (out.empty() || p != out.back()) out.push_back(p);
  }
  return out;
}

std::vector<double> GroupAttention(std::span<const float> keys, std::span<const float> q_rows,
                                   int64_t n, int64_t g, int64_t head_dim, GroupReduce reduce) {
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  std::vector<double> logits(static_cast<size_t>(n));
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  for (int64_t i = 0; i < g; ++i) {
    const float* q = q_rows.data() + i * head_dim;
    double max_logit = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      const float* k = keys.data() + j * head_dim;
      float dot = 0;
      for (int64_t c = 0; c < head_dim; ++c) dot += q[c] * k[c];
      logits[j] = dot * scale;
      max_logit = std::max(max_logit, logits[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      logits[j] = std::exp(logits[j] - max_logit);
      sum += logits[j];
    }
    for (int64_t j = 0; j < n; ++j) {
      const double a = logits[j] / sum;
      out[j] = reduce == GroupReduce::kMax ? std::max(out[j], a) : out[j] + a / g;
    }
  }
  return out;
}

StatusOr<LayerDemandProfile> ComputeLayerDemand(const CalibrationSet& data,
                                                const LayerDemandOptions& o) {
  if (!(o.tau > 0 && o.tau <= 1)) return InvalidArgument("--tau: got ", o.tau, ", expected (0, 1]");
  if (o.queries < 1 || o.queries > 4096) {
    return InvalidArgument("--demand-queries: got ", o.queries, ", expected 1..4096");
  }
  if (data.empty() || data[0].empty()) {
    return InvalidArgument("data: got no sequence or no layer, expected at least one of each");
  }
  const int64_t layers = static_cast<int64_t>(data[0].size());
  const int64_t heads = data[0][0].k.heads, d = data[0][0].k.head_dim;
  KVCTL_ASSIGN_OR_RETURN(LayerDemandCalibrator calib,
                         LayerDemandCalibrator::Create(layers, o.tau, o.measure));
  std::vector<float> keys, q_rows;
  for (size_t s = 0; s < data.size(); ++s) {
    if (static_cast<int64_t>(data[s].size()) != layers) {
      return InvalidArgument("data[", s, "]: layers: got ", data[s].size(), ", expected ", layers);
    }
    for (int64_t l = 0; l < layers; ++l) {
      const CalibrationLayer& cl = data[s][static_cast<size_t>(l)];
      const std::string where = StrCat("data[", s, "][", l, "]");
      if (cl.q.data == nullptr) {
        return InvalidArgument(where, ".q: missing, expected queries for the layer demand");
      }
      KVCTL_RETURN_IF_ERROR(cl.k.Validate(where + ".k"));
      KVCTL_RETURN_IF_ERROR(cl.q.Validate(where + ".q"));
      if (cl.k.heads != heads || cl.k.head_dim != d) {
        return InvalidArgument(where, ".k: shape [", cl.k.tokens, ", ", cl.k.heads, ", ",
                               cl.k.head_dim, "], expected [*, ", heads, ", ", d, "]");
      }
      if (cl.q.tokens != cl.k.tokens || cl.q.head_dim != d || cl.q.heads % heads != 0) {
        return InvalidArgument(where, ".q: shape [", cl.q.tokens, ", ", cl.q.heads, ", ",
                               cl.q.head_dim, "], expected [", cl.k.tokens, ", a multiple of ",
                               heads, ", ", d, "]");
      }
      const int64_t t = cl.k.tokens, g = cl.q.heads / heads;
      const std::vector<int64_t> positions = DemandQueryPositions(t, o.queries);
      const int64_t n_max = positions.back() + 1;
      keys.resize(static_cast<size_t>(n_max * d));
      q_rows.resize(static_cast<size_t>(g * d));
      for (int64_t h = 0; h < heads; ++h) {
        for (int64_t j = 0; j < n_max; ++j) cl.k.LoadRow(j, h, &keys[j * d]);
        for (int64_t p : positions) {
          for (int64_t i = 0; i < g; ++i) cl.q.LoadRow(p, h * g + i, &q_rows[i * d]);
          const std::vector<double> a = GroupAttention(keys, q_rows, p + 1, g, d, o.reduce);
          Status added = calib.AddAttention(l, a);
          if (!added.ok()) return InvalidArgument(where, ": ", added.message());
        }
      }
    }
  }
  LayerDemandProfile out;
  out.layers = static_cast<int>(layers);
  out.kv_heads = static_cast<int>(heads);
  out.measure = o.measure;
  out.tau = o.tau;
  out.reduce = o.reduce;
  out.queries_per_sequence = o.queries;
  out.sequences = static_cast<int64_t>(data.size());
  KVCTL_ASSIGN_OR_RETURN(out.demand, calib.Demand());
  for (int64_t l = 0; l < layers; ++l) out.samples.push_back(calib.samples(l));
  return out;
}

std::string FormatCalibProfile(const CalibProfile& p) {
  std::ostringstream out;
  out << FormatRateQuantProfile(p.fit);
  if (!p.demand) return out.str();
  const LayerDemandProfile& d = *p.demand;
  out << "\n# ReasonAlloc-like layer demand (kvcalib): mean " << DemandMeasureName(d.measure)
      << " size in tokens per layer.\n"
      << "[reasonalloc]\n"
      << "version = " << kProfileVersion << "\n"
      << "layers = " << d.layers << "\n"
      << "kv_heads = " << d.kv_heads << "\n"
      << "measure = \"" << DemandMeasureName(d.measure) << "\"\n"
      << "tau = " << TomlDouble(d.tau) << "\n"
      << "group_reduce = \"" << GroupReduceName(d.reduce) << "\"\n"
      << "queries_per_sequence = " << d.queries_per_sequence << "\n"
      << "sequences = " << d.sequences << "\n"
      << "samples = " << TomlList(d.samples) << "\n"
      << "demand = " << TomlList(d.demand) << "\n";
  return out.str();
}

namespace {

Status CheckSameGeometry(const CalibProfile& profile, std::string_view name) {
  if (profile.demand && (profile.demand->layers != profile.fit.layers ||
                         profile.demand->kv_heads != profile.fit.kv_heads)) {
    return InvalidArgument(name, ": reasonalloc: layers ", profile.demand->layers, ", kv_heads ",
                           profile.demand->kv_heads, ", expected ", profile.fit.layers, " and ",
                           profile.fit.kv_heads, " as in [ratequant]");
  }
  return OkStatus();
}

// Splits `text` at a `[reasonalloc]` header line: the lines from it to the next line that starts
// with '[' go to `ra`, the rest to `rq`; each keeps the other's lines as empty lines, so parse
// errors keep their line numbers. False when there is no such header line.
bool SplitAtDemandTable(std::string_view text, std::string* rq, std::string* ra) {
  rq->clear();
  ra->clear();
  bool found = false, inside = false;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    end = end == std::string_view::npos ? text.size() : end + 1;
    const std::string_view line = text.substr(pos, end - pos);
    const size_t first = line.find_first_not_of(" \t");
    const std::string_view body =
        first == std::string_view::npos ? std::string_view() : line.substr(first);
    if (!body.empty() && body[0] == '[') {
      const size_t close = body.find(']');
      const std::string_view header = body.substr(0, close == body.npos ? body.size() : close + 1);
      inside = header == "[reasonalloc]" && !found;
      found |= inside;
    }
    (inside ? ra : rq)->append(line);
    (inside ? rq : ra)->push_back('\n');
    pos = end;
  }
  return found;
}

// The slow path for a [reasonalloc] written another way (dotted keys, an inline table): parse the
// whole file and hand the RateQuant reader its table re-serialised (toml++ prints doubles in
// shortest round-trip form, so nothing is lost).
StatusOr<CalibProfile> ParseWholeProfile(std::string_view text, std::string_view name) {
  KVCTL_ASSIGN_OR_RETURN(toml::table root, ParseTomlText(text, name));
  for (const auto& [key, node] : root) {
    if (key.str() != "ratequant" && key.str() != "reasonalloc") {
      return InvalidArgument(name, ": ", key.str(),
                             ": unknown key, expected [ratequant] and optionally [reasonalloc]");
    }
  }
  CalibProfile profile;
  if (const toml::node* ra = root.get("reasonalloc")) {
    if (!ra->is_table()) {
      return InvalidArgument(name, ": reasonalloc: got ", TypeName(*ra), ", expected a table");
    }
    StatusOr<LayerDemandProfile> d = ParseDemandTable(*ra->as_table());
    if (!d.ok()) return InvalidArgument(name, ": ", d.status().message());
    profile.demand = std::move(*d);
    root.erase("reasonalloc");
  }
  std::ostringstream rq;
  rq << toml::toml_formatter(root);
  KVCTL_ASSIGN_OR_RETURN(profile.fit, ParseRateQuantProfile(rq.str(), name));
  KVCTL_RETURN_IF_ERROR(CheckSameGeometry(profile, name));
  return profile;
}

}  // namespace

// The RateQuant reader refuses foreign root keys, so it must get the [ratequant] part alone. The
// usual file (ours) has a plain [reasonalloc] header: cut the text there and parse each part
// once, instead of a full parse plus a re-serialisation of the [ratequant] part (docs/kvcalib.md,
// "Timings").
StatusOr<CalibProfile> ParseCalibProfile(std::string_view text, std::string_view name) {
  std::string rq, ra;
  if (!SplitAtDemandTable(text, &rq, &ra)) {
    if (text.find("reasonalloc") != std::string_view::npos) return ParseWholeProfile(text, name);
    CalibProfile profile;
    KVCTL_ASSIGN_OR_RETURN(profile.fit, ParseRateQuantProfile(text, name));
    return profile;
  }
  KVCTL_ASSIGN_OR_RETURN(toml::table ra_root, ParseTomlText(ra, name));
  CalibProfile profile;
  StatusOr<LayerDemandProfile> d = ParseDemandTable(*ra_root.get_as<toml::table>("reasonalloc"));
  if (!d.ok()) return InvalidArgument(name, ": ", d.status().message());
  profile.demand = std::move(*d);
  KVCTL_ASSIGN_OR_RETURN(profile.fit, ParseRateQuantProfile(rq, name));
  KVCTL_RETURN_IF_ERROR(CheckSameGeometry(profile, name));
  return profile;
}

StatusOr<CalibProfile> ReadCalibProfile(const std::string& path) {
  KVCTL_ASSIGN_OR_RETURN(std::string text, ReadWholeFile(path, "the profile"));
  return ParseCalibProfile(text, path);
}

}  // namespace kvctl
