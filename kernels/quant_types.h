// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/quant_types.h
// The quantizer registry: every KV quantization method kvctl knows, its allowed bit widths, its
// default parameters, its streaming rules and the exact byte layout of one block record. The
// allocator, the wire protocol, the budget policies and kvtop read sizes from here and nowhere
// else.
//
// A *block record* holds K and V of `block_tokens` consecutive tokens of one (layer, KV head),
// quantized. Its layout is documented in kernels/README.md and computed by BlockLayoutOf(). OScaR
// also needs one fp32 norm per token shared by all heads of a layer: the *side record*
// (side_bytes_per_token), stored once per layer, not per head.
//
// Thread safety: plain values and constant tables.
//
//   KVCTL_ASSIGN_OR_RETURN(QuantSpec spec, MakeQuantSpec(QuantMethod::kKvarn, 128, 2, 2));
//   BlockLayout layout = BlockLayoutOf(spec);      // layout.record_bytes per (head, block)
//   double bpe = BitsPerElement(spec, /*kv_heads=*/8).average;  // 2.375 for KVarN k2v2 G128
#ifndef KVCTL_KERNELS_QUANT_TYPES_H_
#define KVCTL_KERNELS_QUANT_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/status.h"

namespace kvctl {

// Values are stored in records and sent on the wire: never renumber, never reuse.
enum class QuantMethod : uint8_t {
  kFp16 = 0,    // No quantization: K and V as fp16 rows (the uncompressed baseline).
  kKivi = 1,    // KIVI: K per-channel over token groups, V per-token over channel groups.
  kQuaRot = 2,  // QuaRot-style: Hadamard on K and V, per-token RTN over head_dim.
  kKvarn = 3,   // KVarN: Hadamard, Sinkhorn variance normalisation per tile, RTN per row.
  kOscar = 4,   // OScaR: Hadamard, per-token L2 norm over the layer, per-channel K, per-token V.
  kTurbo = 5,   // TurboQuant: per-token scale, random sign + Hadamard, Lloyd-Max codebook.
};
inline constexpr int kNumQuantMethods = 6;

// Everything that determines the bytes of a block record. Build with MakeQuantSpec (defaults from
// the registry) and ValidateQuantSpec after any change.
struct QuantSpec {
  QuantMethod method = QuantMethod::kFp16;
  int head_dim = 128;         // D: power of two for rotating methods, multiple of 8.
  int k_bits = 16;            // Code width of K (16 for kFp16).
  int v_bits = 16;            // Code width of V.
  int block_tokens = 32;      // G: tokens per block record.
  int k_group_tokens = 32;    // Tokens sharing one K (scale, zero) per channel (KIVI, OScaR).
  int v_group_channels = 32;  // Channels sharing one V (scale, zero) per token (KIVI, OScaR).
  int sinkhorn_iters = 4;     // KVarN only: variance-normalisation iterations.

  bool operator==(const QuantSpec&) const = default;
};

// How a method consumes a stream of tokens (docs/algorithms.md §8.4): the first `sink_tokens` of a
// sequence stay fp16 forever; later tokens collect in an fp16 tail; when the tail holds
// `flush_tokens` tokens, all of them are quantized as flush_tokens / block_tokens records and the
// tail empties. So between 0 and flush_tokens - 1 tokens are fp16 at any time, besides the sinks.
struct StreamingRules {
  int sink_tokens = 0;
  int flush_tokens = 128;  // Multiple of QuantSpec::block_tokens.

