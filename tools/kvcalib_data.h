// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvcalib_data.h
// kvcalib's calibration input: per-layer K, V and (optionally) Q of several calibration
// sequences, held in memory with the CalibrationSet views (policies/ratequant_fit.h) that the
// RateQuant fit and the layer-demand pass read. It comes from one of two places:
//  * a dump on disk, one directory per sequence, laid out as
//      SEQ_DIR/layer_<l>/k.npy   [T, H, D]   float16 or float32 (float64 is read too)
//      SEQ_DIR/layer_<l>/v.npy   [T, H, D]
//      SEQ_DIR/layer_<l>/q.npy   [T, Hq, D]  optional, Hq a multiple of H (GQA)
//    with l = 0, 1, ... contiguous (each layer_<l> directory is a `kvbench quant --input` dir);
//  * GenerateSyntheticKv, one call per (sequence, layer), for demos and tests.
// WriteCalibrationDump writes the second as the first, so the disk path can be tested end to
// end and gives back exactly the same data (float32 dumps are bit-exact).
//
// Thread safety: plain values and pure functions.
//
//   KVCTL_ASSIGN_OR_RETURN(CalibrationData data, LoadCalibrationDirs({"calib/seq_0"}));
//   KVCTL_ASSIGN_OR_RETURN(RateQuantFit fit, FitRateQuant(data.set, {}));
#ifndef KVCTL_TOOLS_KVCALIB_DATA_H_
#define KVCTL_TOOLS_KVCALIB_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/tensor.h"
#include "policies/ratequant_fit.h"
#include "tools/npy.h"

namespace kvctl {

// One tensor held as float32 or as float16 bits (a float16 dump stays float16 in memory, which
// halves what a 32-sequence calibration set takes).
struct CalibTensor {
  DType dtype = DType::kF32;  // kF32 or kF16.
  int64_t tokens = 0, heads = 0, head_dim = 0;
  std::vector<float> f32;
  std::vector<uint16_t> f16;

  bool empty() const { return tokens == 0; }
  KvTensorView View() const;  // Dense [tokens, heads, head_dim]; an empty view when empty().
};

// The tensors of one sequence at one layer.
struct CalibLayerData {
  CalibTensor k, v, q;  // q.empty(): no queries.
};

// A calibration set with its storage. `set` points into the tensors' heap buffers, which a move
// keeps and a copy would not: movable, not copyable.
struct CalibrationData {
  CalibrationData() = default;
  CalibrationData(CalibrationData&&) = default;
  CalibrationData& operator=(CalibrationData&&) = default;
  CalibrationData(const CalibrationData&) = delete;
  CalibrationData& operator=(const CalibrationData&) = delete;

  int layers = 0;
  int kv_heads = 0;
  int q_heads = 0;  // 0 when no sequence has queries.
  int head_dim = 0;
  std::vector<std::string> sources;  // Per sequence: its directory, or "synthetic[s]".
  std::vector<std::vector<CalibLayerData>> sequences;  // [s][l]
  CalibrationSet set;                                  // Views of the above, same indices.

  bool has_queries() const { return q_heads > 0; }
  int64_t total_tokens() const;  // Summed over sequences (one layer's worth).
};

// What --synthetic and dump-synthetic generate. Sequence s, layer l is
// GenerateSyntheticKv({tokens, heads, head_dim, q_heads, outlier_scale = 4 + 4 * (l % 4),
// seed = seed * 1000003 + s * 4096 + l}): the outlier scale varies with the layer so that layers
// differ the way real ones do, and every (s, l) has its own seed.
struct SyntheticCalibOptions {
  int sequences = 2;
  int layers = 4;
  int heads = 2;
  int q_heads = 0;  // 0: same as heads. Queries are always generated.
  int head_dim = 64;
  int64_t tokens = 512;
  uint64_t seed = 1;
};

// INVALID_ARGUMENT naming the option ("--layers: got 0, expected 1..1024") for sizes out of range.
StatusOr<CalibrationData> GenerateSyntheticCalibration(const SyntheticCalibOptions& options);

// Reads one sequence per directory, in the layout above. Errors name the file and what was
// expected: NOT_FOUND for a missing directory ("--input: calib/seq_9: no such directory") or a
// missing k.npy/v.npy; INVALID_ARGUMENT for a directory without layer_0/ (with a hint when it
// holds k_0.npy-style files), a gap in the layer numbering, wrong ranks or shapes, a head count,
// head_dim or layer count different from the first sequence, q.npy present in some layers or
// sequences and not others, non-finite values, or more than `max_elements` floats in total.
StatusOr<CalibrationData> LoadCalibrationDirs(const std::vector<std::string>& dirs,
                                              int64_t max_elements = int64_t{1} << 31);

// Writes `data` under `out_dir` as out_dir/seq_<s>/layer_<l>/{k,v,q}.npy in `dtype` (creating the
// directories). Returns the sequence directories written. INTERNAL on an I/O failure.
StatusOr<std::vector<std::string>> WriteCalibrationDump(const CalibrationData& data,
                                                        const std::string& out_dir,
                                                        NpyDType dtype = NpyDType::kF32);

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVCALIB_DATA_H_
