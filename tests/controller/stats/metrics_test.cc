#include "controller/stats/metrics.h"

#include <catch2/catch.hpp>

namespace kvctl {
namespace {

TEST_CASE("Metrics: INFO text renders as Prometheus families with labels", "[controller]") {
  const std::string text =
      "# Server\nkvctl_version:0.1.0\nuptime_s:12\n"
      "# Pool\nbytes_used:4096\nalloc_failures_total:3\n"
      "# Sequences\nseq_7_2:client=a\"b,tokens=10,bytes=64\n"
      "# "
      "Heads\nhead_3_1:tokens=5,k_bits=2,k_rel_error=0.125\nhead_3_2:tokens=6,k_bits=4,k_rel_error="
      "0\n";
  const std::string out = RenderPrometheus(text);
  CHECK(out.find("# TYPE kvctl_uptime_s gauge\nkvctl_uptime_s 12\n") != std::string::npos);
  CHECK(out.find("# TYPE kvctl_alloc_failures_total counter\nkvctl_alloc_failures_total 3\n") !=
        std::string::npos);
  CHECK(out.find("kvctl_head_tokens{layer=\"3\",head=\"1\"} 5\n"
                 "kvctl_head_tokens{layer=\"3\",head=\"2\"} 6\n") != std::string::npos);
  CHECK(out.find("kvctl_head_k_rel_error{layer=\"3\",head=\"1\"} 0.125") != std::string::npos);
  CHECK(out.find("kvctl_sequence_tokens{session=\"7\",sequence=\"2\",client=\"a\\\"b\"} 10") !=
        std::string::npos);
  CHECK(out.find("kvctl_server_info{kvctl_version=\"0.1.0\"} 1") != std::string::npos);
  // One HELP/TYPE pair per family.
  size_t count = 0;
  for (size_t at = out.find("# TYPE kvctl_head_tokens"); at != std::string::npos;
       at = out.find("# TYPE kvctl_head_tokens", at + 1)) {
    ++count;
  }
  CHECK(count == 1);
}

}  // namespace
}  // namespace kvctl
