// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// STATS text in the daemon's format (controller/service/controller_stats.cc) for kvtop's unit
// tests, with the shape and counters each test needs.
#ifndef KVCTL_TESTS_OBSERVABILITY_KVTOP_TEST_UTIL_H_
#define KVCTL_TESTS_OBSERVABILITY_KVTOP_TEST_UTIL_H_

#include <cstdint>
#include <sstream>
#include <string>

namespace kvctl::kvtop::testing {

struct FakeStats {
  int layers = 2, heads = 2, sequences = 2;
  int pid = 4242;
  long requests = 100, appends = 80, fetches = 5, bytes_in = 1 << 20;
  int budget_tokens = 0;
  std::string client = "vllm";
  uint64_t session = 1;
  bool tier = false;  // A # Tier section with a cluster, and a # Prefix section in use.
};

inline std::string MakeStats(const FakeStats& f) {
  std::ostringstream o;
  o << "# Server\nkvctl_version:0.1.0\nprotocol_version:1\npid:" << f.pid
    << "\nuptime_s:3723\nendpoint:ipc:///tmp/kvctl.sock\nstats_endpoint:ipc:///tmp/s.sock\n"
    << "http_address:127.0.0.1:9464\n";
  o << "# Pool\npool_backend:cpu\npool_shm_name:/kvctl-pool\npool_bytes:268435456\n"
    << "page_bytes:65536\npages:3584\npages_used:180\npages_high_water:200\nbytes_used:11796480\n"
    << "bytes_free:223084544\nbytes_high_water:13107200\nstaging_slots:4\nstaging_slots_used:1\n"
    << "staging_bytes:33554432\nalloc_failures_total:0\n";
  o << "# Sequences\nsessions:1\nsessions_expired_total:0\nsequences:" << f.sequences
    << "\ntokens:700\ntokens_quantized:256\nkv_payload_bytes:5587200\nkv_pool_bytes:11796480\n"
    << "kv_fp16_equivalent_bytes:8064000\nbits_per_element:11.0857\n"
    << "reserved_bits_per_element:23.4057\ncompression_vs_fp16:0.6836\n"
    << "payload_compression_vs_fp16:1.4433\n";
  for (int s = 0; s < f.sequences; ++s) {
    o << "seq_" << f.session << "_" << s + 1 << ":client=" << f.client
      << ",tokens=" << 100 * (s + 1) << ",bytes=" << 1000 * (f.sequences - s)
      << ",evictions=0,age_s=" << 10 + s << "\n";
  }
  o << "# Layers\nlayers:" << f.layers << "\n";
  for (int l = 0; l < f.layers; ++l) {
    o << "layer_" << l << ":tokens=" << 100 * (l + 1) << ",bytes=186240,bits_per_element=11.0857,"
      << "budget_tokens=" << f.budget_tokens << ",evictions=0\n";
  }
  o << "# Heads\nheads:" << f.layers * f.heads << "\n";
  for (int l = 0; l < f.layers; ++l) {
    for (int h = 0; h < f.heads; ++h) {
      o << "head_" << l << "_" << h << ":tokens=" << 50 * (h + 1) << ",k_bits=" << (h ? 2 : 4)
        << ",v_bits=2,bits_per_element=11.0857,k_rel_error=0.0920884,v_rel_error=0.183071,"
        << "quality_samples=" << h + 1 << "\n";
    }
  }
  o << "# Policy\nquant_method:kvarn\nquant_k_bits:2\nquant_v_bits:2\nquant_lossless:0\n"
    << "budget_mode:none\nevict_policy:none\n";
  o << "# Ipc\nrequests_total:" << f.requests << "\nrejected_total:0\nerrors_total:0\n"
    << "replies_total:" << f.requests << "\nbytes_in_total:" << f.bytes_in
    << "\nbytes_out_total:2048\nin_flight:0\nappend_requests_total:" << f.appends
    << "\nappend_errors_total:0\nappend_latency_p50_us:107\nappend_latency_p99_us:46341\n"
    << "append_latency_max_us:80683\nfetch_requests_total:" << f.fetches
    << "\nfetch_errors_total:0\nfetch_latency_p50_us:58062\nfetch_latency_p99_us:58062\n"
    << "fetch_latency_max_us:58062\n";
  o << "# Quality\nquality_sample_period:16\nquality_samples_total:90\n"
    << "quality_k_rel_error_mean:0.104997\nquality_v_rel_error_mean:0.185155\n";
  o << "# Tier\ntier_enabled:" << f.tier << "\n";
  if (f.tier) {
    o << "tier_connected:1\ntier_spilled_sequences:2\ntier_spilled_bytes:3145728\n"
      << "tier_spills_total:5\ntier_spill_us_total:25000\ntier_restores_total:3\n"
      << "tier_restore_us_total:12000\ntier_spilled_lost_total:0\ntier_prefix_hits_total:7\n"
      << "tier_prefix_misses_total:2\ntier_prefix_restored_tokens_total:14336\n";
    o << "# Prefix\nprefix_cache_enabled:1\nprefix_cache_entries:2\nprefix_cache_read_entries:1\n"
      << "prefix_cache_held_bytes:2097152\nprefix_cache_max_bytes:67108864\n"
      << "prefix_cache_lookups_total:4\nprefix_cache_hits_total:3\nprefix_cache_dropped_total:1\n"
      << "prefix_cache_lost_total:0\n";
  }
  return o.str();
}

}  // namespace kvctl::kvtop::testing

#endif  // KVCTL_TESTS_OBSERVABILITY_KVTOP_TEST_UTIL_H_
