// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// kvctl: the KV-cache memory daemon, in the foreground, logging one line per event on stderr
// (docs/operations.md). Flags override the TOML file; each flag has a KVCTL_* environment mirror
// (configs/README.md lists every key); precedence CLI > env > file > default.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "controller/config/config.h"
#include "controller/daemon/daemon.h"
#include "controller/daemon/dump_stats.h"
#include "controller/service/controller.h"

namespace {

// Named flags for the keys people change most; any key is reachable with --set KEY=VALUE.
struct FlagKey {
  const char* flag;
  const char* key;
};
constexpr FlagKey kFlags[] = {
    {"--endpoint", "server.endpoint"},  {"--log-level", "server.log_level"},
    {"--lease-ms", "server.lease_ms"},  {"--workers", "server.workers"},
    {"--pool-bytes", "pool.bytes"},     {"--shm-name", "pool.shm_name"},
    {"--quant-method", "quant.method"}, {"--k-bits", "quant.k_bits"},
    {"--v-bits", "quant.v_bits"},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kvctl: keeps the KV cache of LLM engines inside a byte budget (quantization and "
      "eviction per layer and KV head), served over ZeroMQ."};
  std::string config_file, check_file;
  bool print_config = false, version = false, dump_stats = false;
  int timeout_ms = 5000;
  std::vector<std::string> sets;
  std::vector<std::string> values(std::size(kFlags));
  app.add_option("--config", config_file,
                 "TOML config file (default: the built-in defaults, identical to "
                 "configs/default.toml)")
      ->envname("KVCTL_CONFIG");
  app.add_option("--check-config", check_file,
                 "Validate FILE, print the effective config and exit 0 (valid) or 1");
  app.add_flag("--print-config", print_config, "Print the effective config and exit");
  app.add_flag("--version", version, "Print the version and exit");
  app.add_flag("--dump-stats", dump_stats,
               "Ask the running daemon on server.endpoint (as --config, --set and KVCTL_* give "
               "it) for its version, effective config and one STATS snapshot, print them and "
               "exit (for support)");
  app.add_option("--timeout-ms", timeout_ms, "How long --dump-stats waits for the daemon")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str()
      ->needs(app.get_option("--dump-stats"));
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    const kvctl::ConfigOption* option = kvctl::FindConfigOption(kFlags[i].key);
    std::string help = std::string("Sets ") + kFlags[i].key;
    if (option != nullptr)
      help += " (default " + option->default_text + "; env " + option->env + ")";
    app.add_option(kFlags[i].flag, values[i], help);
  }
  app.add_option("--set", sets, "KEY=VALUE for any config key, e.g. --set pool.page_bytes=16KiB");
  CLI11_PARSE(app, argc, argv);

  if (version) {
    std::printf("kvctl %s\n", kvctl::kKvctlVersion);
    return 0;
  }
  kvctl::ConfigLoadOptions load;
  load.file = check_file.empty() ? config_file : check_file;
  load.env = kvctl::SystemEnv;
  for (size_t i = 0; i < std::size(kFlags); ++i) {
    if (!values[i].empty()) load.cli.emplace_back(kFlags[i].key, values[i]);
  }
  for (const std::string& s : sets) {
    const size_t eq = s.find('=');
    if (eq == std::string::npos || eq == 0) {
      std::fprintf(stderr, "kvctl: --set: got \"%s\", expected KEY=VALUE\n", s.c_str());
      return 1;
    }
    load.cli.emplace_back(s.substr(0, eq), s.substr(eq + 1));
  }
  kvctl::StatusOr<kvctl::Config> config = kvctl::LoadConfig(load);
  if (!config.ok()) {
    std::fprintf(stderr, "kvctl: %s\n", config.status().message().c_str());
    return 1;
  }
  if (dump_stats) return kvctl::DumpStats(*config, timeout_ms, stdout, stderr);
  if (!check_file.empty() || print_config) {
    std::cout << kvctl::PrintConfig(*config);
    if (!check_file.empty()) std::fprintf(stderr, "kvctl: %s is valid\n", check_file.c_str());
    return 0;
  }
  kvctl::StatusOr<std::unique_ptr<kvctl::Daemon>> daemon = kvctl::Daemon::Create(*config, load);
  if (!daemon.ok()) {
    std::fprintf(stderr, "kvctl: cannot start: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  return (*daemon)->Run();
}
