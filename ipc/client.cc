// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "ipc/client.h"

#include <chrono>

#include "ipc/transport.h"

namespace kvctl::ipc {

StatusOr<std::unique_ptr<Client>> Client::Connect(std::string_view endpoint, int timeout_ms) {
  KVCTL_ASSIGN_OR_RETURN(Endpoint ep, ParseConnectEndpoint(endpoint));
  if (timeout_ms < 1) return InvalidArgument("timeout_ms: got ", timeout_ms, ", expected >= 1");
  std::unique_ptr<Client> c(new Client());
  c->endpoint_ = std::string(endpoint);
  c->address_ = ep.address;
  c->ipv6_ = ep.ipv6;
  c->timeout_ms_ = timeout_ms;
  KVCTL_RETURN_IF_ERROR(c->ResetSocket());
  c->socket_resets_ = 0;
  return c;
}

Client::~Client() = default;

Status Client::ResetSocket() {
  ++socket_resets_;
  try {
    // linger 0: an unanswered request dies with the old socket instead of reaching a restarted
    // server long after its caller gave up.
    socket_.close();
    socket_ = zmq::socket_t(ctx_, zmq::socket_type::dealer);
    socket_.set(zmq::sockopt::linger, 0);
    socket_.set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(kMaxTensorFrameBytes));
    if (ipv6_) socket_.set(zmq::sockopt::ipv6, 1);
    socket_.connect(address_);
  } catch (const zmq::error_t& e) {
    socket_.close();
    return Unavailable("connect ", endpoint_, ": ", e.what());
  }
  return OkStatus();
}

StatusOr<ReplyBody> Client::Call(RequestBody request) {
  using Clock = std::chrono::steady_clock;
  const MsgType type = TypeOf(request);
  const uint64_t id = next_request_id_++;
  // Named only in an error: building the string costs an allocation per call.
  const auto what = [&] {
    return TypeName(static_cast<uint16_t>(type)) + " request " + std::to_string(id);
  };
  KVCTL_ASSIGN_OR_RETURN(Frames frames, Encode(id, std::move(request)));
  if (!socket_) KVCTL_RETURN_IF_ERROR(ResetSocket());
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms_);
  try {
    Frames no_prefix;
    if (!SendMessage(socket_, no_prefix, frames)) {
      (void)ResetSocket();
      return Unavailable(what(), ": cannot queue the request to ", endpoint_, "; socket reset");
    }
    for (;;) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) {
        (void)ResetSocket();
        return DeadlineExceeded(what(), ": no reply from ", endpoint_, " within ", timeout_ms_,
                                " ms; socket reset");
      }
      const WaitResult wait = WaitForInput(socket_, /*wake_fd=*/-1, static_cast<int>(left.count()));
      Frames reply;
      size_t discarded = 0;
      while (wait.readable && RecvMessage(socket_, &reply, kMaxFrames, &discarded)) {
        if (reply.empty() || PeekRequestId(reply[0]) != id) {
          ++stale_replies_;  // The late answer to a request that already timed out.
          continue;
        }
        if (discarded > 0) {
          return Internal(what(), ": malformed reply: more than ", kMaxFrames, " frames");
        }
        StatusOr<Reply> decoded = DecodeReply(std::move(reply));
        if (!decoded.ok())
          return Internal(what(), ": malformed reply: ", decoded.status().message());
        ReplyBody& body = decoded->body;
        if (const auto* error = std::get_if<ErrorReply>(&body)) return ToStatus(*error);
        if (TypeOf(body) != (static_cast<uint16_t>(type) | kReplyBit)) {
          return Internal(what(), ": reply has type ", TypeName(TypeOf(body)));
        }
        return std::move(body);
      }
    }
  } catch (const zmq::error_t& e) {
    (void)ResetSocket();
    return Unavailable(what(), ": ", e.what());
  }
}

template <typename R>
StatusOr<R> Client::CallAs(RequestBody request) {
  KVCTL_ASSIGN_OR_RETURN(ReplyBody body, Call(std::move(request)));
  if (R* reply = std::get_if<R>(&body)) return std::move(*reply);
  return Internal(TypeName(TypeOf(body)), ": reply has the wrong form for the request");
}

