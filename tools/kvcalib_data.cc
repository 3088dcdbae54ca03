// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
// kvcalib's calibration input: the dump layout reader and writer, and the synthetic generator.
#include "tools/kvcalib_data.h"

#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "common/half.h"
#include "tests/support/synthetic_kv.h"

namespace kvctl {
namespace {

namespace fs = std::filesystem;

constexpr int kMaxLayers = 4096;
constexpr int kMaxHeads = 4096;
constexpr int kMaxHeadDim = 1024;

Status CheckRange(const char* name, int64_t value, int64_t lo, int64_t hi) {
  if (value < lo || value > hi) {
    return InvalidArgument(name, ": got ", value, ", expected ", lo, "..", hi);
  }
  return OkStatus();
}

CalibTensor FromFloats(std::vector<float> data, int64_t tokens, int64_t heads, int64_t head_dim) {
  CalibTensor t;
  t.dtype = DType::kF32;
  t.tokens = tokens;
  t.heads = heads;
  t.head_dim = head_dim;
  t.f32 = std::move(data);
  return t;
}

// Keeps a float16 file as float16 bits (every value came from a half, so this is exact).
CalibTensor FromNpy(NpyArray a) {
  CalibTensor t;
  t.tokens = a.shape[0];
  t.heads = a.shape[1];
  t.head_dim = a.shape[2];
  if (a.dtype == NpyDType::kF16) {
    t.dtype = DType::kF16;
    t.f16.resize(a.data.size());
    for (size_t i = 0; i < a.data.size(); ++i) t.f16[i] = FloatToHalf(a.data[i]);
  } else {
    t.dtype = DType::kF32;
    t.f32 = std::move(a.data);
  }
  return t;
}

// Fills data.set from data.sequences.
void BuildViews(CalibrationData& data) {
  data.set.assign(data.sequences.size(), {});
  for (size_t s = 0; s < data.sequences.size(); ++s) {
    for (const CalibLayerData& l : data.sequences[s]) {
      data.set[s].push_back({l.k.View(), l.v.View(), l.q.View()});
    }
  }
}

// Reads one [T, heads, D] array; `heads`/`head_dim` of -1 accept any value.
StatusOr<NpyArray> ReadTensor(const std::string& path, int64_t tokens, int64_t heads,
                              int64_t head_dim) {
  KVCTL_ASSIGN_OR_RETURN(NpyArray a, ReadNpy(path));
  if (a.shape.size() != 3 || a.shape[0] < 1 || a.shape[1] < 1 || a.shape[2] < 1) {
    return InvalidArgument(path, ": shape: got ", FormatNpyShape(a.shape),
                           ", expected (tokens, heads, head_dim), each >= 1");
  }
  KVCTL_RETURN_IF_ERROR(ExpectNpyShape(a, path, {tokens, heads, head_dim}));
  KVCTL_RETURN_IF_ERROR(
      KvTensorView::Contiguous(a.data.data(), DType::kF32, a.shape[0], a.shape[1], a.shape[2])
          .CheckFinite(path));
  return a;
}

// The number of layer_<l> directories, checking that they are numbered 0..L-1 without gaps.
StatusOr<int> CountLayers(const std::string& dir) {
  std::error_code ec;
  int layers = 0;
  while (layers <= kMaxLayers &&
         fs::is_directory(fs::path(dir) / ("layer_" + std::to_string(layers)), ec)) {
    ++layers;
  }
  if (layers == 0) {
    const bool flat =
        fs::exists(fs::path(dir) / "k_0.npy", ec) || fs::exists(fs::path(dir) / "k.npy", ec);
    return InvalidArgument(
        dir, ": no layer_0/ directory, expected ", dir,
        "/layer_<l>/{k,v[,q]}.npy for l = 0, 1, ...",
        flat ? " (found k_0.npy or k.npy: move each layer's files into layer_<l>/)" : "");
  }
  if (layers > kMaxLayers) {
    return InvalidArgument(dir, ": layers: got more than ", kMaxLayers, ", expected at most ",
                           kMaxLayers);
  }
  // A stray layer_<n> past the first gap is a broken dump, not a shorter model.
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("layer_", 0) != 0) continue;
    const std::string num = name.substr(6);
    if (num.empty() || num.find_first_not_of("0123456789") != std::string::npos) continue;
    if (num.size() > 6 || std::stoi(num) >= layers) {
      return InvalidArgument(dir, "/", name,
                             ": layer numbering has a gap, expected layer_0 .. layer_", layers - 1,
                             " only (layer_", layers, " is missing)");
    }
  }
  return layers;
}

}  // namespace

