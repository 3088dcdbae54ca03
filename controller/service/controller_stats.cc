// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The STATS report: INFO-style sections of `field:value` lines. Per-entity lines follow Redis'
// keyspace style, `head_3_1:tokens=512,k_bits=2,...`. Names carry units and are never renamed
// once shipped (docs/stats.md lists them).
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <iomanip>
#include <map>
#include <sstream>
#include <vector>

#include "controller/sequence/eviction_driver.h"
#include "controller/service/controller.h"
#include "controller/service/controller_internal.h"
#include "ipc/protocol.h"

namespace kvctl {
namespace {

const char* const kSections[] = {"server", "pool", "sequences", "layers", "heads",
                                 "policy", "ipc",  "quality",   "tier",   "prefix"};

struct HeadTotals {
  int64_t tokens = 0;
  uint64_t elements = 0;
  uint64_t payload_bytes = 0;
  int k_bits = 16, v_bits = 16;
  uint64_t samples = 0;
  double k_err = 0, v_err = 0;
  int64_t budget = 0;
  uint64_t evicted = 0, evicted_bytes = 0, compressions = 0, requantized = 0;
  uint64_t width_lowerings = 0;
  uint64_t retained_samples = 0;
  double retained_sum = 0;
};

// Client names are the client's text: anything that could end a field, a line or a section of
// the INFO format (or a Prometheus label) becomes '_'.
std::string SafeName(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
                    c == '.' || c == '/' || c == '@';
    out += ok ? c : '_';
  }
  return out;
}

std::string Num(double x) {
  std::ostringstream out;
  out << std::setprecision(6) << x;
  return out.str();
}

std::string Bpe(uint64_t payload_bytes, uint64_t elements) {
  return Num(elements ? 8.0 * static_cast<double>(payload_bytes) / static_cast<double>(elements)
                      : 0.0);
}

// Mean attention mass the kept tokens held at the evictions measured; 1 with none measured.
double RetainedMass(const HeadTotals& t) {
  return t.retained_samples ? t.retained_sum / static_cast<double>(t.retained_samples) : 1.0;
}

// What one STATS sums over the open sequences: the totals, one line per sequence (up to the
// cap) and, when a section needs them, per-(layer, head) and per-layer totals.
struct SequenceSums {
  SequenceUsage total;
  uint64_t sequences = 0;
  uint64_t compression_warnings =
      0;  // Sequences whose settings cannot compress (budget_resolve.h).
  std::vector<std::string> sequence_lines;
  std::map<std::pair<int, int>, HeadTotals> heads;  // (layer, head) -> totals.
  std::map<int, int64_t> layer_budgets;             // Summed over open sequences.
};

// Who a sequence belongs to and how old it is, for its `seq_` line.
struct SequenceLabel {
  uint64_t session_number = 0, sequence_id = 0;
  std::string client_name;  // A copy: the session may end while STATS formats.
  int64_t age_s = 0;
};

// Adds one sequence to `sums`. REQUIRES: the sequence's lock is held.
void AddSequence(const KvSequence& seq, const SequenceLabel& label, const ipc::Geometry& geometry,
                 const CompressionOutlook& outlook, bool per_head, size_t max_lines,
                 SequenceSums* sums) {
  const SequenceUsage u = seq.Usage();
  ++sums->sequences;
  if (!outlook.warnings.empty()) ++sums->compression_warnings;
  SequenceUsage& total = sums->total;
  total.tokens += u.tokens;
  total.quantized_tokens += u.quantized_tokens;
  total.pool_bytes += u.pool_bytes;
  total.payload_bytes += u.payload_bytes;
  total.shared_bytes += u.shared_bytes;
  total.elements += u.elements;
  total.kept_tokens += u.kept_tokens;
  total.evicted_tokens += u.evicted_tokens;
  total.evicted_bytes += u.evicted_bytes;
  total.deferred_tokens += u.deferred_tokens;
  total.deferred_appends += u.deferred_appends;
  total.deferral_cap_hits += u.deferral_cap_hits;
  if (sums->sequence_lines.size() < max_lines) {
    std::ostringstream line;
    line << "seq_" << label.session_number << "_" << label.sequence_id
         << ":client=" << SafeName(label.client_name) << ",tokens=" << u.tokens
         << ",bytes=" << u.pool_bytes << ",payload_bytes=" << u.payload_bytes
         << ",shared_bytes=" << u.shared_bytes << ",evictions=" << u.evicted_tokens
         << ",age_s=" << label.age_s << ",kept_tokens=" << u.kept_tokens
         << ",evicted_bytes=" << u.evicted_bytes << ",pressure_reliefs=" << u.pressure_reliefs
         << ",pressure_cap_cuts=" << u.pressure_cap_cuts
         << ",lowered_for_others=" << u.lowered_for_others
         << ",deferred_tokens=" << u.deferred_tokens << ",deferred_appends=" << u.deferred_appends
         << ",deferral_cap_hits=" << u.deferral_cap_hits
         << ",quant_onset_tokens=" << outlook.onset_tokens << ",compression_warning="
         << (outlook.warnings.empty() ? "none" : outlook.warnings[0].cause);
    sums->sequence_lines.push_back(line.str());
  }
  if (!per_head) return;
  for (uint32_t l = 0; l < geometry.layers; ++l) {
    sums->layer_budgets[static_cast<int>(l)] += seq.LayerBudget(static_cast<int>(l));
    for (uint32_t h = 0; h < geometry.kv_heads; ++h) {
      const HeadUsage hu = seq.HeadUsageOf(static_cast<int>(l), static_cast<int>(h));
      HeadTotals& t = sums->heads[{static_cast<int>(l), static_cast<int>(h)}];
      t.tokens += hu.tokens;
      t.elements += hu.elements;
      t.payload_bytes += hu.payload_bytes;
      t.k_bits = hu.k_bits;
      t.v_bits = hu.v_bits;
      t.samples += hu.quality_samples;
      t.k_err += hu.k_rel_error_sum;
      t.v_err += hu.v_rel_error_sum;
      t.budget += hu.budget;
      t.evicted += hu.evicted_tokens;
      t.evicted_bytes += hu.evicted_bytes;
      t.compressions += hu.compressions;
      t.requantized += hu.requantized_tokens;
      t.width_lowerings += hu.width_lowerings;
      t.retained_samples += hu.retained_samples;
      t.retained_sum += hu.retained_mass_sum;
    }
  }
}

std::map<int, HeadTotals> SumLayers(const std::map<std::pair<int, int>, HeadTotals>& heads) {
  std::map<int, HeadTotals> layers;
  for (const auto& [key, t] : heads) {
    HeadTotals& l = layers[key.first];
    l.tokens += t.tokens;
    l.elements += t.elements;
    l.payload_bytes += t.payload_bytes;
    l.evicted += t.evicted;
    l.evicted_bytes += t.evicted_bytes;
    l.retained_samples += t.retained_samples;
    l.retained_sum += t.retained_sum;
  }
  return layers;
}

struct SessionCounts {
  uint64_t sessions = 0, expired = 0, ended = 0;
  uint64_t held_flush_layers = 0;  // Controller::RunHeldFlushes, daemon lifetime.
};

// frozen_bytes: pool bytes of the frozen prefixes alive (Controller::prefix_frozen_bytes_).
void WriteSequencesSection(const SequenceSums& sums, const SessionCounts& counts,
                           uint64_t frozen_bytes, std::ostream& out) {
  const SequenceUsage& total = sums.total;
  const double fp16_bytes = static_cast<double>(total.elements) * 2;
  const uint64_t reserved = total.pool_bytes + frozen_bytes;
  out << "# Sequences\n"
      << "sessions:" << counts.sessions << "\n"
      << "sessions_expired_total:" << counts.expired << "\n"
      << "sessions_ended_total:" << counts.ended << "\n"
      << "sequences:" << sums.sequences << "\n"
      << "tokens:" << total.tokens << "\n"
      << "tokens_quantized:" << total.quantized_tokens << "\n"
      << "tokens_kept:" << total.kept_tokens << "\n"
      << "tokens_evicted_total:" << total.evicted_tokens << "\n"
      << "evicted_bytes_total:" << total.evicted_bytes << "\n"
      << "tokens_deferred:" << total.deferred_tokens << "\n"
      << "appends_deferred_total:" << total.deferred_appends << "\n"
      << "deferral_cap_hits_total:" << total.deferral_cap_hits << "\n"
      << "held_flush_layers_total:" << counts.held_flush_layers << "\n"
      << "kv_payload_bytes:" << total.payload_bytes << "\n"
      << "kv_shared_bytes:" << total.shared_bytes << "\n"
      << "kv_pool_bytes:" << total.pool_bytes << "\n"
      << "kv_prefix_frozen_bytes:" << frozen_bytes << "\n"
      << "kv_fp16_equivalent_bytes:" << static_cast<uint64_t>(fp16_bytes) << "\n"
      << "bits_per_element:" << Bpe(total.payload_bytes, total.elements) << "\n"
      << "reserved_bits_per_element:" << Bpe(reserved, total.elements)
      << "\n"
      // Memory is what the pool reserves: whole pages, slack included, and the frozen prefixes
      // the sequences share pages with.
      << "compression_vs_fp16:" << Num(reserved ? fp16_bytes / static_cast<double>(reserved) : 0.0)
      << "\n"
      << "payload_compression_vs_fp16:"
      << Num(total.payload_bytes ? fp16_bytes / static_cast<double>(total.payload_bytes) : 0.0)
      << "\n";
  out << "sequences_compression_warning:" << sums.compression_warnings << "\n";
  out << "sequences_omitted:" << sums.sequences - sums.sequence_lines.size() << "\n";
  for (const std::string& line : sums.sequence_lines) out << line << "\n";
}

void WriteLayersSection(const std::map<int, HeadTotals>& layers,
                        const std::map<int, int64_t>& layer_budgets, size_t max_lines,
                        std::ostream& out) {
  out << "# Layers\n"
      << "layers:" << layers.size() << "\n"
      << "layers_omitted:" << layers.size() - std::min(layers.size(), max_lines) << "\n";
  size_t shown = 0;
  for (const auto& [l, entry] : layers) {
    if (shown++ == max_lines) break;
    const auto budget = layer_budgets.find(l);
    out << "layer_" << l << ":tokens=" << entry.tokens << ",bytes=" << entry.payload_bytes
        << ",bits_per_element=" << Bpe(entry.payload_bytes, entry.elements)
        << ",budget_tokens=" << (budget == layer_budgets.end() ? 0 : budget->second)
        << ",evictions=" << entry.evicted << ",evicted_bytes=" << entry.evicted_bytes
        << ",retained_mass=" << Num(RetainedMass(entry)) << "\n";
  }
}

void WriteHeadsSection(const std::map<std::pair<int, int>, HeadTotals>& heads, size_t max_lines,
                       std::ostream& out) {
  out << "# Heads\n"
      << "heads:" << heads.size() << "\n"
      << "heads_omitted:" << heads.size() - std::min(heads.size(), max_lines) << "\n";
  size_t shown = 0;
  for (const auto& [key, t] : heads) {
    if (shown++ == max_lines) break;
    out << "head_" << key.first << "_" << key.second << ":tokens=" << t.tokens
        << ",k_bits=" << t.k_bits << ",v_bits=" << t.v_bits
        << ",bits_per_element=" << Bpe(t.payload_bytes, t.elements)
        << ",k_rel_error=" << Num(t.samples ? t.k_err / static_cast<double>(t.samples) : 0)
        << ",v_rel_error=" << Num(t.samples ? t.v_err / static_cast<double>(t.samples) : 0)
        << ",quality_samples=" << t.samples << ",budget_tokens=" << t.budget
        << ",evictions=" << t.evicted << ",evicted_bytes=" << t.evicted_bytes
        << ",compressions=" << t.compressions << ",requantized=" << t.requantized
        << ",width_lowerings=" << t.width_lowerings << ",retained_mass=" << Num(RetainedMass(t))
        << ",retained_samples=" << t.retained_samples << "\n";
  }
}

void WritePolicySection(const Config& config, std::ostream& out) {
  const QuantSettings& q = config.quant;
  const bool evicting =
      config.budget.mode == BudgetMode::kEvictOnly || config.budget.mode == BudgetMode::kJoint;
  out << "# Policy\n"
      << "quant_method:" << (q.lossless ? "none" : QuantMethodName(q.method)) << "\n"
      << "quant_k_bits:" << q.k_bits << "\n"
      << "quant_v_bits:" << q.v_bits << "\n"
      << "quant_lossless:" << (q.lossless ? 1 : 0) << "\n"
      << "budget_mode:"
      << FindConfigOption("budget.mode")->names[static_cast<int>(config.budget.mode)] << "\n"
      << "evict_policy:" << (evicting ? EvictPolicyName(config.evict.policy) : "none") << "\n"
      << "budget_pressure:"
      << FindConfigOption("budget.pressure")->names[static_cast<int>(config.budget.pressure)]
      << "\n";
}

void WriteIpcSection(const std::function<ipc::ServerCounters()>& server_counters,
                     const ServerStats& stats, const HelperThread::Counters& helper,
                     const HelperThread::Counters& prepare_helper, std::ostream& out) {
  out << "# Ipc\n";
  if (server_counters) {
    const ipc::ServerCounters c = server_counters();
    out << "requests_total:" << c.requests_total << "\n"
        << "rejected_total:" << c.rejected_total << "\n"
        << "errors_total:" << c.errors_total << "\n"
        << "replies_total:" << c.replies_total << "\n"
        << "replies_dropped_total:" << c.replies_dropped_total << "\n"
        << "bytes_in_total:" << c.bytes_in_total << "\n"
        << "bytes_out_total:" << c.bytes_out_total << "\n"
        << "in_flight:" << c.in_flight << "\n";
  }
  out << "fetch_helper_parts_total:" << helper.helper_parts << "\n"
      << "fetch_helper_busy_total:" << helper.jobs_alone << "\n"
      << "prepare_helper_parts_total:" << prepare_helper.helper_parts << "\n"
      << "prepare_helper_busy_total:" << prepare_helper.jobs_alone << "\n";
  for (const RequestTypeStats& s : stats.Snapshot()) {
    out << s.name << "_requests_total:" << s.requests_total << "\n"
        << s.name << "_errors_total:" << s.errors_total << "\n"
        << s.name << "_latency_p50_us:" << s.latency_p50_us << "\n"
        << s.name << "_latency_p99_us:" << s.latency_p99_us << "\n"
        << s.name << "_latency_max_us:" << s.latency_max_us << "\n";
  }
}

// Quality over every head of the open sequences plus the freed sequences' lifetime totals.
void WriteQualitySection(const std::map<std::pair<int, int>, HeadTotals>& heads,
                         const HeadUsage& retired, int64_t sample_period, std::ostream& out) {
  uint64_t samples = retired.quality_samples;
  double k_err = retired.k_rel_error_sum, v_err = retired.v_rel_error_sum;
  for (const auto& [key, t] : heads) {
    samples += t.samples;
    k_err += t.k_err;
    v_err += t.v_err;
  }
  out << "# Quality\n"
      << "quality_sample_period:" << sample_period << "\n"
      << "quality_samples_total:" << samples << "\n"
      << "quality_k_rel_error_mean:" << Num(samples ? k_err / static_cast<double>(samples) : 0)
      << "\n"
      << "quality_v_rel_error_mean:" << Num(samples ? v_err / static_cast<double>(samples) : 0)
      << "\n";
}

// The caps keep the text far below the reply limit (1000 lines of each kind, names of at most
// 256 bytes); should that ever fail, whole lines are dropped rather than the reply.
void CapStatsText(std::string* text) {
  if (text->size() <= ipc::kMaxStatsTextBytes) return;
  const size_t cut = text->rfind('\n', ipc::kMaxStatsTextBytes - 64);
  const size_t dropped = text->size() - (cut + 1);
  text->resize(cut + 1);
  *text += "stats_truncated_bytes:" + std::to_string(dropped) + "\n";
}

// The cluster tier (docs/stats.md "# Tier"); tier_enabled:0 and nothing else without one.
void WriteTierSection(const TierService* tier, std::ostream& out) {
  out << "# Tier\n"
      << "tier_enabled:" << (tier != nullptr) << "\n";
  if (tier == nullptr) return;
  const TierCounters c = tier->counters();
  out << "tier_connected:" << c.connected << "\n"
      << "tier_spilled_sequences:" << c.spilled_sequences << "\n"
      << "tier_spilled_bytes:" << c.spilled_bytes << "\n"
      << "tier_quota_bytes:" << tier->config().quota_bytes << "\n"
      << "tier_spills_total:" << c.spills << "\n"
      << "tier_spill_failures_total:" << c.spill_failures << "\n"
      << "tier_spills_over_quota_total:" << c.spills_over_quota << "\n"
      << "tier_spills_refused_total:" << c.spills_refused << "\n"
      << "tier_restores_total:" << c.restores << "\n"
      << "tier_restore_failures_total:" << c.restore_failures << "\n"
      << "tier_spilled_lost_total:" << c.spilled_lost << "\n"
      << "tier_spill_us_total:" << c.spill_us_total << "\n"
      << "tier_restore_us_total:" << c.restore_us_total << "\n"
      << "tier_prefix_saves_total:" << c.prefix_saves << "\n"
      << "tier_prefix_save_failures_total:" << c.prefix_save_failures << "\n"
      << "tier_prefix_saved_bytes_total:" << c.prefix_saved_bytes << "\n"
      << "tier_prefix_saves_over_quota_total:" << c.prefix_saves_over_quota << "\n"
      << "tier_prefix_held_bytes:" << c.prefix_held_bytes << "\n"
      << "tier_prefix_quota_bytes:" << tier->config().prefix_quota_bytes << "\n"
      << "tier_prefix_lookups_total:" << c.prefix_lookups << "\n"
      << "tier_prefix_hits_total:" << c.prefix_hits << "\n"
      << "tier_prefix_misses_total:" << c.prefix_misses << "\n"
      << "tier_prefix_lookup_failures_total:" << c.prefix_lookup_failures << "\n"
      << "tier_prefix_restored_tokens_total:" << c.prefix_restored_tokens << "\n"
      << "tier_deletes_pending:" << c.deletes_pending << "\n"
      << "tier_delete_failures_total:" << c.delete_failures << "\n"
      << "tier_commands_total:" << c.commands_total << "\n"
      << "tier_command_errors_total:" << c.errors_total << "\n"
      << "tier_moved_total:" << c.moved_total << "\n"
      << "tier_ask_total:" << c.ask_total << "\n"
      << "tier_reconnects_total:" << c.reconnects_total << "\n"
      << "tier_bytes_written_total:" << c.bytes_written_total << "\n"
      << "tier_bytes_read_total:" << c.bytes_read_total << "\n";
}

// The local prefix cache (docs/stats.md "prefix"); prefix_cache_enabled:0 and nothing
// else without one.
void WritePrefixSection(const PrefixCache* cache, uint64_t frozen_bytes, std::ostream& out) {
  out << "# Prefix\n"
      << "prefix_cache_enabled:" << (cache != nullptr) << "\n";
  if (cache == nullptr) return;
  const PrefixCacheCounters c = cache->counters();
  out << "prefix_cache_entries:" << c.entries << "\n"
      << "prefix_cache_read_entries:" << c.read_entries << "\n"
      << "prefix_cache_held_bytes:" << c.held_bytes << "\n"
      << "prefix_cache_max_bytes:" << cache->max_bytes() << "\n"
      << "prefix_cache_frozen_bytes:" << frozen_bytes << "\n"
      << "prefix_cache_inserts_total:" << c.inserts << "\n"
      << "prefix_cache_inserts_refused_total:" << c.inserts_refused << "\n"
      << "prefix_cache_lookups_total:" << c.lookups << "\n"
      << "prefix_cache_hits_total:" << c.hits << "\n"
      << "prefix_cache_hit_tokens_total:" << c.hit_tokens << "\n"
      << "prefix_cache_dropped_total:" << c.dropped << "\n"
      << "prefix_cache_shed_pages_total:" << c.shed_pages << "\n"
      << "prefix_cache_lost_total:" << c.lost << "\n";
}

}  // namespace

