// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/service/dispatch.h"

#include <type_traits>
#include <variant>

namespace kvctl {
namespace {

template <typename T>
inline constexpr bool kAlwaysFalse = false;

// A typed reply (or its error) as a ReplyBody.
template <typename R>
StatusOr<ipc::ReplyBody> AsBody(StatusOr<R> reply) {
  if (!reply.ok()) return reply.status();
  return ipc::ReplyBody(std::move(reply).value());
}

}  // namespace

StatusOr<ipc::ReplyBody> Dispatch(Controller& controller, const ipc::RequestBody& body,
                                  SteadyTime now) {
  return std::visit(
      [&](const auto& request) -> StatusOr<ipc::ReplyBody> {
        using T = std::decay_t<decltype(request)>;
        if constexpr (std::is_same_v<T, ipc::HelloRequest>) {
          return AsBody(controller.Hello(request, now));
        } else if constexpr (std::is_same_v<T, ipc::OpenRequest>) {
          KVCTL_RETURN_IF_ERROR(controller.Open(request, now));
          return ipc::ReplyBody(ipc::OpenReply{});
        } else if constexpr (std::is_same_v<T, ipc::CloseRequest>) {
          return AsBody(controller.Close(request, now));
        } else if constexpr (std::is_same_v<T, ipc::PingRequest>) {
          return AsBody(controller.Ping(request, now));
        } else if constexpr (std::is_same_v<T, ipc::AppendRequest>) {
          return AsBody(controller.Append(request, now));
        } else if constexpr (std::is_same_v<T, ipc::FetchRequest>) {
          return controller.Fetch(request, now);
        } else if constexpr (std::is_same_v<T, ipc::StatsRequest>) {
          KVCTL_ASSIGN_OR_RETURN(std::string text, controller.Stats(request, now));
          return ipc::ReplyBody(ipc::StatsReply{std::move(text)});
        } else if constexpr (std::is_same_v<T, ipc::ByeRequest>) {
          return AsBody(controller.Bye(request, now));
        } else if constexpr (std::is_same_v<T, ipc::SavePrefixRequest>) {
          return AsBody(controller.SavePrefix(request, now));
        } else if constexpr (std::is_same_v<T, ipc::OpenPrefixRequest>) {
          return AsBody(controller.OpenPrefix(request, now));
        } else {
          static_assert(kAlwaysFalse<T>, "a request type without a Controller call");
        }
      },
      body);
}

StatusOr<ipc::ReplyBody> DispatchLight(Controller& controller, const ipc::RequestBody& body,
                                       SteadyTime now, const LightLimits& limits, bool* deferred) {
  *deferred = true;
  if (const auto* append = std::get_if<ipc::AppendRequest>(&body);
      append != nullptr && append->n_tokens <= limits.append_tokens) {
    *deferred = false;
    return AsBody(controller.Append(*append, now, deferred));
  }
  if (const auto* fetch = std::get_if<ipc::FetchRequest>(&body); fetch != nullptr) {
    const bool blocks = fetch->mode == ipc::FetchMode::kBlocks;
    if (blocks ? limits.blocks_fetch : limits.dense_fetch_rows > 0) {
      *deferred = false;
      return controller.Fetch(*fetch, now, deferred, limits.dense_fetch_rows);
    }
  }
  return Unavailable("deferred to a worker");
}

}  // namespace kvctl