KvTensorView CalibTensor::View() const {
  if (empty()) return KvTensorView{};
  const void* p = dtype == DType::kF16 ? static_cast<const void*>(f16.data())
                                       : static_cast<const void*>(f32.data());
  return KvTensorView::Contiguous(p, dtype, tokens, heads, head_dim);
}

int64_t CalibrationData::total_tokens() const {
  int64_t t = 0;
  for (const auto& s : sequences) t += s.empty() ? 0 : s[0].k.tokens;
  return t;
}

StatusOr<CalibrationData> GenerateSyntheticCalibration(const SyntheticCalibOptions& o) {
  KVCTL_RETURN_IF_ERROR(CheckRange("--synthetic", o.sequences, 1, 4096));
  KVCTL_RETURN_IF_ERROR(CheckRange("--layers", o.layers, 1, kMaxLayers));
  KVCTL_RETURN_IF_ERROR(CheckRange("--heads", o.heads, 1, kMaxHeads));
  KVCTL_RETURN_IF_ERROR(CheckRange("--q-heads", o.q_heads, 0, kMaxHeads));
  if (o.q_heads % o.heads != 0) {
    return InvalidArgument("--q-heads: got ", o.q_heads, ", expected 0 or a multiple of --heads ",
                           o.heads);
  }
  if (o.head_dim < 8 || o.head_dim > kMaxHeadDim || o.head_dim % 8 != 0) {
    return InvalidArgument("--head-dim: got ", o.head_dim, ", expected a multiple of 8 in 8..",
                           kMaxHeadDim);
  }
  KVCTL_RETURN_IF_ERROR(CheckRange("--tokens", o.tokens, 1, int64_t{1} << 20));
  const int q_heads = o.q_heads > 0 ? o.q_heads : o.heads;
  const double floats = static_cast<double>(o.sequences) * o.layers * o.tokens * o.head_dim *
                        (2.0 * o.heads + q_heads);
  if (floats > static_cast<double>(int64_t{1} << 31)) {
    return InvalidArgument("--synthetic: got ", floats,
                           " floats of K, V and Q in total, expected at most 2^31");
  }
  CalibrationData data;
  data.layers = o.layers;
  data.kv_heads = o.heads;
  data.q_heads = q_heads;
  data.head_dim = o.head_dim;
  for (int s = 0; s < o.sequences; ++s) {
    data.sources.push_back("synthetic[" + std::to_string(s) + "]");
    std::vector<CalibLayerData>& seq = data.sequences.emplace_back();
    for (int l = 0; l < o.layers; ++l) {
      SyntheticKv kv =
          GenerateSyntheticKv({.tokens = o.tokens,
                               .heads = o.heads,
                               .head_dim = o.head_dim,
                               .q_heads = q_heads,
                               .outlier_scale = 4.0f + 4.0f * static_cast<float>(l % 4),
                               .seed = o.seed * 1000003u + static_cast<uint64_t>(s) * 4096u +
                                       static_cast<uint64_t>(l)});
      seq.push_back({FromFloats(std::move(kv.k), o.tokens, o.heads, o.head_dim),
                     FromFloats(std::move(kv.v), o.tokens, o.heads, o.head_dim),
                     FromFloats(std::move(kv.q), o.tokens, q_heads, o.head_dim)});
    }
  }
  BuildViews(data);
  return data;
}