  bool operator==(const StreamingRules&) const = default;
};
// The most appends a sequence may spread the flushes of its layers over (quant.flush_spread_steps,
// controller/sequence/kv_sequence.h): a tail then holds up to flush_tokens + this - 2 rows, which
// sequence images accept whatever the exporter's setting was.
inline constexpr int kMaxFlushSpreadSteps = 64;

struct MethodTraits {
  QuantMethod method;
  const char* name;  // Config and wire name: "kivi", "quarot", "kvarn", "oscar", "turbo", "fp16".
  const char* description;
  uint32_t allowed_bits;   // Bit mask: bit b set means code width b is allowed.
  bool rotates;            // Applies the orthonormal Hadamard to K and V (and Q at attention).
  bool needs_token_norms;  // Needs the per-token layer-wide K norm side record (OScaR).
  QuantSpec defaults;      // head_dim is a placeholder; MakeQuantSpec sets it.
  StreamingRules streaming;
};

// The registry. REQUIRES: a valid enumerator.
const MethodTraits& TraitsOf(QuantMethod method);
StatusOr<QuantMethod> ParseQuantMethod(std::string_view name);
std::string_view QuantMethodName(QuantMethod method);

// Registry defaults for `method` at this head_dim and bit widths, validated.
StatusOr<QuantSpec> MakeQuantSpec(QuantMethod method, int head_dim, int k_bits, int v_bits);

// Checks every field against the method's constraints; the error names the field, the value and
// what was expected (e.g. "k_bits: got 5, expected one of {2, 3, 4, 8} for kivi").
Status ValidateQuantSpec(const QuantSpec& spec);
Status ValidateStreamingRules(const QuantSpec& spec, const StreamingRules& rules);

// TurboQuant's scalar codebook for one width (docs/algorithms.md §20.2): centroid[code] is the
// value of a code in the rotated, unit-norm frame; bound[k] = (centroid[k] + centroid[k + 1]) / 2,
// and the code of y is the number of bounds strictly below y. Entries past 2^bits (- 1) are 0.
struct TurboCodebook {
  float centroid[16];
  float bound[16];
};

// Byte layout of one block record. Sections appear in this order, each starting at its offset;
// record_bytes includes padding to a multiple of 8 bytes. For TurboQuant it also carries the
// fixed codebooks of K and V (a pure function of head_dim and the widths,
// kernels/turbo_codebook.h), so that every codec that receives the layout (CPU, SIMD, CUDA,
// attention) has them.
struct BlockLayout {
  size_t k_codes_offset = 0, k_codes_bytes = 0;
  size_t k_meta_offset = 0, k_meta_bytes = 0;
  size_t v_codes_offset = 0, v_codes_bytes = 0;
  size_t v_meta_offset = 0, v_meta_bytes = 0;
  size_t record_bytes = 0;          // Per (head, block), padded.
  size_t side_bytes_per_token = 0;  // Per (layer, token), shared by all heads (OScaR norms).
  TurboCodebook turbo_k = {}, turbo_v = {};  // kTurbo only; zero otherwise.
};
// REQUIRES: ValidateQuantSpec(spec).ok().
BlockLayout BlockLayoutOf(const QuantSpec& spec);

// Whether every token of a record is stored on its own: its codes and metadata depend on no other
// token of the block. True for fp16, QuaRot and TurboQuant (per-token rows and per-token scales);
// false for KIVI and OScaR (K groups span tokens) and KVarN (tile scales). A record of such a
// method can be assembled from the tokens of other records byte for byte (CopyRecordToken), and
// every token then decodes to exactly what it decoded to before: eviction's compaction moves the
// kept tokens of a partly evicted record this way instead of quantizing them again
// (docs/budgets.md, "Storage: ragged heads and compaction").
bool TokenSeparable(QuantMethod method);

// Copies token `src_token` of record `src` into token `dst_token` of record `dst`: its K and V
// codes and its K and V metadata (`layout` = BlockLayoutOf(spec)). Padding bytes are not touched.
// REQUIRES: TokenSeparable(spec.method); both tokens in [0, spec.block_tokens).
void CopyRecordToken(const QuantSpec& spec, const BlockLayout& layout, const uint8_t* src,
                     int src_token, uint8_t* dst, int dst_token);

// Bits per element of the quantized region, computed from the bytes a record holds: codes,
// metadata and padding, plus the side record spread over the layer's kv_heads heads.
struct BitsPerElementBreakdown {
  double k = 0;        // K bits (codes + K metadata + side record) per K element.
  double v = 0;        // V bits (codes + V metadata + padding) per V element.
  double average = 0;  // (k + v) / 2.
};
BitsPerElementBreakdown BitsPerElement(const QuantSpec& spec, int kv_heads);

// Effective bits per element of a stream of `tokens` tokens under `rules`: sinks and the fp16 tail
// at 16 bits, the rest at BitsPerElement(...).average. Matches what the daemon stores.
double EffectiveBitsPerElement(const QuantSpec& spec, const StreamingRules& rules, int kv_heads,
                               int64_t tokens);

// Number of tokens that are quantized (not sink, not tail) after `tokens` tokens were streamed.
int64_t QuantizedTokenCount(const QuantSpec& spec, const StreamingRules& rules, int64_t tokens);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_QUANT_TYPES_H_
