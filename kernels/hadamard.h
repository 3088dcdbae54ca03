// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/hadamard.h
// The orthonormal fast Walsh-Hadamard transform over head_dim, the rotation of QuaRot, KVarN and
// OScaR (and of Q at attention time). H is symmetric and orthonormal, so it is its own inverse.
// FwhtRowsRef is the spec (block::FwhtRow per row); FwhtRows is the SIMD path with identical bits.
//
// Thread safety: reentrant.
//
//   KVCTL_RETURN_IF_ERROR(ValidateHadamardDim(d));
//   FwhtRows(rows, n_rows, d);  // in place, each row of d floats
#ifndef KVCTL_KERNELS_HADAMARD_H_
#define KVCTL_KERNELS_HADAMARD_H_

#include <cstdint>

#include "common/status.h"

namespace kvctl {

// OK for a power of two in 1..256; otherwise INVALID_ARGUMENT naming the value.
Status ValidateHadamardDim(int d);

// In place over n rows of d contiguous floats. REQUIRES: ValidateHadamardDim(d).ok().
void FwhtRowsRef(float* rows, int64_t n, int d);
void FwhtRows(float* rows, int64_t n, int d);

}  // namespace kvctl

#endif  // KVCTL_KERNELS_HADAMARD_H_
