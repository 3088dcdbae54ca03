// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tools/kvbench_command.h
// The shared tail of every kvbench subcommand: run the benchmark, print its report as a table or
// JSON, and turn any failure (a Status or an exception such as std::bad_alloc or zmq::error_t)
// into one line on stderr and exit code 1; Appendf for the report formatters; ApplySimdFlag for
// the subcommands' --simd.
#ifndef KVCTL_TOOLS_KVBENCH_COMMAND_H_
#define KVCTL_TOOLS_KVBENCH_COMMAND_H_

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include "common/status.h"
#include "kernels/quantize.h"

namespace kvctl {

// printf into the end of *out (one formatted piece of at most 511 bytes).
inline __attribute__((format(printf, 2, 3))) void Appendf(std::string* out, const char* fmt, ...) {
  char buf[512];
  va_list args;
  va_start(args, fmt);
  const int n = std::vsnprintf(buf, sizeof(buf), fmt, args);
  va_end(args);
  if (n > 0) out->append(buf, static_cast<size_t>(std::min<int>(n, sizeof(buf) - 1)));
}

// A subcommand's --simd flag: "" keeps the detected level; a level name selects it
// (SetSimdLevel). Errors name the flag.
inline Status ApplySimdFlag(std::string_view simd) {
  if (simd.empty()) return OkStatus();
  const StatusOr<SimdLevel> level = ParseSimdLevel(simd);
  const Status st = level.ok() ? SetSimdLevel(*level) : level.status();
  return st.ok() ? st : Status(st.code(), internal::StrCat("--simd: ", st.message()));
}

template <typename Run, typename Format>
int RunBenchCommand(const char* name, Run run, Format format, std::FILE* out, std::FILE* err) {
  try {
    auto report = run();
    if (!report.ok()) {
      std::fprintf(err, "%s: %s\n", name, report.status().message().c_str());
      return 1;
    }
    const std::string text = format(*report);
    std::fputs(text.c_str(), out);
    std::fflush(out);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(err, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace kvctl

#endif  // KVCTL_TOOLS_KVBENCH_COMMAND_H_
