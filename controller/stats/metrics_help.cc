// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The `# HELP` sentence of every Prometheus family the STATS text renders to: what it counts and
// in which unit, as docs/stats.md defines the field. A field without a sentence here renders with
// a bare placeholder, which the tests refuse (tests/controller/service, tests/observability).
#include <array>
#include <string>
#include <string_view>

#include "controller/stats/metrics.h"

namespace kvctl {
namespace {

struct Help {
  std::string_view family;
  std::string_view text;
};

constexpr Help kHelp[] = {
    // # Server
    {"kvctl_protocol_version", "Wire protocol version the daemon speaks (ipc/PROTOCOL.md)."},
    {"kvctl_pid", "Process id of the daemon; a new value means the daemon restarted."},
    {"kvctl_uptime_s", "Seconds since the daemon started, in whole seconds."},
    {"kvctl_server_info",
     "Always 1; the labels carry the daemon version and its request, stats and HTTP endpoints."},
    // # Pool
    {"kvctl_pool_cuda_device", "CUDA device ordinal of a cuda pool, or -1 for a cpu pool."},
    {"kvctl_pool_bytes", "Bytes of the pool object the daemon reserved at startup."},
    {"kvctl_page_bytes", "Bytes in one pool page, the allocation unit (pool.page_bytes)."},
    {"kvctl_pages", "Pages in the pool's page area, staging slots excluded."},
    {"kvctl_pages_used", "Pool pages allocated to sequences now, in pages."},
    {"kvctl_pages_high_water", "Most pool pages allocated at once since the daemon started."},
    {"kvctl_bytes_used", "Bytes of the pool pages allocated now (pages_used times page_bytes)."},
    {"kvctl_bytes_free", "Bytes of the pool pages free now."},
    {"kvctl_bytes_high_water", "Most bytes of pool pages allocated at once since start."},
    {"kvctl_staging_slots", "Staging slots sessions can hold for APPEND input, in slots."},
    {"kvctl_staging_slots_used", "Staging slots held by sessions now, in slots."},
    {"kvctl_staging_bytes", "Bytes of all staging slots together."},
    {"kvctl_alloc_failures_total",
     "Allocations of pages or staging slots refused for lack of pool space since start."},
    {"kvctl_host_memory_used_bytes",
     "Bytes of host memory outside the pool charged to sessions and sequences now."},
    {"kvctl_host_memory_limit_bytes",
     "Bytes of host memory sessions and sequences may use (limits.host_memory_bytes)."},
    {"kvctl_publish_ranges_total",
     "Changed byte ranges a cuda pool copied to the device since start, in ranges."},
    {"kvctl_publish_bytes_total", "Bytes a cuda pool copied to the device since start."},
    {"kvctl_checksums", "1 when page checksums are on (pool.checksums), else 0."},
    {"kvctl_checksum_failures_total",
     "Pool pages found changed behind the daemon's back since start, in pages."},
    {"kvctl_verified_bytes_total",
     "Page bytes checksummed to verify FETCH replies and rewrites since start."},
    {"kvctl_sealed_bytes_total", "Page bytes checksummed to seal what requests wrote since start."},
    {"kvctl_scrubbed_bytes_total", "Page bytes the background scrubber verified since start."},
    {"kvctl_pool_info", "Always 1; the labels carry the pool backend and its shm name."},
    // # Sequences
    {"kvctl_sessions", "Live client sessions now (HELLO done, not ended or expired)."},
    {"kvctl_sessions_expired_total",
     "Sessions freed because their lease ran out since start, in sessions."},
    {"kvctl_sessions_ended_total", "Sessions ended by their client's BYE since start."},
    {"kvctl_sequences", "Open sequences now, over all sessions."},
    {"kvctl_sequences_omitted", "Open sequences without a per-sequence series (over the cap)."},
    {"kvctl_sequences_compression_warning",
     "Open sequences whose settings cannot compress to what they are asked to (see the log)."},
    {"kvctl_tokens", "Tokens appended to the open sequences, each counted once, in tokens."},
    {"kvctl_tokens_quantized", "Tokens of the open sequences held in quantized records."},
    {"kvctl_tokens_kept",
     "Token rows the open sequences hold now, summed over every layer and KV head."},
    {"kvctl_tokens_evicted_total",
     "Token rows evicted from the open sequences, summed over layers and KV heads."},
    {"kvctl_evicted_bytes_total", "Payload bytes the evicted tokens of open sequences held."},
    {"kvctl_tokens_deferred",
     "Tokens of unfinished APPEND_CONTINUES prefills, stored and not yet evicted, in tokens."},
    {"kvctl_appends_deferred_total",
     "APPENDs of the open sequences that deferred their eviction (APPEND_CONTINUES)."},
    {"kvctl_deferral_cap_hits_total",
     "Flagged APPENDs past evict.max_deferred_tokens that evicted as if unflagged."},
    {"kvctl_held_flush_layers_total",
     "Layers of held flushes encoded on a worker after an APPEND's reply."},
    {"kvctl_kv_payload_bytes", "Bytes of stored K/V payload (records and fp16 rows), no slack."},
    {"kvctl_kv_shared_bytes",
     "Of the payload, bytes the open sequences read from frozen prefix pages they share."},
    {"kvctl_kv_pool_bytes", "Bytes of pool pages the open sequences take, page slack included."},
    {"kvctl_kv_prefix_frozen_bytes",
     "Bytes of pool pages the frozen prefixes alive take (cached or read by sequences)."},
    {"kvctl_kv_fp16_equivalent_bytes", "Bytes the kept K/V elements would take in fp16."},
    {"kvctl_bits_per_element", "Average stored bits per K or V element, metadata included."},
    {"kvctl_reserved_bits_per_element",
     "Average pool bits reserved per stored K or V element, page slack included."},
    {"kvctl_compression_vs_fp16",
     "Ratio of fp16-equivalent bytes to the pool bytes the open sequences reserve."},
    {"kvctl_payload_compression_vs_fp16",
     "Ratio of fp16-equivalent bytes to stored payload bytes, page slack excluded."},
    {"kvctl_sequence_tokens", "Tokens appended to this open sequence, in tokens."},
    {"kvctl_sequence_bytes", "Bytes of pool pages this open sequence reserves."},
    {"kvctl_sequence_payload_bytes",
     "Bytes of records and rows this open sequence stores, page slack excluded."},
    {"kvctl_sequence_shared_bytes",
     "Of this sequence's payload, bytes it reads from frozen prefix pages it shares."},
    {"kvctl_sequence_evictions", "Token rows evicted from this sequence, over layers and heads."},
    {"kvctl_sequence_age_s", "Seconds since this sequence was opened."},
    {"kvctl_sequence_kept_tokens", "Token rows this sequence holds, over layers and KV heads."},
    {"kvctl_sequence_evicted_bytes", "Payload bytes the tokens evicted from this sequence held."},
    {"kvctl_sequence_pressure_reliefs",
     "Times a full pool was relieved for this sequence's APPENDs, in reliefs."},
    {"kvctl_sequence_pressure_cap_cuts",
     "Pressure reliefs of this sequence that cut token caps instead of widths."},
    {"kvctl_sequence_lowered_for_others",
     "Times this sequence's widths were lowered for another sequence's APPEND."},
    {"kvctl_sequence_deferred_tokens",
     "Tokens of this sequence's unfinished APPEND_CONTINUES prefill, not yet evicted."},
    {"kvctl_sequence_deferred_appends",
     "APPENDs of this sequence that deferred their eviction (APPEND_CONTINUES)."},
    {"kvctl_sequence_deferral_cap_hits",
     "Flagged APPENDs of this sequence past evict.max_deferred_tokens, evicted as unflagged."},
    {"kvctl_sequence_quant_onset_tokens",
     "Tokens this sequence must reach before a row is quantized; 0 none asked, -1 never."},
    // # Layers
    {"kvctl_layers", "Layers of any open sequence, in layers."},
    {"kvctl_layers_omitted", "Layers without a per-layer series (over the cap)."},
    {"kvctl_layer_tokens", "Tokens kept in this layer, summed over its KV heads and sequences."},
    {"kvctl_layer_bytes", "Payload bytes stored for this layer over all open sequences."},
    {"kvctl_layer_bits_per_element", "Average stored bits per K or V element of this layer."},
    {"kvctl_layer_budget_tokens", "Token budget of this layer over its heads; 0 = no eviction."},
    {"kvctl_layer_evictions", "Token rows evicted from this layer, in token rows."},
    {"kvctl_layer_evicted_bytes", "Payload bytes the tokens evicted from this layer held."},
    {"kvctl_layer_retained_mass",
     "Mean attention mass the kept tokens of this layer held at evictions, from 0 to 1."},
    // # Heads
    {"kvctl_heads", "Pairs of layer and KV head of any open sequence, in pairs."},
    {"kvctl_heads_omitted", "Layer and head pairs without a per-head series (over the cap)."},
    {"kvctl_head_tokens", "Tokens kept for this KV head over all open sequences."},
    {"kvctl_head_k_bits", "Code width of this head's K records, in bits."},
    {"kvctl_head_v_bits", "Code width of this head's V records, in bits."},
    {"kvctl_head_bits_per_element", "Average stored bits per K or V element of this head."},
    {"kvctl_head_k_rel_error",
     "Mean sampled relative squared error of this head's decoded K records, a ratio."},
    {"kvctl_head_v_rel_error",
     "Mean sampled relative squared error of this head's decoded V records, a ratio."},
    {"kvctl_head_quality_samples", "Decoded records behind this head's error means, in samples."},
    {"kvctl_head_budget_tokens", "Token cap of this head after the last append; 0 = no cap."},
    {"kvctl_head_evictions", "Token rows evicted from this head, in token rows."},
    {"kvctl_head_evicted_bytes", "Payload bytes the tokens evicted from this head held."},
    {"kvctl_head_compressions", "Appends that evicted tokens from this head, in appends."},
    {"kvctl_head_requantized", "Kept tokens of this head decoded and quantized again."},
    {"kvctl_head_width_lowerings", "Times pool pressure lowered this head's code widths."},
    {"kvctl_head_retained_mass",
     "Mean attention mass the kept tokens of this head held at evictions, from 0 to 1."},
    {"kvctl_head_retained_samples", "Evictions of this head behind its retained mass mean."},
    // # Policy
    {"kvctl_quant_k_bits", "K code width new sequences get from [quant], in bits."},
    {"kvctl_quant_v_bits", "V code width new sequences get from [quant], in bits."},
    {"kvctl_quant_lossless", "1 when new sequences are stored without compression, else 0."},
    {"kvctl_policy_info",
     "Always 1; the labels carry the quantizer, budget mode, eviction policy and pressure policy."},
    // # Ipc
    {"kvctl_requests_total", "Well-formed requests handed to the controller since start."},
    {"kvctl_rejected_total", "Requests the transport answered with ERROR itself since start."},
    {"kvctl_errors_total", "ERROR replies sent by the transport or the controller since start."},
    {"kvctl_replies_total", "Replies sent since start, in replies."},
    {"kvctl_replies_dropped_total", "Replies ZeroMQ refused to queue since start, in replies."},
    {"kvctl_bytes_in_total", "Bytes of request frames received since start."},
    {"kvctl_bytes_out_total", "Bytes of reply frames sent since start."},
    {"kvctl_in_flight", "Requests handed to the controller and not yet answered now."},
    {"kvctl_fetch_helper_parts_total",
     "Parts of large dense FETCHes decoded by the fetch helper thread "
     "(server.dense_fetch_split_rows)."},
    {"kvctl_fetch_helper_busy_total",
     "Large dense FETCHes that decoded alone because the fetch helper was busy."},
    {"kvctl_prepare_helper_parts_total",
     "Layers of large APPENDs prepared by the prepare helper thread "
     "(server.prepare_split_tokens)."},
    {"kvctl_prepare_helper_busy_total",
     "Large APPENDs that prepared their layers alone because the prepare helper was busy."},
    // # Quality
    {"kvctl_quality_sample_period",
     "Every this many quantized records per head one is decoded and checked; 0 = off."},
    {"kvctl_quality_samples_total", "Records decoded to measure their error since start."},
    {"kvctl_quality_k_rel_error_mean",
     "Mean relative squared error of all sampled K records since start, a ratio."},
    {"kvctl_quality_v_rel_error_mean",
     "Mean relative squared error of all sampled V records since start, a ratio."},
    {"kvctl_stats_truncated_bytes", "Bytes of STATS lines dropped to fit one reply."},
    // # Tier
    {"kvctl_tier_enabled", "1 when the daemon has a cluster tier (tier.nodes set), else 0."},
    {"kvctl_tier_connected", "1 once the daemon has reached the cluster, else 0."},
    {"kvctl_tier_spilled_sequences", "Sequences held in the tier now instead of the pool."},
    {"kvctl_tier_spilled_bytes", "Bytes of spilled sequences' images held in the tier now."},
    {"kvctl_tier_quota_bytes",
     "Most bytes of spilled sequences the daemon keeps in the tier (tier.quota_bytes)."},
    {"kvctl_tier_spills_total", "Sequences spilled to the tier since start."},
    {"kvctl_tier_spill_failures_total",
     "Spills that failed since start; the sequences stayed in the pool."},
    {"kvctl_tier_spills_over_quota_total",
     "Spills refused since start because they would pass tier.quota_bytes."},
    {"kvctl_tier_spills_refused_total",
     "Sequences since start whose image cannot be exported; they stay in the pool."},
    {"kvctl_tier_restores_total", "Spilled sequences restored into the pool since start."},
    {"kvctl_tier_restore_failures_total", "Restores of spilled sequences that failed since start."},
    {"kvctl_tier_spilled_lost_total", "Spilled sequences the tier lost since start."},
    {"kvctl_tier_spill_us_total", "Wall time of successful spills since start, in microseconds."},
    {"kvctl_tier_restore_us_total",
     "Wall time of successful restores since start, in microseconds."},
    {"kvctl_tier_prefix_saves_total", "Prefixes stored by SAVE_PREFIX since start."},
    {"kvctl_tier_prefix_save_failures_total",
     "SAVE_PREFIX writes the cluster refused or did not answer since start."},
    {"kvctl_tier_prefix_saved_bytes_total", "Bytes of prefixes stored since start."},
    {"kvctl_tier_prefix_saves_over_quota_total",
     "SAVE_PREFIX calls refused since start because they would pass tier.prefix_quota_bytes."},
    {"kvctl_tier_prefix_held_bytes",
     "Bytes of prefixes this daemon saved whose TTL has not run out, now."},
    {"kvctl_tier_prefix_quota_bytes",
     "Most bytes of unexpired saved prefixes the daemon keeps (tier.prefix_quota_bytes)."},
    {"kvctl_tier_prefix_lookups_total", "OPEN_PREFIX lookups since start."},
    {"kvctl_tier_prefix_hits_total",
     "OPEN_PREFIX lookups that restored a stored prefix since start."},
    {"kvctl_tier_prefix_misses_total",
     "OPEN_PREFIX lookups that opened the sequence empty since start."},
    {"kvctl_tier_prefix_lookup_failures_total",
     "OPEN_PREFIX lookups that met a tier error or a bad stored prefix since start."},
    {"kvctl_tier_prefix_restored_tokens_total",
     "Tokens restored from stored prefixes since start."},
    {"kvctl_tier_deletes_pending", "Tier keys queued for deletion now."},
    {"kvctl_tier_delete_failures_total", "Tier key deletions that failed since start."},
    {"kvctl_tier_commands_total", "Redis commands sent to the cluster since start."},
    {"kvctl_tier_command_errors_total", "Redis commands that failed since start."},
    {"kvctl_tier_moved_total", "MOVED redirects followed since start."},
    {"kvctl_tier_ask_total", "ASK redirects followed since start."},
    {"kvctl_tier_reconnects_total", "Reconnections to cluster nodes since start."},
    {"kvctl_tier_bytes_written_total", "Value bytes written to the cluster since start."},
    {"kvctl_tier_bytes_read_total", "Value bytes read from the cluster since start."},
    // # Prefix cache
    {"kvctl_prefix_cache_enabled",
     "1 when the daemon keeps prefixes in its pool (tier.local_prefix_fraction > 0), else 0."},
    {"kvctl_prefix_cache_entries", "Prefixes the local cache holds now."},
    {"kvctl_prefix_cache_read_entries", "Of those, prefixes some open sequence reads now."},
    {"kvctl_prefix_cache_held_bytes", "Bytes of pool pages the cached prefixes take now."},
    {"kvctl_prefix_cache_max_bytes",
     "Most bytes of pool pages the cache may hold (tier.local_prefix_fraction of the pool)."},
    {"kvctl_prefix_cache_frozen_bytes",
     "Bytes of pool pages of every frozen prefix alive, cached or only read by sequences."},
    {"kvctl_prefix_cache_inserts_total", "Prefixes the cache took since start."},
    {"kvctl_prefix_cache_inserts_refused_total",
     "Prefixes the cache could not make room for since start."},
    {"kvctl_prefix_cache_lookups_total", "OPEN_PREFIX lookups in the cache since start."},
    {"kvctl_prefix_cache_hits_total",
     "OPEN_PREFIX calls that opened a sequence from a cached prefix since start."},
    {"kvctl_prefix_cache_hit_tokens_total", "Tokens of the cached prefixes opened since start."},
    {"kvctl_prefix_cache_dropped_total",
     "Cached prefixes dropped since start to make room or under pool pressure."},
    {"kvctl_prefix_cache_shed_pages_total",
     "Pool pages freed since start by dropping cached prefixes under pool pressure."},
    {"kvctl_prefix_cache_lost_total",
     "Cached prefixes found changed behind the daemon's back since start (dropped)."},
};

// The request types of the per-type families, as the ipc section names them.
constexpr std::array<std::string_view, 9> kRequestTypes = {
    "hello", "open", "close", "ping", "append", "fetch", "stats", "bye", "other"};

struct TypeHelp {
  std::string_view suffix;
  std::string_view text;  // Follows "<TYPE> ".
};
constexpr TypeHelp kTypeHelp[] = {
    {"_requests_total", "requests handled by the controller since start."},
    {"_errors_total", "requests answered with ERROR since start."},
    {"_latency_p50_us", "median handling time over the latest 4096 requests, in microseconds."},
    {"_latency_p99_us",
     "99th percentile handling time over the latest 4096 requests, in microseconds."},
    {"_latency_max_us", "slowest handling time since start, in microseconds."},
};

std::string Upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 'a' + 'A' : c);
  return out;
}

}  // namespace

std::string MetricHelp(std::string_view family) {
  for (const Help& h : kHelp) {
    if (h.family == family) return std::string(h.text);
  }
  constexpr std::string_view kPrefix = "kvctl_";
  if (!family.starts_with(kPrefix)) return "";
  const std::string_view rest = family.substr(kPrefix.size());
  for (std::string_view type : kRequestTypes) {
    if (!rest.starts_with(type) || rest.size() <= type.size() || rest[type.size()] != '_') {
      continue;
    }
    for (const TypeHelp& t : kTypeHelp) {
      if (rest.substr(type.size()) != t.suffix) continue;
      return (type == "other" ? std::string("Unknown-type") : Upper(type)) + " " +
             std::string(t.text);
    }
  }
  return "";
}

}  // namespace kvctl
