// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/npy.h
// A small reader and writer for NumPy .npy files, enough for K/V/Q dumps: format versions 1.0, 2.0
// and 3.0, little-endian float dtypes '<f4', '<f2' and '<f8' (read as float32), C order only. Every
// error names the file, the header field, the value found and what was expected, so a bad dump can
// be fixed from the message alone.
//
// Thread safety: pure functions over their arguments.
//
//   KVCTL_ASSIGN_OR_RETURN(NpyArray k, ReadNpy("dump/k.npy"));
//   KVCTL_RETURN_IF_ERROR(ExpectNpyShape(k, "dump/k.npy", {-1, 8, 128}));  // [T, 8, 128]
//   KVCTL_RETURN_IF_ERROR(WriteNpy("out.npy", {4, 128}, data, NpyDType::kF16));
#ifndef KVCTL_TOOLS_NPY_H_
#define KVCTL_TOOLS_NPY_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kvctl {

// Element types we read and write. The descr strings are '<f4', '<f2' and '<f8'.
enum class NpyDType : uint8_t { kF32 = 0, kF16 = 1, kF64 = 2 };

std::string_view NpyDescr(NpyDType dtype);

struct NpyArray {
  std::vector<int64_t> shape;       // Empty for a 0-d array (one element).
  NpyDType dtype = NpyDType::kF32;  // What the file held; `data` is float32 regardless.
  std::vector<float> data;  // C order, ElementCount() values. f8 is rounded to nearest float.

  int64_t ElementCount() const;
};

// Parses a whole .npy image held in memory. `name` (usually the path) prefixes every error, e.g.
// "k.npy: descr: got '<i4', expected one of '<f4', '<f2', '<f8'". Fails with INVALID_ARGUMENT on a
// bad magic string, an unsupported version, a malformed or incomplete header dict, fortran_order
// True, an unsupported dtype (big-endian included), a negative or overflowing shape, and data that
// is shorter or longer than the shape says.
StatusOr<NpyArray> ParseNpy(std::string_view bytes, std::string_view name);

// Reads and parses `path`. NOT_FOUND when the file cannot be opened, else as ParseNpy.
StatusOr<NpyArray> ReadNpy(const std::string& path);

// Encodes `shape` and the ElementCount(shape) floats at `data` as an .npy image with the given
// element type (values rounded to nearest even for f2) and format version (1, 2 or 3; 0 picks 1.0
// unless the header needs 2.0). The header is padded with spaces to a 64-byte boundary and ends in
// '\n', as numpy writes it. INVALID_ARGUMENT for a negative dimension or unsupported version.
StatusOr<std::string> EncodeNpy(const std::vector<int64_t>& shape, const float* data,
                                NpyDType dtype = NpyDType::kF32, int version = 0);

// EncodeNpy, then writes the image to `path` (replacing it). INTERNAL on an I/O failure.
Status WriteNpy(const std::string& path, const std::vector<int64_t>& shape, const float* data,
                NpyDType dtype = NpyDType::kF32, int version = 0);

// Checks the array's shape against `expected`, where -1 matches any size. The error names the file
// and both shapes: "q.npy: shape: got (4096, 8, 64), expected (4096, *, 128)".
Status ExpectNpyShape(const NpyArray& array, std::string_view name,
                      const std::vector<int64_t>& expected);

// "(4096, 8, 128)", "(5,)", "()"; -1 prints as '*'.
std::string FormatNpyShape(const std::vector<int64_t>& shape);

}  // namespace kvctl

#endif  // KVCTL_TOOLS_NPY_H_
