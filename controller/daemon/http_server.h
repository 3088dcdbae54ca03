// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// File: controller/daemon/http_server.h
// A tiny loopback HTTP/1.1 server (Boost.Beast) for operators: GET /metrics (Prometheus text,
// rendered on each request) and GET /healthz ("ok"). One thread, one request per connection, so a
// slow scraper costs nothing but its own socket; anything else gets 404 or 405.
//
// Thread safety: Start and Stop from one thread; the callbacks run on the server's thread.
//
//   KVCTL_ASSIGN_OR_RETURN(auto http, HttpServer::Start("127.0.0.1:9464", [&] { return text; }));
#ifndef KVCTL_CONTROLLER_DAEMON_HTTP_SERVER_H_
#define KVCTL_CONTROLLER_DAEMON_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace kvctl {

class HttpServer {
 public:
  using MetricsFn = std::function<std::string()>;

  // Binds HOST:PORT (loopback only; port 0 picks a free one) and starts serving.
  static StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address, MetricsFn metrics);
  ~HttpServer();  // Stops.

  // "127.0.0.1:9464" with the bound port.
  const std::string& address() const { return address_; }

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl, std::string address);
  std::unique_ptr<Impl> impl_;
  std::string address_;
};

}  // namespace kvctl

#endif  // KVCTL_CONTROLLER_DAEMON_HTTP_SERVER_H_
