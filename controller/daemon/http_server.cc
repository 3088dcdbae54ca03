// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "controller/daemon/http_server.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <thread>

namespace kvctl {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

struct HttpServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  MetricsFn metrics;
  std::thread thread;

  void Accept() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) return;  // Acceptor closed: stopping.
      Serve(std::move(socket));
      Accept();
    });
  }

  void Serve(tcp::socket socket) {
    boost::beast::flat_buffer buffer;
    http::request<http::string_body> req;
    boost::system::error_code ec;
    // A client that connects and says nothing must not hold the server: 2 s to send a request.
    const timeval timeout{2, 0};
    setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    http::read(socket, buffer, req, ec);
    if (ec) return;
    http::response<http::string_body> res;
    res.version(req.version());
    res.keep_alive(false);
    const std::string target(req.target());
    if (req.method() != http::verb::get && req.method() != http::verb::head) {
      res.result(http::status::method_not_allowed);
      res.body() = "only GET\n";
    } else if (target == "/metrics") {
      res.result(http::status::ok);
      res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = metrics();
    } else if (target == "/healthz") {
      res.result(http::status::ok);
      res.set(http::field::content_type, "text/plain");
      res.body() = "ok\n";
    } else {
      res.result(http::status::not_found);
      res.body() = "not found: try /metrics or /healthz\n";
    }
    res.prepare_payload();
    http::write(socket, res, ec);
    socket.shutdown(tcp::socket::shutdown_send, ec);
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl, std::string address)
    : impl_(std::move(impl)), address_(std::move(address)) {}

HttpServer::~HttpServer() {
  asio::post(impl_->io, [impl = impl_.get()] {
    boost::system::error_code ec;
    impl->acceptor.close(ec);
  });
  impl_->io.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                        MetricsFn metrics) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return InvalidArgument("http_address: got \"", address, "\", expected HOST:PORT");
  }
  std::string host = address.substr(0, colon);
  if (host == "localhost") host = "127.0.0.1";
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  boost::system::error_code ec;
  const asio::ip::address ip = asio::ip::make_address(host, ec);
  if (ec || !ip.is_loopback()) {
    return InvalidArgument("http_address: got \"", address, "\", expected a loopback address");
  }
  const int port = std::atoi(address.substr(colon + 1).c_str());
  auto impl = std::make_unique<Impl>();
  impl->metrics = std::move(metrics);
  const tcp::endpoint endpoint(ip, static_cast<uint16_t>(port));
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Unavailable("http_address: cannot listen on ", address, ": ", ec.message());
  const std::string bound = host + ":" + std::to_string(impl->acceptor.local_endpoint().port());
  impl->Accept();
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->io.run(); });
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl), bound));
}

}  // namespace kvctl
