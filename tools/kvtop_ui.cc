// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvtop_ui.h"

#include <curses.h>
#include <langinfo.h>

#include <algorithm>
#include <clocale>
#include <csignal>
#include <cstring>
#include <ctime>
#include <memory>
#include <zmq.hpp>

#include "ipc/client.h"
#include "tools/kvtop_render.h"
#include "tools/kvtop_stats.h"

namespace kvctl::kvtop {
namespace {

using Clock = StatsFeed::Clock;
using std::chrono::milliseconds;

volatile std::sig_atomic_t g_quit = 0;
void OnSignal(int) { g_quit = 1; }

}  // namespace

StatsFeed::StatsFeed(UiOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { Loop(); });
}

StatsFeed::~StatsFeed() {
  stop_ = true;
  thread_.join();
}

std::optional<StatsFeed::Message> StatsFeed::Newest(uint64_t after) const {
  MutexLock lock(&mu_);
  if (newest_.seq <= after) return std::nullopt;
  return newest_;
}

milliseconds StatsFeed::StaleAfter() const {
  MutexLock lock(&mu_);
  return std::max(milliseconds(3000), 3 * interval_);
}

std::string StatsFeed::LastError() const {
  MutexLock lock(&mu_);
  return last_error_;
}

void StatsFeed::Publish(std::string text, bool from_pub) {
  const Clock::time_point now = Clock::now();
  MutexLock lock(&mu_);
  if (from_pub && newest_.seq > 0 && newest_.from_pub) {
    interval_ = std::chrono::duration_cast<milliseconds>(now - newest_.at);
  }
  newest_ = Message{newest_.seq + 1, std::move(text), now, from_pub};
  if (from_pub) last_error_.clear();
}

void StatsFeed::SetError(std::string error) {
  MutexLock lock(&mu_);
  last_error_ = std::move(error);
}

void StatsFeed::Loop() {
  zmq::context_t ctx(1);
  zmq::socket_t sub;
  if (!options_.stats_endpoint.empty()) {
    try {
      sub = zmq::socket_t(ctx, zmq::socket_type::sub);
      sub.set(zmq::sockopt::linger, 0);
      sub.set(zmq::sockopt::subscribe, "stats");
      sub.connect(options_.stats_endpoint);
    } catch (const zmq::error_t& e) {
      SetError("stats endpoint " + options_.stats_endpoint + ": " + e.what());
      sub = zmq::socket_t();
    }
  }
  std::unique_ptr<ipc::Client> client;
  Clock::time_point last_pub = Clock::now(), last_request{};
  while (!stop_) {
    std::string text;
    bool got = false;
    if (sub) {
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, milliseconds(100));
      // Drain: only the newest message matters.
      zmq::message_t topic, body;
      while (sub.recv(topic, zmq::recv_flags::dontwait)) {
        if (!topic.more()) continue;
        if (!sub.recv(body, zmq::recv_flags::dontwait)) break;
        while (body.more()) (void)!sub.recv(body, zmq::recv_flags::dontwait);
        if (topic.to_string_view() == "stats") {
          text = body.to_string();
          got = true;
        }
      }
    } else {
      std::this_thread::sleep_for(milliseconds(100));
    }
    const Clock::time_point now = Clock::now();
    if (got) {
      last_pub = now;
      Publish(std::move(text), true);
      continue;
    }
    // The stream is silent: off, the daemon is gone, or the interval is long. Ask directly, once
    // a second, after 1.5 s or 2.5 intervals of silence.
    milliseconds interval;
    {
      MutexLock lock(&mu_);
      interval = interval_;
    }
    if (options_.endpoint.empty() ||
        now - last_pub < std::max(milliseconds(1500), interval * 5 / 2) ||
        now - last_request < milliseconds(1000)) {
      continue;
    }
    last_request = now;
    if (!client) {
      StatusOr<std::unique_ptr<ipc::Client>> c =
          ipc::Client::Connect(options_.endpoint, options_.request_timeout_ms);
      if (!c.ok()) {
        SetError(c.status().ToString());
        continue;
      }
      client = std::move(c).value();
    }
    StatusOr<std::string> stats = client->Stats();
    if (stats.ok()) {
      Publish(std::move(stats).value(), false);
    } else {
      SetError(stats.status().ToString());
    }
  }
}

