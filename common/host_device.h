// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: common/host_device.h
// KVCTL_HOST_DEVICE marks per-element and per-block math that the CPU reference and the CUDA
// kernels share. Such functions take raw pointers and sizes, allocate nothing and never fail:
// callers validate first.
#ifndef KVCTL_COMMON_HOST_DEVICE_H_
#define KVCTL_COMMON_HOST_DEVICE_H_

#if defined(__CUDACC__)
#define KVCTL_HOST_DEVICE __host__ __device__
#else
#define KVCTL_HOST_DEVICE
#endif

#endif  // KVCTL_COMMON_HOST_DEVICE_H_
