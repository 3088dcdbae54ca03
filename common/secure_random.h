// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/secure_random.h
// Unguessable numbers from the operating system's CSPRNG (getrandom(2)), for anything a client
// can name: session ids are the only capability to a session's sequences, so seeing any number
// of them must tell nothing about the next one (a seeded PRNG such as mt19937_64 is predictable
// from 312 outputs).
//
// Thread safety: safe from any thread; every call asks the kernel.
//
//   const uint64_t id = SecureRandomU64();
#ifndef KVCTL_COMMON_SECURE_RANDOM_H_
#define KVCTL_COMMON_SECURE_RANDOM_H_

#include <cstddef>
#include <cstdint>

namespace kvctl {

// Fills `out` with `bytes` random bytes. Blocks only until the kernel's pool is first seeded
// (early boot); aborts if getrandom(2) fails otherwise, which on Linux >= 3.17 it cannot.
void SecureRandomBytes(void* out, size_t bytes);

inline uint64_t SecureRandomU64() {
  uint64_t x;
  SecureRandomBytes(&x, sizeof(x));
  return x;
}

}  // namespace kvctl

#endif  // KVCTL_COMMON_SECURE_RANDOM_H_
