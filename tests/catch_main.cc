// Shared Catch2 entry point for every test binary.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
