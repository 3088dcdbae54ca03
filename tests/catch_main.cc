// Shared Catch2 entry point for every test binary. Besides running the session it counts the test
// cases that ran and those that called testing::Skip (tests/skip.h): when every one that ran was
// skipped and nothing failed it exits 77, CTest's "skipped".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "tests/skip.h"

namespace kvctl::testing {
namespace {

int g_cases_run = 0;
std::vector<std::string> g_skipped;     // "test case name: reason", in the order they ran.
std::set<std::string> g_skipped_cases;  // A case with sections may call Skip once per section.

struct CaseCounter : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    ++g_cases_run;
    TestEventListenerBase::testCaseEnded(stats);
  }
};
CATCH_REGISTER_LISTENER(CaseCounter)

}  // namespace

void Skip(const std::string& reason) {
  WARN("SKIPPED: " << reason);
  const std::string name = Catch::getResultCapture().getCurrentTestName();
  if (g_skipped_cases.insert(name).second) g_skipped.push_back(name + ": " + reason);
}

}  // namespace kvctl::testing

int main(int argc, char** argv) {
  using kvctl::testing::g_cases_run;
  using kvctl::testing::g_skipped;
  const int failed = Catch::Session().run(argc, argv);
  if (g_skipped.empty()) return failed;
  std::printf("%zu of %d test cases skipped:\n", g_skipped.size(), g_cases_run);
  for (const std::string& s : g_skipped) std::printf("  %s\n", s.c_str());
  const bool all_skipped = static_cast<int>(g_skipped.size()) == g_cases_run;
  return failed == 0 && all_skipped ? 77 : failed;
}
