# kvctl_cc_library(NAME name SRCS ... DEPS ... [PUBLIC_DEPS ...])
#   One library per source folder; our warnings apply to our code only.
# kvctl_cc_test(NAME name SRCS ... DEPS ... [PROPERTIES prop value ...] [EXCLUDE_FROM_ALL]
#               [OPTIMIZED])
#   Adds the sources to the shared Catch2 test binary of the calling folder group; PROPERTIES
#   (LABELS, FIXTURES_REQUIRED, TIMEOUT, ...) go to every test case it discovers.
#   EXCLUDE_FROM_ALL: built only when asked for by name and not registered with CTest (a subset
#   binary for the sanitizer builds, whose cases a registered binary already runs).
#   OPTIMIZED: ignores KVCTL_TEST_OPT_LEVEL, for a binary whose run time is in its own code.
set(KVCTL_WARNINGS -Wall -Wextra)
# The sanitizer builds (tools/fuzz.sh, tools/sanitize.sh) set -O0: their test files then compile
# in a third of the CPU (a service test under clang ASan: 15 s at -O1, 5 s at -O0), while the
# libraries under test keep the build type's level. Empty: the build type's level.
set(KVCTL_TEST_OPT_LEVEL "" CACHE STRING
    "Optimization flag for test files (empty: the build type's)")
if(KVCTL_WERROR)
  list(APPEND KVCTL_WARNINGS -Werror)
endif()

function(kvctl_cc_library)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_library(${ARG_NAME} STATIC ${ARG_SRCS})
  target_include_directories(${ARG_NAME} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${ARG_NAME} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${KVCTL_WARNINGS}>)
  target_link_libraries(${ARG_NAME} PUBLIC ${ARG_DEPS})
endfunction()

function(kvctl_cc_binary)
  cmake_parse_arguments(ARG "" "NAME" "SRCS;DEPS" ${ARGN})
  add_executable(${ARG_NAME} ${ARG_SRCS})
  target_compile_options(${ARG_NAME} PRIVATE ${KVCTL_WARNINGS})
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS})
endfunction()

# One Catch2 executable per test folder; every TEST_CASE becomes its own CTest test.
function(kvctl_cc_test)
  cmake_parse_arguments(ARG "EXCLUDE_FROM_ALL;OPTIMIZED" "NAME" "SRCS;DEPS;PROPERTIES" ${ARGN})
  if(ARG_EXCLUDE_FROM_ALL)
    add_executable(${ARG_NAME} EXCLUDE_FROM_ALL ${ARG_SRCS})
  else()
    add_executable(${ARG_NAME} ${ARG_SRCS})
  endif()
  # Release tests at -O1: their run time is in the libraries, which stay at -O3, and -O1 compiles
  # them in a quarter less CPU (every test binary: 244 s at -O3, 182 s at -O1 on 2 AMD EPYC vCPUs,
  # 2026-12-04): Catch's assertion macros expand to much code that -O3 inlines.
  target_compile_options(${ARG_NAME} PRIVATE ${KVCTL_WARNINGS} $<$<CONFIG:Release>:-O1>)
  if(KVCTL_TEST_OPT_LEVEL AND NOT ARG_OPTIMIZED)
    target_compile_options(${ARG_NAME} PRIVATE ${KVCTL_TEST_OPT_LEVEL})  # After the config's -O.
  endif()
  target_link_libraries(${ARG_NAME} PRIVATE ${ARG_DEPS} kvctl_catch_main)
  # Catch's header precompiled once per test binary: parsing it was about a third of a test file's
  # compile (tests' CPU 99 -> 63 s over policies_test and sequence_test, 2026-12-06).
  target_precompile_headers(${ARG_NAME} PRIVATE <catch2/catch.hpp>)
  set_target_properties(${ARG_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(ARG_EXCLUDE_FROM_ALL)
    return()
  endif()
  catch_discover_tests(${ARG_NAME} TEST_PREFIX "${ARG_NAME}: "
                       EXTRA_ARGS --warn NoTests
                       PROPERTIES SKIP_RETURN_CODE 77 ${ARG_PROPERTIES})
endfunction()