void Controller::SetServerInfo(std::string endpoint,
                               std::function<ipc::ServerCounters()> counters) {
  endpoint_ = std::move(endpoint);
  server_counters_ = std::move(counters);
}

void Controller::SetHttpAddress(std::string bound_address) {
  MutexLock lock(&http_address_mu_);
  http_address_ = std::move(bound_address);
}

StatusOr<std::string> Controller::Stats(const ipc::StatsRequest& request, SteadyTime now) {
  std::string want = request.section;
  std::transform(want.begin(), want.end(), want.begin(), ::tolower);
  // "config" is never part of the full report: only a request for it gets the effective config
  // (kvctl --dump-stats), so the PUB stream, /metrics and kvtop see the same text as before.
  const bool config_only = want == "config";
  if (!want.empty() && !config_only &&
      std::find(std::begin(kSections), std::end(kSections), want) == std::end(kSections)) {
    return InvalidArgument("section: got \"", request.section,
                           "\", expected empty or one of server, pool, sequences, layers, heads, "
                           "policy, ipc, quality, tier, config");
  }
  auto show = [&](const char* s) { return want.empty() || want == s; };

  // Under mu_ only the list of open sequences is copied; each sequence is then read under its own
  // lock (one at a time, never with mu_ held) and the text is formatted with no lock at all, so
  // a STATS of a big daemon never stalls other clients' requests.
  struct SequenceRef {
    SequenceLabel label;
    ipc::Geometry geometry;
    std::shared_ptr<SequenceEntry> entry;
  };
  SessionCounts counts;
  std::vector<SequenceRef> refs;
  Config config;
  {
    MutexLock lock(&mu_);
    if (request.session_id != 0) {
      KVCTL_RETURN_IF_ERROR(FindSessionLocked(request.session_id, now).status());
    }
    config = config_;
    counts = {sessions_.size(), sessions_expired_, sessions_ended_, held_flush_layers_.load()};
    for (auto& [sid, session] : sessions_) {
      for (auto& [qid, entry] : session->sequences) {
        if (!config_only) {
          refs.push_back(
              {{session->number, qid, session->client_name, 0}, session->geometry, entry});
        }
      }
    }
  }
  // A loadable TOML document: the header is a comment, each value names its source.
  if (config_only) return "# Config\n" + PrintConfig(config);
  const size_t max_lines = static_cast<size_t>(config.limits.stats_max_lines);
  const bool per_head = show("layers") || show("heads") || show("quality");
  SequenceSums sums;
  for (SequenceRef& ref : refs) {
    MutexLock seq_lock(&ref.entry->mu);
    if (!ref.entry->seq) continue;
    ref.label.age_s =
        std::chrono::duration_cast<std::chrono::seconds>(now - ref.entry->opened).count();
    AddSequence(*ref.entry->seq, ref.label, ref.geometry, ref.entry->outlook, per_head, max_lines,
                &sums);
  }

  std::ostringstream out;
  if (show("server")) WriteServerSection(config, now, out);
  if (show("pool")) WritePoolSection(out);
  if (show("sequences")) WriteSequencesSection(sums, counts, prefix_frozen_bytes_.load(), out);
  if (show("layers")) WriteLayersSection(SumLayers(sums.heads), sums.layer_budgets, max_lines, out);
  if (show("heads")) WriteHeadsSection(sums.heads, max_lines, out);
  if (show("policy")) WritePolicySection(config, out);
  if (show("ipc"))
    WriteIpcSection(server_counters_, stats_, fetch_helper_.counters(), prepare_helper_.counters(),
                    out);
  if (show("quality")) {
    HeadUsage retired;
    {
      MutexLock lock(&retired_mu_);
      retired = retired_quality_;
    }
    WriteQualitySection(sums.heads, retired, config.server.quality_sample_period, out);
  }
  if (show("tier")) WriteTierSection(tier_.get(), out);
  if (show("prefix")) WritePrefixSection(prefix_cache_.get(), prefix_frozen_bytes_.load(), out);
  std::string text = out.str();
  CapStatsText(&text);
  return text;
}

