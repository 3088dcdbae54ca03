// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: tests/controller/service/service_test_util.h
// Shared by the service tests: a Controller made from a config, or the test fails with the
// reason.
//
//   std::unique_ptr<Controller> c = testing::MakeController(config);
#ifndef KVCTL_TESTS_CONTROLLER_SERVICE_SERVICE_TEST_UTIL_H_
#define KVCTL_TESTS_CONTROLLER_SERVICE_SERVICE_TEST_UTIL_H_

#include <catch2/catch.hpp>
#include <memory>

#include "controller/service/controller.h"

namespace kvctl::testing {

inline std::unique_ptr<Controller> MakeController(const Config& config) {
  StatusOr<std::unique_ptr<Controller>> made = Controller::Create(config);
  INFO(made.status().ToString());
  REQUIRE(made.ok());
  return std::move(made).value();
}

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_CONTROLLER_SERVICE_SERVICE_TEST_UTIL_H_
