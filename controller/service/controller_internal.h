// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/controller_internal.h (internal to controller/)
// The session record behind Controller, shared by its request logic (controller.cc), its stats
// report (controller_stats.cc) and the scrubber (scrubber.cc). Its fields are written under
// Controller::mu_ (or before the session is shared, or after it left the table); a nested
// record's annotation cannot name its owner's mutex, so the rule is checked by reading. The
// sequence record (Controller::SequenceEntry) is in controller.h, where its annotations are.
#ifndef KVCTL_CONTROLLER_SERVICE_CONTROLLER_INTERNAL_H_
#define KVCTL_CONTROLLER_SERVICE_CONTROLLER_INTERNAL_H_

#include <map>
#include <memory>
#include <string>

#include "controller/service/controller.h"

namespace kvctl {

struct Controller::Session {
  uint64_t id = 0;      // Random: the capability to this session; never shown in stats.
  uint64_t number = 0;  // 1, 2, ... in HELLO order: what stats show.
  std::string client_name, model_name;
  ipc::Geometry geometry;
  bool has_staging = false;
  StagingSlot staging;  // A cpu pool's: offset 0 of staging_object. A cuda pool's: in the pool.
  std::shared_ptr<StagingObject> staging_object;  // cpu pool: this session's own shm object.
  SteadyTime last_seen;
  uint64_t host_bytes = 0;  // Charged to the host budget for the session itself.
  std::map<uint64_t, std::shared_ptr<SequenceEntry>> sequences;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_CONTROLLER_INTERNAL_H_
