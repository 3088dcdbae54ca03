// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: ipc/client.h
// Client: the C++ client library of the kvctl protocol, for engines, tools and tests. A DEALER
// socket; every call sends one request with a fresh request id and waits at most timeout_ms for
// the reply with that id, dropping stale replies to earlier (timed-out) requests. On a timeout
// the socket is closed and recreated (the "Lazy Pirate" pattern), so one dead or restarted server
// never wedges the client; the timed-out request is not retried (APPEND is not idempotent).
// ERROR replies come back as the Status they carry.
//
// Thread safety: not thread-safe; use one Client per thread (they are cheap).
//
//   KVCTL_ASSIGN_OR_RETURN(auto client, Client::Connect("ipc:///run/kvctl.sock", 2000));
//   KVCTL_ASSIGN_OR_RETURN(HelloReply hello, client->Hello({.client_name = "vllm", ...}));
//   KVCTL_RETURN_IF_ERROR(client->Open(hello.session_id, /*sequence_id=*/1).status());
#ifndef KVCTL_IPC_CLIENT_H_
#define KVCTL_IPC_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <zmq.hpp>

#include "common/status.h"
#include "ipc/messages.h"
#include "ipc/protocol.h"

namespace kvctl::ipc {

// Which tokens an APPEND adds.
struct AppendArgs {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;
  uint64_t first_position = 0;
  uint32_t n_tokens = 0;
  // APPEND_CONTINUES: more tokens of the same prefill follow; the daemon defers eviction until
  // an APPEND without it (PROTOCOL.md 4.4).
  bool continues = false;
};

class Client {
 public:
  // Creates the socket and starts connecting; does not wait for the server (the first call does).
  // Errors: INVALID_ARGUMENT for a malformed endpoint or timeout_ms < 1.
  static StatusOr<std::unique_ptr<Client>> Connect(std::string_view endpoint, int timeout_ms);

  // Typed calls. Each returns the reply, the Status of an ERROR reply, INVALID_ARGUMENT if the
  // request itself is invalid (nothing is sent), DEADLINE_EXCEEDED after timeout_ms without a
  // reply, UNAVAILABLE if the socket failed, INTERNAL if the server sent a malformed reply.
  StatusOr<HelloReply> Hello(HelloRequest request);
  StatusOr<OpenReply> Open(uint64_t session_id, uint64_t sequence_id);
  StatusOr<CloseReply> Close(uint64_t session_id, uint64_t sequence_id);
  StatusOr<PingReply> Ping(uint64_t session_id = 0);
  // K and V (and Q if non-empty) as [layers, n_tokens, heads, head_dim] in the session dtype;
  // copied once into the message.
  StatusOr<AppendReply> AppendInline(const AppendArgs& args, std::span<const std::byte> k,
                                     std::span<const std::byte> v,
                                     std::span<const std::byte> q = {});
  // The tensors are already in the staging slot at `staging_offset`.
  StatusOr<AppendReply> AppendStaging(const AppendArgs& args, uint64_t staging_offset, bool has_q);
  StatusOr<FetchDenseReply> FetchDense(uint64_t session_id, uint64_t sequence_id,
                                       uint32_t layer_begin, uint32_t layer_end,
                                       DType out_dtype = DType::kF16);
  // The page table only: records and window rows stay in the pool (PROTOCOL.md 4.5). With
  // `held`, an earlier table of the same range as this returns them, the daemon lists only the
  // records that are new since it (PROTOCOL.md 4.5, "Only what is new"); either way the result
  // is the whole table (record_base all 0).
  StatusOr<FetchBlocksReply> FetchBlocks(uint64_t session_id, uint64_t sequence_id,
                                         uint32_t layer_begin, uint32_t layer_end,
                                         const FetchBlocksReply* held = nullptr);
  // The reply itself to a FETCH with `held`'s known table (record_base > 0 where the daemon
  // listed only newer records); MergeBlocksReply(held, reply) is what FetchBlocks returns.
  StatusOr<FetchBlocksReply> FetchBlocksSince(uint64_t session_id, uint64_t sequence_id,
                                              uint32_t layer_begin, uint32_t layer_end,
                                              const FetchBlocksReply& held);
  // The INFO-style text; `section` "" = all sections.
  StatusOr<std::string> Stats(uint64_t session_id = 0, std::string_view section = "");
  // Ends the session: the daemon frees its sequences and staging slot at once instead of when
  // the lease runs out; the id names nothing afterwards.
  StatusOr<ByeReply> Bye(uint64_t session_id);
  // The cluster tier's prefix calls (PROTOCOL.md 4.9): tokens are the sequence's / prompt's ids.
  StatusOr<SavePrefixReply> SavePrefix(uint64_t session_id, uint64_t sequence_id,
                                       std::span<const int32_t> tokens);
  StatusOr<OpenPrefixReply> OpenPrefix(uint64_t session_id, uint64_t sequence_id,
                                       std::span<const int32_t> tokens);

  // Any request; the reply body is of the matching type (an ERROR reply becomes its Status).
  StatusOr<ReplyBody> Call(RequestBody request);

  // REQUIRES: timeout_ms >= 1.
  void set_timeout_ms(int timeout_ms) { timeout_ms_ = timeout_ms; }
  int timeout_ms() const { return timeout_ms_; }
  const std::string& endpoint() const { return endpoint_; }
  uint64_t stale_replies_dropped() const { return stale_replies_; }
  uint64_t socket_resets() const { return socket_resets_; }

  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

 private:
  Client() = default;
  Status ResetSocket();
  template <typename R>
  StatusOr<R> CallAs(RequestBody request);

  std::string endpoint_;
  std::string address_;
  bool ipv6_ = false;
  int timeout_ms_ = 1000;
  uint64_t next_request_id_ = 1;
  uint64_t stale_replies_ = 0;
  uint64_t socket_resets_ = 0;
  zmq::context_t ctx_;
  zmq::socket_t socket_;
};

// Makes `request` carry `held`'s known table: per pair, its records and its table tag.
void SetKnownTable(const FetchBlocksReply& held, FetchRequest* request);

// The whole table from `reply` and the table it was asked with: pair i's first
// reply.record_base[i] record ids (and side ids) come from `held`, the rest from the reply.
// Fails if the reply's range differs or a base is neither 0 nor what `held` lists for that pair
// (the count its known table sent).
// REQUIRES: held.record_base is all 0 (a whole table).
StatusOr<FetchBlocksReply> MergeBlocksReply(const FetchBlocksReply& held, FetchBlocksReply reply);

}  // namespace kvctl::ipc

#endif  // KVCTL_IPC_CLIENT_H_
