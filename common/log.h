// Log lines from the library layers (the controller's handlers, the scrubber, the tier).
//
// Contract: Log(severity, "format {}", args...) formats with fmt (the format string checked at
// compile time) and hands the line to spdlog's default logger, which the daemon configures
// (controller/daemon/daemon.cc: level, pattern, sinks) and a test may replace. A line below the
// logger's level is not formatted. Thread-safe as spdlog's default logger is.
//
// Why not spdlog's own calls: each translation unit that instantiates spdlog::info & co. pays
// about 3.5 s more of compile time (its logger templates, once per unit and per build of the
// three that CI makes); fmt::format costs a tenth of that. spdlog itself is compiled in log.cc.
#pragma once

#include <fmt/format.h>

#include <string_view>
#include <utility>

namespace kvctl {

enum class LogSeverity { kDebug, kInfo, kWarning, kError };

// True when the default logger would write a line of `severity`.
bool LogEnabled(LogSeverity severity);

// Writes `line` at `severity` through the default logger.
void LogLine(LogSeverity severity, std::string_view line);

template <typename... Args>
void Log(LogSeverity severity, fmt::format_string<Args...> format, Args&&... args) {
  if (!LogEnabled(severity)) return;
  LogLine(severity, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace kvctl