StatusOr<CalibrationData> LoadCalibrationDirs(const std::vector<std::string>& dirs,
                                              int64_t max_elements) {
  if (dirs.empty()) return InvalidArgument("--input: got no directory, expected one per sequence");
  CalibrationData data;
  int64_t elements = 0;
  bool queries_known = false;
  std::string first_q_source;  // Where the first sequence decided "with" or "without" queries.
  for (size_t s = 0; s < dirs.size(); ++s) {
    const std::string& dir = dirs[s];
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return NotFound("--input: ", dir, ": no such directory");
    KVCTL_ASSIGN_OR_RETURN(const int layers, CountLayers(dir));
    if (s == 0) {
      data.layers = layers;
    } else if (layers != data.layers) {
      return InvalidArgument(dir, ": layers: got ", layers, " layer_<l> directories, expected ",
                             data.layers, " as ", dirs[0]);
    }
    data.sources.push_back(dir);
    std::vector<CalibLayerData>& seq = data.sequences.emplace_back();
    for (int l = 0; l < layers; ++l) {
      const fs::path ldir = fs::path(dir) / ("layer_" + std::to_string(l));
      const std::string k_path = (ldir / "k.npy").string();
      const std::string v_path = (ldir / "v.npy").string();
      const std::string q_path = (ldir / "q.npy").string();
      // The first k.npy fixes H and D for every later file.
      const int64_t h = data.kv_heads > 0 ? data.kv_heads : -1;
      const int64_t d = data.head_dim > 0 ? data.head_dim : -1;
      KVCTL_ASSIGN_OR_RETURN(NpyArray k, ReadTensor(k_path, -1, h, d));
      if (k.shape[1] > kMaxHeads || k.shape[2] > kMaxHeadDim) {
        return InvalidArgument(k_path, ": shape: got ", FormatNpyShape(k.shape),
                               ", expected at most ", kMaxHeads, " heads and head_dim ",
                               kMaxHeadDim);
      }
      data.kv_heads = static_cast<int>(k.shape[1]);
      data.head_dim = static_cast<int>(k.shape[2]);
      const int64_t t = k.shape[0];
      KVCTL_ASSIGN_OR_RETURN(NpyArray v, ReadTensor(v_path, t, data.kv_heads, data.head_dim));
      const bool has_q = fs::exists(q_path, ec);
      if (!queries_known) {
        queries_known = true;
        first_q_source = q_path;
      } else if (has_q != data.has_queries()) {
        return InvalidArgument(q_path, ": ", has_q ? "present" : "missing", ", expected ",
                               data.has_queries() ? "present" : "missing", " as ", first_q_source,
                               " (queries go with every layer or none)");
      }
      CalibLayerData layer;
      elements += 2 * k.ElementCount();
      if (has_q) {
        const int64_t hq = data.q_heads > 0 ? data.q_heads : -1;
        KVCTL_ASSIGN_OR_RETURN(NpyArray q, ReadTensor(q_path, t, hq, data.head_dim));
        if (q.shape[1] % data.kv_heads != 0 || q.shape[1] > kMaxHeads) {
          return InvalidArgument(q_path, ": shape: got ", FormatNpyShape(q.shape),
                                 ", expected query heads a multiple of the ", data.kv_heads,
                                 " KV heads of k.npy (GQA), at most ", kMaxHeads);
        }
        data.q_heads = static_cast<int>(q.shape[1]);
        elements += q.ElementCount();
        layer.q = FromNpy(std::move(q));
      }
      if (elements > max_elements) {
        return InvalidArgument("--input: got more than ", max_elements,
                               " K, V and Q values in total at ", ldir.string(),
                               ", expected at most ", max_elements, " (use fewer sequences)");
      }
      layer.k = FromNpy(std::move(k));
      layer.v = FromNpy(std::move(v));
      seq.push_back(std::move(layer));
    }
  }
  BuildViews(data);
  return data;
}

StatusOr<std::vector<std::string>> WriteCalibrationDump(const CalibrationData& data,
                                                        const std::string& out_dir,
                                                        NpyDType dtype) {
  std::vector<std::string> written;
  std::vector<float> buf;
  for (size_t s = 0; s < data.sequences.size(); ++s) {
    const fs::path sdir = fs::path(out_dir) / ("seq_" + std::to_string(s));
    for (size_t l = 0; l < data.sequences[s].size(); ++l) {
      const fs::path ldir = sdir / ("layer_" + std::to_string(l));
      std::error_code ec;
      fs::create_directories(ldir, ec);
      if (ec) return Internal(ldir.string(), ": cannot create the directory: ", ec.message());
      const CalibLayerData& layer = data.sequences[s][l];
      for (auto [name, tensor] : {std::pair<const char*, const CalibTensor*>{"k.npy", &layer.k},
                                  {"v.npy", &layer.v},
                                  {"q.npy", &layer.q}}) {
        if (tensor->empty()) continue;
        const float* p = tensor->f32.data();
        if (tensor->dtype == DType::kF16) {
          buf.resize(tensor->f16.size());
          for (size_t i = 0; i < buf.size(); ++i) buf[i] = HalfToFloat(tensor->f16[i]);
          p = buf.data();
        }
        KVCTL_RETURN_IF_ERROR(WriteNpy(
            (ldir / name).string(), {tensor->tokens, tensor->heads, tensor->head_dim}, p, dtype));
      }
    }
    written.push_back(sdir.string());
  }
  return written;
}

}  // namespace kvctl
