// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/controller_internal.h (internal to controller/)
// The session and sequence records behind Controller, shared by its request logic
// (controller.cc) and its stats report (controller_stats.cc).
#ifndef KVCTL_CONTROLLER_SERVICE_CONTROLLER_INTERNAL_H_
#define KVCTL_CONTROLLER_SERVICE_CONTROLLER_INTERNAL_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "controller/service/controller.h"

namespace kvctl {

struct Controller::SequenceEntry {
  std::mutex mu;
  SteadyTime opened;
  std::unique_ptr<KvSequence> seq;  // Guarded by mu.
  HostShape shape;                  // Set before the entry is shared; read-only after.
  uint64_t open_host_bytes = 0;     // KvSequence::HostBytesAtOpen(shape).
  uint64_t host_bytes = 0;  // Charged to the host budget now; guarded by mu (0 once retired).
};

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