namespace {

class Painter {
 public:
  explicit Painter(bool color) {
    initscr();
    cbreak();
    noecho();
    keypad(stdscr, TRUE);
    curs_set(0);
    timeout(100);
    color_ = color && has_colors();
    if (color_) {
      start_color();
      use_default_colors();
      init_pair(1, COLOR_WHITE, COLOR_BLUE);  // Title bars.
      init_pair(2, COLOR_CYAN, -1);           // Section titles.
      init_pair(3, COLOR_RED, -1);            // Errors, bars past budget.
      init_pair(4, COLOR_GREEN, -1);          // Bars.
      init_pair(5, COLOR_BLACK, COLOR_BLUE);  // Heat 0 ...
      init_pair(6, COLOR_BLACK, COLOR_CYAN);
      init_pair(7, COLOR_BLACK, COLOR_GREEN);
      init_pair(8, COLOR_BLACK, COLOR_YELLOW);
      init_pair(9, COLOR_WHITE, COLOR_RED);  // ... heat 4.
    }
  }
  ~Painter() { endwin(); }

  void Paint(const std::vector<Line>& lines) {
    erase();
    for (size_t y = 0; y < lines.size(); ++y) {
      move(static_cast<int>(y), 0);
      for (const Span& span : lines[y]) {
        attrset(Attr(span.style));
        addstr(span.text.c_str());  // The bottom-right cell makes this return ERR; harmless.
      }
    }
    attrset(A_NORMAL);
    refresh();
  }

 private:
  attr_t Attr(Style style) const {
    if (!color_) {
      switch (style) {
        case Style::kTitle:
        case Style::kHeat4:
          return A_REVERSE;
        case Style::kSelected:
        case Style::kError:
          return A_REVERSE | A_BOLD;
        case Style::kSection:
        case Style::kBarOver:
        case Style::kHeat3:
          return A_BOLD;
        default:
          return A_NORMAL;
      }
    }
    switch (style) {
      case Style::kNormal:
        return A_NORMAL;
      case Style::kTitle:
        return COLOR_PAIR(1) | A_BOLD;
      case Style::kSection:
        return COLOR_PAIR(2) | A_BOLD;
      case Style::kDim:
        return A_DIM;
      case Style::kSelected:
        return A_REVERSE | A_BOLD;
      case Style::kError:
        return COLOR_PAIR(3) | A_BOLD;
      case Style::kBar:
        return COLOR_PAIR(4);
      case Style::kBarOver:
        return COLOR_PAIR(3) | A_BOLD;
      case Style::kHeat0:
      case Style::kHeat1:
      case Style::kHeat2:
      case Style::kHeat3:
      case Style::kHeat4:
        return COLOR_PAIR(5 + static_cast<int>(style) - static_cast<int>(Style::kHeat0));
    }
    return A_NORMAL;
  }

  bool color_ = false;
};

std::string ClockTime(std::chrono::system_clock::time_point t) {
  const std::time_t tt = std::chrono::system_clock::to_time_t(t);
  std::tm tm{};
  localtime_r(&tt, &tm);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  return buf;
}

// Moves the selected layer by `delta` positions among the layers present (wrapping if asked).
int MoveLayer(const Snapshot* s, int selected, int delta, bool wrap) {
  if (s == nullptr || s->layers.empty()) return selected;
  const int n = static_cast<int>(s->layers.size());
  int pos = 0;
  for (int i = 0; i < n; ++i) {
    if (s->layers[i].layer <= selected) pos = i;
  }
  pos = wrap ? ((pos + delta) % n + n) % n : std::clamp(pos + delta, 0, n - 1);
  return s->layers[pos].layer;
}

// The monitor's state between frames: the view the keys change and the snapshots from the feed
// (what is painted, the newest, and the one before it for rates).
class Monitor {
 public:
  Monitor(const UiOptions& options, Clock::time_point started)
      : options_(options), started_(started) {
    view_.unicode = std::strcmp(nl_langinfo(CODESET), "UTF-8") == 0;
  }

  // Applies one key; any key but q closes the help screen instead.
  void HandleKey(int ch) {
    if (view_.help && ch != 'q' && ch != 'Q') {
      view_.help = false;
      return;
    }
    const Snapshot* s = shown_.get();
    switch (ch) {
      case 'q':
      case 'Q':
        g_quit = 1;
        break;
      case '?':
      case 'h':
        view_.help = true;
        break;
      case 's':
      case 'S':
        view_.sort = NextSortKey(view_.sort);
        break;
      case 'p':
      case 'P':
        paused_ = !paused_;
        break;
      case KEY_UP:
      case KEY_LEFT:
        view_.selected_layer = MoveLayer(s, view_.selected_layer, -1, false);
        break;
      case KEY_DOWN:
      case KEY_RIGHT:
        view_.selected_layer = MoveLayer(s, view_.selected_layer, 1, false);
        break;
      case KEY_PPAGE:
        view_.selected_layer = MoveLayer(s, view_.selected_layer, -10, false);
        break;
      case KEY_NPAGE:
        view_.selected_layer = MoveLayer(s, view_.selected_layer, 10, false);
        break;
      case KEY_HOME:
        view_.selected_layer = MoveLayer(s, view_.selected_layer, -(1 << 20), false);
        break;
      case KEY_END:
        view_.selected_layer = MoveLayer(s, view_.selected_layer, 1 << 20, false);
        break;
      case 'l':
        view_.selected_layer = MoveLayer(s, view_.selected_layer, 1, true);
        break;
      case 'L':
        view_.selected_layer = MoveLayer(s, view_.selected_layer, -1, true);
        break;
      default:
        break;
    }
  }

