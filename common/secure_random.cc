// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "common/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvctl {

void SecureRandomBytes(void* out, size_t bytes) {
  auto* p = static_cast<unsigned char*>(out);
  while (bytes > 0) {
    const ssize_t got = getrandom(p, bytes, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      // No safe fallback exists: a guessable id would hand one client another's data.
      std::fprintf(stderr, "kvctl: getrandom failed: %s\n", std::strerror(errno));
      std::abort();
    }
    p += got;
    bytes -= static_cast<size_t>(got);
  }
}

}  // namespace kvctl