StatusOr<HelloReply> Client::Hello(HelloRequest request) {
  return CallAs<HelloReply>(std::move(request));
}

StatusOr<OpenReply> Client::Open(uint64_t session_id, uint64_t sequence_id) {
  return CallAs<OpenReply>(OpenRequest{session_id, sequence_id});
}

StatusOr<CloseReply> Client::Close(uint64_t session_id, uint64_t sequence_id) {
  return CallAs<CloseReply>(CloseRequest{session_id, sequence_id});
}

StatusOr<PingReply> Client::Ping(uint64_t session_id) {
  return CallAs<PingReply>(PingRequest{session_id});
}

StatusOr<AppendReply> Client::AppendInline(const AppendArgs& args, std::span<const std::byte> k,
                                           std::span<const std::byte> v,
                                           std::span<const std::byte> q) {
  for (auto [name, t] : {std::pair{"k", k}, std::pair{"v", v}, std::pair{"q", q}}) {
    if (t.size() > kMaxTensorFrameBytes) {  // Refused before copying gigabytes.
      return InvalidArgument(name, ": ", t.size(), " bytes exceed the frame limit of ",
                             kMaxTensorFrameBytes, "; split the append into fewer tokens");
    }
  }
  AppendRequest req{.session_id = args.session_id,
                    .sequence_id = args.sequence_id,
                    .first_position = args.first_position,
                    .n_tokens = args.n_tokens,
                    .source = AppendSource::kInline,
                    .has_q = !q.empty()};
  req.continues = args.continues;
  req.k = zmq::message_t(k.data(), k.size());
  req.v = zmq::message_t(v.data(), v.size());
  if (!q.empty()) req.q = zmq::message_t(q.data(), q.size());
  return CallAs<AppendReply>(std::move(req));
}

StatusOr<AppendReply> Client::AppendStaging(const AppendArgs& args, uint64_t staging_offset,
                                            bool has_q) {
  return CallAs<AppendReply>(AppendRequest{.session_id = args.session_id,
                                           .sequence_id = args.sequence_id,
                                           .first_position = args.first_position,
                                           .n_tokens = args.n_tokens,
                                           .source = AppendSource::kStaging,
                                           .has_q = has_q,
                                           .staging_offset = staging_offset,
                                           .continues = args.continues});
}

StatusOr<FetchDenseReply> Client::FetchDense(uint64_t session_id, uint64_t sequence_id,
                                             uint32_t layer_begin, uint32_t layer_end,
                                             DType out_dtype) {
  return CallAs<FetchDenseReply>(
      FetchRequest{session_id, sequence_id, layer_begin, layer_end, FetchMode::kDense, out_dtype});
}

StatusOr<FetchBlocksReply> Client::FetchBlocks(uint64_t session_id, uint64_t sequence_id,
                                               uint32_t layer_begin, uint32_t layer_end,
                                               const FetchBlocksReply* held) {
  if (held == nullptr) {
    // out_dtype is ignored in blocks mode; fp16 is its default.
    KVCTL_ASSIGN_OR_RETURN(
        FetchBlocksReply reply,
        CallAs<FetchBlocksReply>(FetchRequest{session_id, sequence_id, layer_begin, layer_end,
                                              FetchMode::kBlocks, DType::kF16}));
    for (size_t i = 0; i < reply.record_base.size(); ++i) {
      if (reply.record_base[i] != 0) {
        return Internal("FETCH_REPLY: record_base[", i, "]: got ", reply.record_base[i],
                        ", expected 0 (no known table was sent)");
      }
    }
    return reply;
  }
  KVCTL_ASSIGN_OR_RETURN(FetchBlocksReply reply,
                         FetchBlocksSince(session_id, sequence_id, layer_begin, layer_end, *held));
  return MergeBlocksReply(*held, std::move(reply));
}

