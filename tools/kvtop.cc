// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
//
// kvtop: live terminal monitor of a kvctl daemon (docs/stats.md). Full screen, it follows the
// daemon's stats PUB stream; `--once` prints one snapshot fetched with a STATS request (plain text,
// or JSON with --json) and exits, for scripts. `--config FILE` reads both endpoints from the
// daemon's own config file.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>

#include "common/file_util.h"
#include "controller/config/config.h"
#include "ipc/client.h"
#include "tools/kvtop_render.h"
#include "tools/kvtop_stats.h"
#include "tools/kvtop_ui.h"

namespace {

int Once(const std::string& endpoint, int timeout_ms, bool json, int width) {
  auto client = kvctl::ipc::Client::Connect(endpoint, timeout_ms);
  if (!client.ok()) {
    std::fprintf(stderr, "kvtop: bad --endpoint %s: %s\n", endpoint.c_str(),
                 client.status().ToString().c_str());
    return 1;
  }
  kvctl::StatusOr<std::string> text = (*client)->Stats();
  if (!text.ok()) {
    std::fprintf(stderr, "kvtop: kvctl not reachable at %s: %s\n", endpoint.c_str(),
                 text.status().ToString().c_str());
    return 1;
  }
  kvctl::StatusOr<kvctl::kvtop::StatsText> parsed = kvctl::kvtop::ParseStatsText(*text);
  if (!parsed.ok()) {
    std::fprintf(stderr, "kvtop: the STATS reply from %s does not parse: %s\n", endpoint.c_str(),
                 parsed.status().ToString().c_str());
    return 1;
  }
  const std::string out =
      json ? kvctl::kvtop::RenderJson(*parsed)
           : kvctl::kvtop::RenderPlain(kvctl::kvtop::BuildSnapshot(*std::move(parsed)), width);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

// The [server] endpoints of the daemon's config `file`, with the KVCTL_* environment applied on
// top as the daemon applies it. Only the keys are checked, not the cross-key rules, so a relative
// budget.profile path does not stop kvtop from starting in another directory.
kvctl::StatusOr<kvctl::ServerConfig> ServerOf(const std::string& file) {
  KVCTL_ASSIGN_OR_RETURN(std::string text, kvctl::ReadWholeFile(file, "the config file"));
  kvctl::Config config;
  KVCTL_RETURN_IF_ERROR(kvctl::ApplyToml(config, text, file));
  KVCTL_RETURN_IF_ERROR(kvctl::ApplyEnvOverrides(config, kvctl::SystemEnv));
  return config.server;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kvtop: live monitor of a kvctl daemon: pool, request rates and latencies, tokens per "
      "layer, bits and sampled quality per head, sequences. Keys: q quit, ? help, s sort, "
      "arrows or l layer, p pause."};
  std::string stats_endpoint = "ipc:///tmp/kvctl-stats.sock";
  std::string endpoint = "ipc:///tmp/kvctl.sock";
  std::string config_file;
  bool once = false, json = false, no_color = false;
  int timeout_ms = 2000, width = 100;
  app.add_option("--stats-endpoint", stats_endpoint,
                 "The daemon's stats PUB endpoint (server.stats_endpoint); \"\" = poll STATS on "
                 "--endpoint instead")
      ->envname("KVCTL_SERVER_STATS_ENDPOINT")
      ->capture_default_str();
  app.add_option("--endpoint", endpoint,
                 "The daemon's request endpoint (server.endpoint), for --once and as the fallback "
                 "when the stats stream is silent")
      ->envname("KVCTL_SERVER_ENDPOINT")
      ->capture_default_str();
  app.add_option("--config", config_file,
                 "The daemon's TOML config file: --stats-endpoint and --endpoint default to its "
                 "server.stats_endpoint and server.endpoint (KVCTL_* applied as the daemon does)")
      ->envname("KVCTL_CONFIG");
  app.add_flag("--once", once, "Print one snapshot (a STATS request on --endpoint) and exit");
  app.add_flag("--json", json, "With --once: print the stats as JSON (sections -> fields)")
      ->needs(app.get_option("--once"));
  app.add_flag("--no-color", no_color, "No colors: bold and reverse video only");
  app.add_option("--timeout-ms", timeout_ms, "STATS request timeout for --once")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  app.add_option("--width", width, "Width of the plain --once snapshot's header lines")
      ->check(CLI::Range(40, 1000))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (!config_file.empty()) {
    // An endpoint flag on the command line wins; one CLI11 took from KVCTL_* equals the config's.
    kvctl::StatusOr<kvctl::ServerConfig> server = ServerOf(config_file);
    if (!server.ok()) {
      std::fprintf(stderr, "kvtop: --config: %s\n", server.status().message().c_str());
      return 1;
    }
    if (app.get_option("--endpoint")->count() == 0) endpoint = server->endpoint;
    if (app.get_option("--stats-endpoint")->count() == 0) stats_endpoint = server->stats_endpoint;
  }

  if (once) return Once(endpoint, timeout_ms, json, width);
  if (!isatty(STDOUT_FILENO) || !isatty(STDIN_FILENO)) {
    std::fprintf(stderr,
                 "kvtop: the live view needs a terminal; use --once (or --once --json) for a "
                 "snapshot\n");
    return 1;
  }
  return kvctl::kvtop::RunUi({.stats_endpoint = stats_endpoint,
                              .endpoint = endpoint,
                              .color = !no_color,
                              .request_timeout_ms = std::min(timeout_ms, 500)});
}
