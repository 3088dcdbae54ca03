// A real kvctl daemon process for integration tests: writes a TOML config into a temp dir,
// fork/execs build/bin/kvctl on a private ipc endpoint, stats endpoint and shm name, waits until
// PING answers.
#ifndef KVCTL_TESTS_INTEGRATION_DAEMON_PROCESS_H_
#define KVCTL_TESTS_INTEGRATION_DAEMON_PROCESS_H_

#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
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
  // With start = false nothing runs yet: call Start() or RunToExit().
  explicit DaemonProcess(const std::string& extra_toml, const std::string& server_toml = "",
                         const std::string& tag = "d", bool start = true)
      : extra_toml_server_(server_toml) {
    static int counter = 0;
    const std::string id = std::to_string(getpid()) + "-" + tag + std::to_string(counter++);
    dir_ = "/tmp/kvctl-it-" + id;
    mkdir(dir_.c_str(), 0700);
    socket_ = dir_ + "/kvctl.sock";
    endpoint_ = "ipc://" + socket_;
    stats_socket_ = dir_ + "/stats.sock";
    shm_ = "/kvctl-it-" + id;
    config_ = dir_ + "/kvctl.toml";
    WriteConfig(extra_toml);
    if (start) Start();
  }
  ~DaemonProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    // A killed daemon leaves its pool object for the next start to reclaim; no next start comes.
    shm_unlink(shm_.c_str());
    std::string cmd = "rm -rf " + dir_;
    (void)!std::system(cmd.c_str());
  }

  void WriteConfig(const std::string& extra_toml) {
    std::ofstream f(config_);
    f << "[server]\nendpoint = \"" << endpoint_ << "\"\nlog_level = \"warn\"\n";
    // Every daemon publishes stats on its own socket unless the test chooses the endpoint.
    if (extra_toml_server_.find("stats_endpoint") == std::string::npos) {
      f << "stats_endpoint = \"ipc://" << stats_socket_ << "\"\n";
    }
    f << extra_toml_server_ << "\n[pool]\nshm_name = \"" << shm_ << "\"\n" << extra_toml << "\n";
  }

  // Starts the daemon with the same command every time and waits (up to 60 s) until it answers
  // PING; returns the seconds from fork to that answer. Throws if it exits first.
  double Start() {
    const auto t0 = std::chrono::steady_clock::now();
    pid_ = Spawn();
    const auto deadline = t0 + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("kvctl exited at start with status " + std::to_string(status) +
                                 "; config " + config_);
      }
      // A socket file that accepts connections is bound (a dead daemon's leftover refuses
      // them); only then a PING, so ZeroMQ's reconnect interval does not blur the time.
      if (Listening(socket_)) {
        auto client = ipc::Client::Connect(endpoint_, 5000);
        if (client.ok() && (*client)->Ping().ok()) {
          return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    throw std::runtime_error("kvctl did not answer PING within 60 s");
  }

  // Runs the daemon's start command to its end (up to 60 s) and returns the exit code; for
  // configurations it must refuse.
  int RunToExit() {
    const pid_t pid = Spawn();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) != pid) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        throw std::runtime_error("kvctl kept running; it was expected to refuse " + config_);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Whether a process accepts connections on the Unix socket `path`.
  static bool Listening(const std::string& path) {
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return false;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    const bool ok = connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0;
    close(fd);
    return ok;
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

  // Generous by default: a timeout only ends a wait for a daemon that does not answer, and a
  // sanitizer build on a saturated machine can take seconds to answer (a 200-token APPEND under
  // TSan timed out at 5 s beside two other jobs, session 43). Tests of timeouts set their own.
  std::unique_ptr<ipc::Client> Connect(int timeout_ms = 30000) {
    auto c = ipc::Client::Connect(endpoint_, timeout_ms);
    if (!c.ok()) throw std::runtime_error(c.status().ToString());
    return std::move(c).value();
  }

  const std::string& endpoint() const { return endpoint_; }
  const std::string& socket_path() const { return socket_; }
  const std::string& shm_name() const { return shm_; }
  const std::string& config_path() const { return config_; }
  const std::string& stats_socket_path() const { return stats_socket_; }
  const std::string& dir() const { return dir_; }
  pid_t pid() const { return pid_; }

 private:
  pid_t Spawn() {
    const pid_t pid = fork();
    if (pid == 0) {
      execl(KVCTL_BIN, KVCTL_BIN, "--config", config_.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    return pid;
  }

  std::string extra_toml_server_;
  std::string dir_, socket_, endpoint_, stats_socket_, shm_, config_;
  pid_t pid_ = -1;
};

}  // namespace kvctl::testing

#endif  // KVCTL_TESTS_INTEGRATION_DAEMON_PROCESS_H_