void Controller::WriteServerSection(const Config& config, SteadyTime now, std::ostream& out) const {
  std::string http_address;
  {
    MutexLock lock(&http_address_mu_);
    http_address = http_address_;
  }
  out << "# Server\n"
      << "kvctl_version:" << kKvctlVersion << "\n"
      << "protocol_version:" << ipc::kProtocolVersion << "\n"
      << "pid:" << getpid() << "\n"
      << "uptime_s:" << std::chrono::duration_cast<std::chrono::seconds>(now - started_).count()
      << "\n"
      << "endpoint:" << endpoint_ << "\n"
      << "stats_endpoint:" << config.server.stats_endpoint << "\n"
      << "http_address:" << http_address << "\n";
}

void Controller::WritePoolSection(std::ostream& out) const {
  const PoolStats p = pool_stats();
  out << "# Pool\n"
      << "pool_backend:" << (pool_->arena().cuda_device() >= 0 ? "cuda" : "cpu") << "\n"
      << "pool_shm_name:" << shm_name_ << "\n"
      << "pool_cuda_device:" << pool_->arena().cuda_device() << "\n"
      << "pool_bytes:" << p.arena_bytes << "\n"
      << "page_bytes:" << p.page_bytes << "\n"
      << "pages:" << p.pages_total << "\n"
      << "pages_used:" << p.pages_used << "\n"
      << "pages_high_water:" << p.pages_high_water << "\n"
      << "bytes_used:" << p.bytes_used << "\n"
      << "bytes_free:" << p.bytes_free << "\n"
      << "bytes_high_water:" << p.bytes_high_water << "\n"
      << "staging_slots:" << p.staging_slots_total << "\n"
      << "staging_slots_used:" << p.staging_slots_used << "\n"
      << "staging_bytes:" << p.staging_bytes_total << "\n"
      << "alloc_failures_total:" << p.alloc_failures_total << "\n"
      << "host_memory_used_bytes:" << host_memory_.used() << "\n"
      << "host_memory_limit_bytes:" << host_memory_.limit() << "\n"
      << "publish_ranges_total:" << p.publish_ranges_total << "\n"
      << "publish_bytes_total:" << p.publish_bytes_total << "\n"
      << "checksums:" << (pool_->checksums() ? 1 : 0) << "\n"
      << "checksum_failures_total:" << p.checksum_failures_total << "\n"
      << "verified_bytes_total:" << p.verified_bytes_total << "\n"
      << "sealed_bytes_total:" << p.sealed_bytes_total << "\n"
      << "scrubbed_bytes_total:" << p.scrubbed_bytes_total << "\n";
}

}  // namespace kvctl
