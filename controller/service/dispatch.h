// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/service/dispatch.h
// Dispatch: hands one decoded request to the Controller call that answers it and returns the reply
// as a ReplyBody (or the call's error Status). The daemon (controller/daemon/daemon.cc) serves
// every request through it (light ones through DispatchLight first), and so does the request-path
// fuzzer (tests/fuzz/), so what is fuzzed is what is served. Every request type has its branch: a
// type added to ipc::RequestBody without one fails to compile here.
//
// Thread safety: as the Controller (any thread).
//
//   StatusOr<ipc::ReplyBody> reply = Dispatch(controller, request.body, Now());
//   reply.ok() ? responder.Reply(std::move(reply).value()) : responder.Error(reply.status());
#ifndef KVCTL_CONTROLLER_SERVICE_DISPATCH_H_
#define KVCTL_CONTROLLER_SERVICE_DISPATCH_H_

#include "common/status.h"
#include "controller/service/controller.h"
#include "ipc/messages.h"

namespace kvctl {

// Never returns an ipc::ErrorReply body: errors come back as the Status.
StatusOr<ipc::ReplyBody> Dispatch(Controller& controller, const ipc::RequestBody& body,
                                  SteadyTime now);

// Which requests may be answered without a worker thread (server.inline_*).
struct LightLimits {
  int64_t append_tokens = 0;     // APPENDs of at most this many tokens (0 = none).
  bool blocks_fetch = false;     // Blocks FETCHes.
  int64_t dense_fetch_rows = 0;  // Dense FETCHes that decode at most this many rows (0 = none).
};
// The daemon's I/O-thread path: an APPEND or FETCH within `limits` that the Controller finds
// cheap now (Controller::Append/Fetch with `deferred`) is answered; anything else sets *deferred
// with nothing done, for Dispatch on a worker.
StatusOr<ipc::ReplyBody> DispatchLight(Controller& controller, const ipc::RequestBody& body,
                                       SteadyTime now, const LightLimits& limits, bool* deferred);

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_SERVICE_DISPATCH_H_
