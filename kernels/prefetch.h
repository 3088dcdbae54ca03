// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: kernels/prefetch.h
// Software prefetch that the compiler keeps. A bare __builtin_prefetch has no side effect as far
// as GCC's interprocedural analysis goes: a helper whose body only prefetches (a loop over a
// block's lines, say) is found to be `const`, and its calls, whose result nobody reads, are
// deleted. GCC 12 -O3 did that to the quantizers' slab prefetches (kernels/quantize_simd_impl.inc
// Slabs::Start: 63 prefetch instructions in quantize_avx2.o instead of 72; a per-block prefetch
// helper tried in session 42 compiled to none). The empty volatile asm marks every call as having
// an effect, so it stays, and costs no instruction.
//
// Contract: a prefetch is a hint. It never faults, whatever the address (inside an allocation or
// not), reads nothing the program sees, and may be ignored by the CPU.
#ifndef KVCTL_KERNELS_PREFETCH_H_
#define KVCTL_KERNELS_PREFETCH_H_

namespace kvctl {

// Asks for the line holding `p` in every cache level (the next use is soon).
inline void PrefetchNear(const void* p) {
  __builtin_prefetch(p, 0, 3);
  asm volatile("");
}

// The same with the hint for the outer levels (x86 prefetcht1: L2 and beyond where the CPU honours
// it): for data one unit of work ahead.
inline void PrefetchAhead(const void* p) {
  __builtin_prefetch(p, 0, 2);
  asm volatile("");
}

}  // namespace kvctl

#endif  // KVCTL_KERNELS_PREFETCH_H_