  // Parses the feed's message newer than the last one taken into the latest snapshot and its
  // rates against the one before; true when that gave a new snapshot.
  bool TakeNewest(const StatsFeed& feed) {
    std::optional<StatsFeed::Message> m = feed.Newest(seen_);
    if (!m) return false;
    seen_ = m->seq;
    StatusOr<StatsText> text = ParseStatsText(m->text);
    if (!text.ok()) return false;
    previous_ = std::move(latest_);
    previous_at_ = latest_at_;
    latest_ = std::make_shared<const Snapshot>(BuildSnapshot(std::move(text).value()));
    latest_at_ = m->at;
    latest_wall_ = std::chrono::system_clock::now();
    latest_from_pub_ = m->from_pub;
    latest_rates_ = previous_ ? ComputeRates(*previous_, SecondsSinceStart(previous_at_), *latest_,
                                             SecondsSinceStart(latest_at_))
                              : Rates{};
    return true;
  }

  // Shows the latest snapshot, unless paused.
  void FollowLatest() {
    if (!paused_ && latest_ != shown_) {
      shown_ = latest_;
      shown_rates_ = latest_rates_;
    }
  }

  // Paints the snapshot shown, or why there is none: connecting, or the daemon is down.
  void Paint(const StatsFeed& feed, Clock::time_point now, Painter* painter) {
    const bool reachable = latest_ && now - latest_at_ < feed.StaleAfter();
    int height = 0, width = 0;
    getmaxyx(stdscr, height, width);
    const std::string& where =
        options_.stats_endpoint.empty() ? options_.endpoint : options_.stats_endpoint;
    view_.source = latest_from_pub_ || options_.stats_endpoint.empty()
                       ? where
                       : options_.endpoint + " (STATS requests)";
    if (paused_ && shown_) {
      view_.state = "PAUSED";
      painter->Paint(LayoutScreen(*shown_, shown_rates_, view_, width, height));
    } else if (reachable) {
      view_.state = latest_from_pub_ ? "live" : "polling";
      painter->Paint(LayoutScreen(*shown_, shown_rates_, view_, width, height));
    } else if (!latest_ && now - started_ < milliseconds(1500)) {
      view_.state = "";
      painter->Paint(LayoutMessage("connecting to " + where + " ...", "", view_, width, height));
    } else {
      view_.state = "down";
      std::string detail = latest_ ? "last data at " + ClockTime(latest_wall_) : "no data yet";
      if (const std::string error = feed.LastError(); !error.empty()) {
        detail += "; " + options_.endpoint + ": " + error;
      }
      painter->Paint(LayoutMessage("kvctl not reachable at " + where + "; retrying", detail, view_,
                                   width, height));
    }
  }

 private:
  double SecondsSinceStart(Clock::time_point t) const {
    return std::chrono::duration<double>(t - started_).count();
  }

  const UiOptions& options_;
  const Clock::time_point started_;
  ViewState view_;
  bool paused_ = false;
  uint64_t seen_ = 0;  // seq of the last message taken from the feed.
  std::shared_ptr<const Snapshot> shown_, latest_, previous_;
  Rates shown_rates_, latest_rates_;
  Clock::time_point latest_at_{}, previous_at_{};
  std::chrono::system_clock::time_point latest_wall_{};
  bool latest_from_pub_ = true;
};

}  // namespace

int RunUi(const UiOptions& options) {
  std::setlocale(LC_ALL, "");
  StatsFeed feed(options);
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  Painter painter(options.color);
  Monitor monitor(options, Clock::now());
  // Paints on every key and every new snapshot, else once a second (the age of the data moves).
  Clock::time_point painted{};
  while (!g_quit) {
    const int ch = getch();
    bool dirty = ch != ERR;
    if (dirty) monitor.HandleKey(ch);
    dirty |= monitor.TakeNewest(feed);
    monitor.FollowLatest();
    const Clock::time_point now = Clock::now();
    if (!dirty && now - painted < milliseconds(1000)) continue;
    painted = now;
    monitor.Paint(feed, now, &painter);
  }
  return 0;
}

}  // namespace kvctl::kvtop