StatusOr<FetchBlocksReply> Client::FetchBlocksSince(uint64_t session_id, uint64_t sequence_id,
                                                    uint32_t layer_begin, uint32_t layer_end,
                                                    const FetchBlocksReply& held) {
  FetchRequest request{session_id, sequence_id,        layer_begin,
                       layer_end,  FetchMode::kBlocks, DType::kF16};
  SetKnownTable(held, &request);
  return CallAs<FetchBlocksReply>(std::move(request));
}

void SetKnownTable(const FetchBlocksReply& held, FetchRequest* request) {
  const size_t pairs = held.last_page_len.size();
  request->n_known = static_cast<uint32_t>(pairs);
  request->known_records.resize(pairs);
  for (size_t i = 0; i < pairs; ++i)
    request->known_records[i] = held.indptr[i + 1] - held.indptr[i];
  request->known_tags = held.table_tags;
}

StatusOr<FetchBlocksReply> MergeBlocksReply(const FetchBlocksReply& held, FetchBlocksReply reply) {
  const size_t pairs = reply.last_page_len.size();
  if (reply.layer_begin != held.layer_begin || reply.n_layers != held.n_layers ||
      held.last_page_len.size() != pairs) {
    return InvalidArgument("FETCH_REPLY: layers [", reply.layer_begin, ", +", reply.n_layers,
                           ") x ", pairs, " pairs, expected the held table's [", held.layer_begin,
                           ", +", held.n_layers, ") x ", held.last_page_len.size());
  }
  bool any_base = false;
  for (size_t i = 0; i < pairs; ++i) {
    const uint32_t held_records = held.indptr[i + 1] - held.indptr[i];
    if (reply.record_base[i] != 0 && reply.record_base[i] != held_records) {
      return InvalidArgument("record_base[", i, "]: got ", reply.record_base[i],
                             ", expected 0 or the held table's ", held_records, " records");
    }
    any_base = any_base || reply.record_base[i] > 0;
  }
  if (!any_base) return reply;
  const bool side = !reply.side_indices.empty();
  std::vector<uint32_t> indices, side_indices, indptr{0};
  for (size_t i = 0; i < pairs; ++i) {
    const uint32_t base = reply.record_base[i];
    const uint32_t from = held.indptr[i];
    indices.insert(indices.end(), held.indices.begin() + from, held.indices.begin() + from + base);
    indices.insert(indices.end(), reply.indices.begin() + reply.indptr[i],
                   reply.indices.begin() + reply.indptr[i + 1]);
    if (side) {
      for (uint32_t r = 0; r < base; ++r) {
        side_indices.push_back(held.side_indices.empty() ? kNoPage : held.side_indices[from + r]);
      }
      side_indices.insert(side_indices.end(), reply.side_indices.begin() + reply.indptr[i],
                          reply.side_indices.begin() + reply.indptr[i + 1]);
    }
    indptr.push_back(static_cast<uint32_t>(indices.size()));
    reply.record_base[i] = 0;
  }
  reply.indices = std::move(indices);
  reply.side_indices = std::move(side_indices);
  reply.indptr = std::move(indptr);
  return reply;
}

StatusOr<std::string> Client::Stats(uint64_t session_id, std::string_view section) {
  KVCTL_ASSIGN_OR_RETURN(StatsReply reply,
                         CallAs<StatsReply>(StatsRequest{session_id, std::string(section)}));
  return std::move(reply.text);
}

StatusOr<ByeReply> Client::Bye(uint64_t session_id) {
  return CallAs<ByeReply>(ByeRequest{session_id});
}

StatusOr<SavePrefixReply> Client::SavePrefix(uint64_t session_id, uint64_t sequence_id,
                                             std::span<const int32_t> tokens) {
  SavePrefixRequest req{session_id, sequence_id};
  req.tokens = zmq::message_t(tokens.data(), tokens.size_bytes());
  return CallAs<SavePrefixReply>(std::move(req));
}

StatusOr<OpenPrefixReply> Client::OpenPrefix(uint64_t session_id, uint64_t sequence_id,
                                             std::span<const int32_t> tokens) {
  OpenPrefixRequest req{session_id, sequence_id};
  req.tokens = zmq::message_t(tokens.data(), tokens.size_bytes());
  return CallAs<OpenPrefixReply>(std::move(req));
}

}  // namespace kvctl::ipc
