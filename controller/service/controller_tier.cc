// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// The cluster tier's requests (SAVE_PREFIX, OPEN_PREFIX), kept apart from controller.cc's
// request logic.
#include <spdlog/spdlog.h>

#include "controller/service/controller.h"
#include "controller/service/controller_internal.h"

namespace kvctl {

StatusOr<ipc::SavePrefixReply> Controller::SavePrefix(const ipc::SavePrefixRequest& request,
                                                      SteadyTime now) {
  // The session and sequence are checked first, so a client learns about a wrong id before it
  // learns there is no tier.
  KVCTL_RETURN_IF_ERROR(FindSequence(request.session_id, request.sequence_id, now).status());
  return FailedPrecondition("SAVE_PREFIX: this daemon has no cluster tier (tier.nodes is \"\")");
}

StatusOr<ipc::OpenPrefixReply> Controller::OpenPrefix(const ipc::OpenPrefixRequest& request,
                                                      SteadyTime now) {
  KVCTL_RETURN_IF_ERROR(Open(ipc::OpenRequest{request.session_id, request.sequence_id}, now));
  return ipc::OpenPrefixReply{0};
}

}  // namespace kvctl
