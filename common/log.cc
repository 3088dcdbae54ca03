#include "common/log.h"

#include <spdlog/spdlog.h>

namespace kvctl {
namespace {

spdlog::level::level_enum SpdlogLevel(LogSeverity severity) {
  switch (severity) {
    case LogSeverity::kDebug:
      return spdlog::level::debug;
    case LogSeverity::kInfo:
      return spdlog::level::info;
    case LogSeverity::kWarning:
      return spdlog::level::warn;
    case LogSeverity::kError:
      return spdlog::level::err;
  }
  return spdlog::level::err;
}

}  // namespace

bool LogEnabled(LogSeverity severity) {
  return spdlog::default_logger_raw()->should_log(SpdlogLevel(severity));
}

void LogLine(LogSeverity severity, std::string_view line) {
  spdlog::default_logger_raw()->log(spdlog::source_loc{}, SpdlogLevel(severity),
                                    spdlog::string_view_t(line.data(), line.size()));
}

}  // namespace kvctl
