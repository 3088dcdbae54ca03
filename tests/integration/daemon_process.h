// A real kvctl daemon process for integration tests: writes a TOML config into a temp dir,
// fork/execs build/bin/kvctl on a private ipc endpoint and shm name, waits until PING answers.
#ifndef KVCTL_TESTS_INTEGRATION_DAEMON_PROCESS_H_
#define KVCTL_TESTS_INTEGRATION_DAEMON_PROCESS_H_

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "ipc/client.h"

namespace kvctl::testing {

class DaemonProcess {
 public:
  // `server_toml` goes into [server] (after endpoint and log level); `extra_toml` follows the
  // [pool] shm name, so it may hold more [pool] keys and then other tables.
  explicit DaemonProcess(const std::string& extra_toml, const std::string& server_toml = "",
                         const std::string& tag = "d")
      : extra_toml_server_(server_toml) {
    static int counter = 0;
    const std::string id = std::to_string(getpid()) + "-" + tag + std::to_string(counter++);
    dir_ = "/tmp/kvctl-it-" + id;
    mkdir(dir_.c_str(), 0700);
    socket_ = dir_ + "/kvctl.sock";
    endpoint_ = "ipc://" + socket_;
    shm_ = "/kvctl-it-" + id;
    config_ = dir_ + "/kvctl.toml";
    WriteConfig(extra_toml);
    Start();
  }
  ~DaemonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    std::string cmd = "rm -rf " + dir_;
    (void)!std::system(cmd.c_str());
  }

  void WriteConfig(const std::string& extra_toml) {
    std::ofstream f(config_);
    f << "[server]\nendpoint = \"" << endpoint_ << "\"\nlog_level = \"warn\"\n"
      << extra_toml_server_ << "\n[pool]\nshm_name = \"" << shm_ << "\"\n"
      << extra_toml << "\n";
  }

  void Start() {
    pid_ = fork();
    if (pid_ == 0) {
      execl(KVCTL_BIN, KVCTL_BIN, "--config", config_.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    auto client = ipc::Client::Connect(endpoint_, 200);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      if (client.ok() && (*client)->Ping().ok()) return;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("kvctl exited at start; config " + config_);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    throw std::runtime_error("kvctl did not answer PING within 20 s");
  }

  // Sends `sig` and waits; returns the exit code (or 128 + signal).
  int Stop(int sig = SIGTERM) {
    kill(pid_, sig);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  void Signal(int sig) { kill(pid_, sig); }

  std::unique_ptr<ipc::Client> Connect(int timeout_ms = 5000) {
    auto c = ipc::Client::Connect(endpoint_, timeout_ms);
    if (!c.ok()) throw std::runtime_error(c.status().ToString());
    return std::move(c).value();
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& shm_name() const { return shm_; }
  const std::string& config_path() const { return config_; }

 private:
  std::string extra_toml_server_;
  std::string dir_, socket_, endpoint_, shm_, config_;
  pid_t pid_ = -1;
};

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_INTEGRATION_DAEMON_PROCESS_H_
