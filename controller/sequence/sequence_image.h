// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/sequence/sequence_image.h
// A KvSequence as one self-describing, versioned, checksummed byte image (docs/sequence_image.md
// has the byte layout and every check), for the cluster tier: spill/restore of whole sequences
// and prefix reuse across sequences and daemons.
//
// Contract:
//   - ExportImage(seq, seq.tokens()) then ImportImage gives a sequence that behaves as the
//     original: the same FetchDense rows, the same record bytes (Blocks), the same HeadUsage
//     telemetry counters, and later Appends give the same rows and records as on the original.
//   - ExportImage(seq, M) for M < tokens exports the first M tokens. Exact only at a cut that
//     splits no record and no flush group (LargestExactCut finds one): then the import equals a
//     fresh sequence prefilled with those M tokens in one Append, record bytes included (records
//     are copied, never re-quantized). Per quantized layer with sink_tokens S, flush_tokens F and
//     quantized tokens ending at Q (= S + records * block_tokens), M is exact iff M <= S (sink
//     rows only), M >= Q (only the fp16 tail is trimmed) or (M - S) % F == 0 (records after M
//     dropped, tail empty); lossless layers accept any M. OScaR norms follow their records.
//   - Sequences with eviction on are refused (FAILED_PRECONDITION naming "eviction"): their
//     scoring state (query window, H2O accumulators, head re-allocation EMA, budgets) is not in
//     version 1 of the image, and without it the restored sequence would evict differently.
//   - An image is untrusted input: every count, length and index is checked (checked arithmetic,
//     section bounds, whole-image CRC-32C) before use, and a decoded image must satisfy every
//     invariant of KvSequence (counts consistent with tokens and the streaming rules, records of
//     exactly the spec's size, specs valid for the geometry) before any page is taken.
//
// Thread safety: pure functions; the caller serialises access to the sequence and the pool
// serialises its own allocations.
//
//   KVCTL_ASSIGN_OR_RETURN(auto image, ExportImage(seq, seq.tokens(), "smollm2"));
//   KVCTL_ASSIGN_OR_RETURN(auto back, ImportImage(pool, image, geometry, "smollm2"));
#ifndef KVCTL_CONTROLLER_SEQUENCE_SEQUENCE_IMAGE_H_
#define KVCTL_CONTROLLER_SEQUENCE_SEQUENCE_IMAGE_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "controller/sequence/kv_sequence.h"

namespace kvctl {

inline constexpr uint32_t kSequenceImageVersion = 1;
// Longest model id an image carries.
inline constexpr size_t kImageMaxModelIdBytes = 1024;

// What an image's header and plans say, read without rebuilding anything.
struct ImageInfo {
  uint32_t version = 0;
  std::string model_id;
  SequenceGeometry geometry;  // quality_sample_period is always 0 (the importer's setting).
  int64_t first_position = 0;
  int64_t tokens = 0;
  uint64_t bytes = 0;            // The whole image.
  std::vector<LayerPlan> plans;  // What encoded it (methods not yet checked against this build).
  bool prefix = false;           // Exported as a prefix (telemetry counters zeroed).
};

// Largest M <= limit with M % granule == 0 (granule >= 1) at which ExportImage(seq, M) is exact;
// 0 when there is none, when limit or granule is below 1, or when ExportImage refuses the
// sequence (eviction on, lost).
int64_t LargestExactCut(const KvSequence& seq, int64_t limit, int64_t granule);

// The whole sequence when tokens == seq.tokens(), else its first `tokens` tokens. INVALID_ARGUMENT
// naming "tokens" outside [0, seq.tokens()] or at a cut that is not exact (which layer and why),
// or naming "model_id" when longer than kImageMaxModelIdBytes; FAILED_PRECONDITION naming
// "eviction" for a sequence with eviction on; the sequence's DATA_LOSS when it is lost or its
// pages fail their checksums.
StatusOr<std::vector<uint8_t>> ExportImage(const KvSequence& seq, int64_t tokens,
                                           std::string_view model_id);

// Header and plans of an image: DATA_LOSS for a bad magic, a wrong length, a checksum mismatch or
// a header field out of bounds; FAILED_PRECONDITION for a version this build does not read.
StatusOr<ImageInfo> ReadImageInfo(std::span<const uint8_t> image);

// Rebuilds a sequence in `pool` from an image. ReadImageInfo's errors; FAILED_PRECONDITION naming
// the geometry field and both values when the image's geometry differs from `geometry`, naming
// "model_id" when both ids are non-empty and differ, naming the layer/head and what when a plan
// is one this build cannot decode (unknown method, spec invalid for head_dim, slot larger than a
// page) or the importer's eviction settings cannot hold it (OScaR, or more sinks than the image
// has for a layer with tokens past them); INVALID_ARGUMENT for pressure curves of the wrong count;
// DATA_LOSS for a body inconsistent with the plans; RESOURCE_EXHAUSTED when the pool lacks pages.
// On every error nothing stays allocated in the pool. Eviction and pressure settings and
// geometry.quality_sample_period are the importer's; eviction scoring state starts empty.
StatusOr<std::unique_ptr<KvSequence>> ImportImage(
    PageAllocator* pool, std::span<const uint8_t> image, const SequenceGeometry& geometry,
    std::string_view model_id, EvictionSettings eviction = {}, PressureSettings pressure = {});

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SEQUENCE_SEQUENCE_IMAGE_H_
