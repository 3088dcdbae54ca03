// Copyright 2026 The kvctl Authors. SPDX-License-Identifier: Apache-2.0
#include "tools/kvtop_render.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

#include "common/json_text.h"
#include "tools/kvtop_format.h"

namespace kvctl::kvtop {
namespace {

// Fixed widths of the layer rows: marker, "L12 ", bar, tokens, bits/element.
constexpr int kLayerFixed = 17;
// Heads grid: a 5-column row label, then 5 columns per head (4 for the value, 1 gap).
constexpr int kLabelWidth = 5, kCellWidth = 5;
// Rows the side-by-side panels need at least (the heads grid and quality panel).
constexpr int kMinPanelRows = 8;
// The sequences table: SESS/SEQ (session ids shortened to 6 digits, sequence ids to 5), then
// CLIENT, then fixed columns.
constexpr int kIdWidth = 14, kSeqFixed = 48;

Style Heat(int level) {
  return static_cast<Style>(static_cast<int>(Style::kHeat0) +
                            std::clamp(level, 0, kHeatLevels - 1));
}

// Fewer bits = hotter (more aggressive compression).
Style BitsHeat(double bits) {
  if (bits >= 16) return Heat(0);
  if (bits >= 8) return Heat(1);
  if (bits >= 4) return Heat(2);
  if (bits >= 3) return Heat(3);
  return Heat(4);
}

Style ErrorHeat(double e) {
  if (e < 0.01) return Heat(0);
  if (e < 0.03) return Heat(1);
  if (e < 0.1) return Heat(2);
  if (e < 0.3) return Heat(3);
  return Heat(4);
}

Style ShareHeat(double value, double max) {
  if (max <= 0) return Heat(0);
  return Heat(
      static_cast<int>(std::floor(std::clamp(value / max, 0.0, 1.0) * (kHeatLevels - 1) + 0.5)));
}

// One line grown span by span; Fit() makes it exactly `width` columns.
class Builder {
 public:
  explicit Builder(Style pad = Style::kNormal) : pad_(pad) {}
  Builder& Add(std::string text, Style style = Style::kNormal) {
    width_ += DisplayWidth(text);
    line_.push_back({std::move(text), style});
    return *this;
  }
  int width() const { return width_; }
  Line Fit(int width) const {
    Line out;
    int left = width;
    for (const Span& s : line_) {
      if (left <= 0) break;
      const int w = DisplayWidth(s.text);
      out.push_back({w <= left ? s.text : Truncate(s.text, left), s.style});
      left -= std::min(w, left);
    }
    if (left > 0) out.push_back({std::string(static_cast<size_t>(left), ' '), pad_});
    return out;
  }

 private:
  Style pad_;
  Line line_;
  int width_ = 0;
};

// `label value` items, most important first; items that would pass `width` are left out.
struct Item {
  std::string label, value;
};

void AddItems(Builder& b, const std::vector<Item>& items, int width, Style label_style,
              Style value_style) {
  bool first = true;
  for (const Item& item : items) {
    const int w = (first ? 1 : 2) + DisplayWidth(item.label) + DisplayWidth(item.value);
    if (b.width() + w > width) break;
    b.Add(first ? " " : "  ", value_style)
        .Add(item.label, label_style)
        .Add(item.value, value_style);
    first = false;
  }
}

std::string Latency(const Snapshot& s, const std::string& type) {
  if (s.Num("ipc", type + "_requests_total") <= 0) return "p50 - p99 -";
  return "p50 " + HumanMicros(s.Num("ipc", type + "_latency_p50_us")) + " p99 " +
         HumanMicros(s.Num("ipc", type + "_latency_p99_us"));
}

// ---- Header lines, shared by the screen and the plain snapshot -------------------------------

std::vector<Item> TitleItems(const Snapshot& s) {
  return {{"kvctl ", s.Str("server", "kvctl_version")},
          {"up ", HumanAge(s.Num("server", "uptime_s"))},
          {"", s.Str("server", "endpoint")},
          {"pid ", s.Str("server", "pid")}};
}

std::vector<Item> PoolItems(const Snapshot& s) {
  const double page = s.Num("pool", "page_bytes"), pages = s.Num("pool", "pages");
  const double used = s.Num("pool", "pages_used");
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%.1f%%", pages > 0 ? 100.0 * used / pages : 0.0);
  // A device pool names its device; the STATS of older daemons have no pool_backend.
  std::string where = s.Str("pool", "pool_backend");
  if (where == "cuda") where += ":" + s.Str("pool", "pool_cuda_device");
  return {{"pool ", HumanBytes(used * page) + "/" + HumanBytes(pages * page) + " " + pct +
                        (where.empty() ? "" : " " + where)},
          {"pages ", HumanCount(used) + "/" + HumanCount(pages)},
          {"staging ", HumanCount(s.Num("pool", "staging_slots_used")) + "/" +
                           HumanCount(s.Num("pool", "staging_slots"))},
          {"high water ", HumanBytes(s.Num("pool", "bytes_high_water"))},
          {"alloc failures ", HumanCount(s.Num("pool", "alloc_failures_total"))}};
}

std::vector<Item> KvItems(const Snapshot& s) {
  char bits[64], ratio[32];
  // Payload bits and, from daemons that report it, what the pool reserves per element; the
  // ratio is memory saved by reserved bytes (docs/stats.md).
  const double reserved = s.Num("sequences", "reserved_bits_per_element");
  std::snprintf(bits, sizeof(bits), reserved > 0 ? "%.2f (%.2f reserved)" : "%.2f",
                s.Num("sequences", "bits_per_element"), reserved);
  std::snprintf(ratio, sizeof(ratio), "x%.2f", s.Num("sequences", "compression_vs_fp16"));
  std::string quant = s.Str("policy", "quant_method");
  if (quant != "none" && quant != "fp16") {
    quant += " k" + s.Str("policy", "quant_k_bits") + " v" + s.Str("policy", "quant_v_bits");
  }
  return {{"bits/elt ", bits},
          {"", std::string(ratio) + " vs fp16"},
          {"tokens ", HumanCount(s.Num("sequences", "tokens")) + " (" +
                          HumanCount(s.Num("sequences", "tokens_quantized")) + " quantized)"},
          {"seqs ", HumanCount(s.Num("sequences", "sequences"))},
          {"quant ", quant},
          {"sessions ", HumanCount(s.Num("sequences", "sessions"))}};
}

std::vector<Item> RateItems(const Snapshot& s, const Rates& r) {
  auto rate = [&](double x) { return r.valid ? HumanRate(x) : std::string("-"); };
  return {{"req/s ", rate(r.requests)},
          {"append/s ", rate(r.appends) + " " + Latency(s, "append")},
          {"fetch/s ", rate(r.fetches) + " " + Latency(s, "fetch")},
          {"err/s ", rate(r.errors)},
          {"in ", r.valid ? HumanBytes(r.bytes_in) + "/s" : "-"},
          {"out ", r.valid ? HumanBytes(r.bytes_out) + "/s" : "-"}};
}

std::vector<Item> TotalItems(const Snapshot& s) {
  return {
      {"requests ", HumanCount(s.Num("ipc", "requests_total"))},
      {"append ", HumanCount(s.Num("ipc", "append_requests_total")) + " " + Latency(s, "append")},
      {"fetch ", HumanCount(s.Num("ipc", "fetch_requests_total")) + " " + Latency(s, "fetch")},
      {"errors ", HumanCount(s.Num("ipc", "errors_total"))}};
}

// The cluster tier (STATS # Tier); empty without one.
std::vector<Item> TierItems(const Snapshot& s) {
  if (s.Num("tier", "tier_enabled") <= 0) return {};
  auto mean_us = [&](const char* total, const char* count) {
    const double n = s.Num("tier", count);
    return n > 0 ? HumanMicros(s.Num("tier", total) / n) : std::string("-");
  };
  return {{"tier ", s.Num("tier", "tier_connected") > 0 ? "up" : "down"},
          {"spilled ", HumanCount(s.Num("tier", "tier_spilled_sequences")) + " seq " +
                           HumanBytes(s.Num("tier", "tier_spilled_bytes"))},
          {"spills ", HumanCount(s.Num("tier", "tier_spills_total")) + " " +
                          mean_us("tier_spill_us_total", "tier_spills_total")},
          {"restores ", HumanCount(s.Num("tier", "tier_restores_total")) + " " +
                            mean_us("tier_restore_us_total", "tier_restores_total")},
          {"lost ", HumanCount(s.Num("tier", "tier_spilled_lost_total"))},
          {"prefix hit/miss ", HumanCount(s.Num("tier", "tier_prefix_hits_total")) + "/" +
                                   HumanCount(s.Num("tier", "tier_prefix_misses_total"))},
          {"restored ", HumanCount(s.Num("tier", "tier_prefix_restored_tokens_total")) + " tok"}};
}

// The local prefix cache (STATS # Prefix); empty while it is off or has not been used.
std::vector<Item> PrefixItems(const Snapshot& s) {
  if (s.Num("prefix", "prefix_cache_enabled") <= 0 ||
      s.Num("prefix", "prefix_cache_entries") + s.Num("prefix", "prefix_cache_lookups_total") <=
          0) {
    return {};
  }
  return {{"prefixes ", HumanCount(s.Num("prefix", "prefix_cache_entries")) + " (" +
                            HumanCount(s.Num("prefix", "prefix_cache_read_entries")) + " read) " +
                            HumanBytes(s.Num("prefix", "prefix_cache_held_bytes")) + "/" +
                            HumanBytes(s.Num("prefix", "prefix_cache_max_bytes"))},
          {"shared ", HumanBytes(s.Num("sequences", "kv_shared_bytes"))},
          {"hit/lookup ", HumanCount(s.Num("prefix", "prefix_cache_hits_total")) + "/" +
                              HumanCount(s.Num("prefix", "prefix_cache_lookups_total"))},
          {"dropped ", HumanCount(s.Num("prefix", "prefix_cache_dropped_total"))},
          {"lost ", HumanCount(s.Num("prefix", "prefix_cache_lost_total"))}};
}

std::string QualitySummary(const Snapshot& s) {
  const double period = s.Num("quality", "quality_sample_period");
  if (period <= 0) return "Quality: off (server.quality_sample_period 0)";
  char buf[160];
  std::snprintf(buf, sizeof(buf), "Quality 1/%.0f: %s samples, mean K %s V %s", period,
                HumanCount(s.Num("quality", "quality_samples_total")).c_str(),
                FormatError(s.Num("quality", "quality_k_rel_error_mean")).c_str(),
                FormatError(s.Num("quality", "quality_v_rel_error_mean")).c_str());
  return buf;
}

std::string SequenceId(const SequenceRow& r) {
  return ShortId(r.session, 6) + "/" + ShortId(r.sequence, 5);
}

std::vector<SequenceRow> Sorted(std::vector<SequenceRow> rows, SortKey key) {
  auto id = [](const SequenceRow& r) { return std::make_pair(r.session, r.sequence); };
  std::stable_sort(rows.begin(), rows.end(), [&](const SequenceRow& a, const SequenceRow& b) {
    switch (key) {
      case SortKey::kTokens:
        return a.tokens != b.tokens ? a.tokens > b.tokens : id(a) < id(b);
      case SortKey::kBytes:
        return a.bytes != b.bytes ? a.bytes > b.bytes : id(a) < id(b);
      case SortKey::kAge:
        return a.age_s != b.age_s ? a.age_s > b.age_s : id(a) < id(b);
      case SortKey::kClient:
        return a.client != b.client ? a.client < b.client : id(a) < id(b);
      case SortKey::kId:
        break;
    }
    return id(a) < id(b);
  });
  return rows;
}

Line TitleBar(const std::vector<Item>& items, const std::string& right, int width) {
  Builder b(Style::kTitle);
  const int right_w = DisplayWidth(right) + 1;
  AddItems(b, items, std::max(0, width - right_w - 1), Style::kTitle, Style::kTitle);
  if (b.width() + right_w <= width) {
    b.Add(std::string(static_cast<size_t>(width - b.width() - right_w), ' '), Style::kTitle);
    b.Add(right + " ", Style::kTitle);
  }
  return b.Fit(width);
}

Line ItemLine(const std::vector<Item>& items, int width) {
  Builder b;
  AddItems(b, items, width, Style::kDim, Style::kNormal);
  return b.Fit(width);
}

Line Footer(const ViewState& view, int width) {
  return TitleBar(
      {{"q ", "quit"}, {"? ", "help"}, {"s ", "sort"}, {"arrows/l ", "layer"}, {"p ", "pause"}},
      view.source, width);
}

// One bar of `width` columns filled to `fraction`: the filled part, then the empty part.
void AddBar(Builder& b, double fraction, int width, bool unicode, Style fill) {
  const double cells = std::clamp(fraction, 0.0, 1.0) * width;
  int full = static_cast<int>(cells);
  const int eighths = static_cast<int>(std::lround((cells - full) * 8));
  std::string filled, empty;
  static const char* const kPartial[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉", "█"};
  for (int i = 0; i < full; ++i) filled += unicode ? "█" : "#";
  if (full < width && eighths > 0) {
    filled += unicode ? kPartial[eighths] : (eighths >= 4 ? "+" : "");
    if (unicode || eighths >= 4) ++full;
  }
  for (int i = full; i < width; ++i) empty += unicode ? "░" : ".";
  b.Add(filled, fill).Add(empty, Style::kDim);
}

std::vector<Line> LayerRows(const Snapshot& s, const ViewState& view, int selected_pos, int rows,
                            int width) {
  std::vector<Line> out;
  const int n = static_cast<int>(s.layers.size());
  if (n == 0) {
    out.push_back(Builder().Add(" (no open sequences)", Style::kDim).Fit(width));
    return out;
  }
  double max_tokens = 0;
  for (const LayerRow& l : s.layers) max_tokens = std::max(max_tokens, l.tokens);
  const int first = std::clamp(selected_pos - rows / 2, 0, std::max(0, n - rows));
  const int bar_w = std::max(3, width - kLayerFixed);
  for (int i = first; i < std::min(n, first + rows); ++i) {
    const LayerRow& l = s.layers[i];
    const bool selected = i == selected_pos;
    char label[16], bits[16];
    std::snprintf(label, sizeof(label), "L%-3d", l.layer);
    std::snprintf(bits, sizeof(bits), "%4.1f", l.bits_per_element);
    const bool budget = l.budget_tokens > 0;
    const double fraction =
        budget ? l.tokens / l.budget_tokens : (max_tokens > 0 ? l.tokens / max_tokens : 0);
    Builder b;
    b.Add(selected ? ">" : " ", selected ? Style::kSelected : Style::kNormal)
        .Add(label, selected ? Style::kSelected : Style::kDim);
    b.Add(" ");
    AddBar(b, fraction, bar_w, view.unicode,
           budget && l.tokens > l.budget_tokens ? Style::kBarOver : Style::kBar);
    b.Add(" ").Add(PadLeft(HumanCount(l.tokens), 5)).Add(" ").Add(bits, Style::kDim);
    out.push_back(b.Fit(width));
  }
  return out;
}

// The heads heat map and the quality panel of one layer, `rows` lines of `width` columns.
std::vector<Line> HeadRows(const Snapshot& s, int layer, int rows, int width) {
  const std::vector<HeadRow> heads = s.HeadsOf(layer);
  const int shown =
      std::min(static_cast<int>(heads.size()), std::max(0, (width - kLabelWidth) / kCellWidth));
  double max_tokens = 0;
  for (const HeadRow& h : heads) max_tokens = std::max(max_tokens, h.tokens);
  auto grid = [&](const char* label, auto cell) {
    Builder b;
    b.Add(PadRight(label, kLabelWidth), Style::kDim);
    for (int i = 0; i < shown; ++i) {
      auto [text, style] = cell(heads[i]);
      b.Add(PadLeft(text, kCellWidth - 1), style).Add(" ");
    }
    return b.Fit(width);
  };
  auto num = [](double x) { return Compact4(x); };
  std::vector<Line> out;
  out.push_back(grid("head", [](const HeadRow& h) {
    return std::make_pair(std::string("h").append(std::to_string(h.head)), Style::kDim);
  }));
  out.push_back(grid(
      "kbit", [&](const HeadRow& h) { return std::make_pair(num(h.k_bits), BitsHeat(h.k_bits)); }));
  out.push_back(grid(
      "vbit", [&](const HeadRow& h) { return std::make_pair(num(h.v_bits), BitsHeat(h.v_bits)); }));
  out.push_back(grid("tok", [&](const HeadRow& h) {
    return std::make_pair(num(h.tokens), ShareHeat(h.tokens, max_tokens));
  }));
  if (rows > kMinPanelRows) {
    out.push_back(grid("b/el", [&](const HeadRow& h) {
      char buf[16];
      std::snprintf(buf, sizeof(buf), "%.1f", h.bits_per_element);
      return std::make_pair(std::string(buf), BitsHeat(h.bits_per_element));
    }));
  }
  out.push_back(Builder().Add(QualitySummary(s), Style::kSection).Fit(width));
  auto err = [](double e, double samples) {
    return samples > 0 ? std::make_pair(FormatError(e), ErrorHeat(e))
                       : std::make_pair(std::string("-"), Style::kDim);
  };
  out.push_back(
      grid("Kerr", [&](const HeadRow& h) { return err(h.k_rel_error, h.quality_samples); }));
  out.push_back(
      grid("Verr", [&](const HeadRow& h) { return err(h.v_rel_error, h.quality_samples); }));
  out.push_back(grid(
      "n", [&](const HeadRow& h) { return std::make_pair(num(h.quality_samples), Style::kDim); }));
  if (static_cast<int>(out.size()) < rows) {
    out.push_back(Builder()
                      .Add("Policy ", Style::kSection)
                      .Add("budget " + s.Str("policy", "budget_mode") + "  evict " +
                           s.Str("policy", "evict_policy"))
                      .Fit(width));
  }
  out.resize(std::min<size_t>(out.size(), static_cast<size_t>(rows)));
  return out;
}

std::vector<Line> SequenceRows(const Snapshot& s, SortKey sort, int rows, int width) {
  const int client_w = std::max(6, width - kSeqFixed);
  std::vector<Line> out;
  Builder h;
  h.Add(PadRight(" SESS/SEQ", kIdWidth + 1) + PadRight("CLIENT", client_w + 1) +
            PadLeft("TOKENS", 8) + PadLeft("BYTES", 9) + PadLeft("EVICT", 7) + PadLeft("AGE", 8),
        Style::kDim);
  out.push_back(h.Fit(width));
  const std::vector<SequenceRow> sorted = Sorted(s.sequences, sort);
  const int n = static_cast<int>(sorted.size());
  if (n == 0) {
    out.push_back(Builder().Add(" (no open sequences)", Style::kDim).Fit(width));
  }
  for (int i = 0; i < n && static_cast<int>(out.size()) < rows + 1; ++i) {
    if (static_cast<int>(out.size()) == rows && i < n - 1) {
      out.push_back(
          Builder().Add(" ... " + std::to_string(n - i) + " more", Style::kDim).Fit(width));
      break;
    }
    const SequenceRow& r = sorted[i];
    out.push_back(
        Builder()
            .Add(" ")
            .Add(PadRight(SequenceId(r), kIdWidth) + PadRight(Printable(r.client), client_w))
            .Add(" ")
            .Add(PadLeft(HumanCount(r.tokens), 8) + PadLeft(HumanBytes(r.bytes), 9) +
                 PadLeft(HumanCount(r.evictions), 7) + PadLeft(HumanAge(r.age_s), 8))
            .Fit(width));
  }
  return out;
}

std::vector<Line> HelpRows(int width) {
  static const char* const kHelp[] = {
      "kvtop keys",
      "  q             quit",
      "  ?             this help (any key closes it)",
      "  s             sort the sequences table: tokens, bytes, age, client, id",
      "  Up/Down       previous / next layer (also Left/Right, PgUp/PgDn, Home/End)",
      "  l / L         next / previous layer, wrapping",
      "  p             pause / resume the display (data keeps arriving)",
      "",
      "Heads heat map, cool to hot: blue, cyan, green, yellow, red.",
      "  kbit/vbit: 16 bits cool .. 2 bits hot.  tok: vs the layer's busiest head.",
      "  Kerr/Verr: sampled relative error |x'-x|^2/|x|^2, <.01 cool .. >=.3 hot.",
      "Layer bars: tokens kept vs budget_tokens, or vs the busiest layer.",
  };
  std::vector<Line> out;
  for (const char* line : kHelp) {
    out.push_back(
        Builder()
            .Add(std::string(" ") + line, line == kHelp[0] ? Style::kSection : Style::kNormal)
            .Fit(width));
  }
  return out;
}

}  // namespace

std::vector<Line> LayoutScreen(const Snapshot& s, const Rates& rates, const ViewState& view,
                               int width, int height) {
  width = std::max(width, 1);
  height = std::max(height, 1);
  std::vector<Line> out;
  out.push_back(TitleBar(TitleItems(s), view.state, width));
  out.push_back(ItemLine(PoolItems(s), width));
  out.push_back(ItemLine(KvItems(s), width));
  out.push_back(ItemLine(RateItems(s, rates), width));
  const std::vector<Item> tier = TierItems(s);
  if (!tier.empty()) out.push_back(ItemLine(tier, width));
  const std::vector<Item> prefix = PrefixItems(s);
  if (!prefix.empty()) out.push_back(ItemLine(prefix, width));

  // Rows below the header: panel title + panels, sequences title + header + rows, footer.
  const int avail = height - 8 - (tier.empty() ? 0 : 1) - (prefix.empty() ? 0 : 1);
  const int n_layers = static_cast<int>(s.layers.size());
  const int n_seqs = std::max(1, static_cast<int>(s.sequences.size()));
  int panel = std::max(0, avail - 1);
  if (avail > kMinPanelRows) {
    const int seq_share = std::min(n_seqs, avail - kMinPanelRows);
    panel = std::max(kMinPanelRows, std::min(std::max(kMinPanelRows, n_layers), avail - seq_share));
  }
  const int seq_rows = std::max(0, avail - panel);

  if (view.help) {
    for (Line& l : HelpRows(width)) out.push_back(std::move(l));
  } else {
    int pos = 0;
    for (int i = 0; i < n_layers; ++i) {
      if (s.layers[i].layer <= view.selected_layer) pos = i;
    }
    const int layer = n_layers > 0 ? s.layers[pos].layer : 0;
    const int left = width >= 80 ? std::max(31, width * 2 / 5) : width / 2;
    const int right = std::max(0, width - left - 1);

    bool budget = false;
    for (const LayerRow& l : s.layers) budget |= l.budget_tokens > 0;
    const int n_heads = static_cast<int>(s.HeadsOf(layer).size());
    const int shown = std::min(n_heads, std::max(0, (right - kLabelWidth) / kCellWidth));
    std::string heads_title = "Heads of layer " + std::to_string(layer);
    if (shown < n_heads) {
      heads_title += " (h0-h" + std::to_string(shown - 1) + " of " + std::to_string(n_heads) + ")";
    }
    Builder title;
    title.Add(PadRight(std::string("Layers ") + std::to_string(n_layers) +
                           (budget ? " (tokens vs budget)" : " (tokens kept)"),
                       left),
              Style::kSection);
    title.Add(" ").Add(heads_title, Style::kSection);
    out.push_back(title.Fit(width));

    const std::vector<Line> lefts = LayerRows(s, view, pos, panel, left);
    const std::vector<Line> rights = HeadRows(s, layer, panel, right);
    for (int r = 0; r < panel; ++r) {
      Line row = r < static_cast<int>(lefts.size()) ? lefts[r] : Builder().Fit(left);
      row.push_back({" ", Style::kNormal});
      const Line rr = r < static_cast<int>(rights.size()) ? rights[r] : Builder().Fit(right);
      row.insert(row.end(), rr.begin(), rr.end());
      out.push_back(row);
    }

    out.push_back(Builder()
                      .Add("Sequences " + std::to_string(s.sequences.size()) +
                               "  sort: " + SortKeyName(view.sort) + " (s)",
                           Style::kSection)
                      .Fit(width));
    for (Line& l : SequenceRows(s, view.sort, seq_rows, width)) out.push_back(std::move(l));
  }

  out.resize(static_cast<size_t>(std::max(0, height - 1)), Builder().Fit(width));
  out.push_back(Footer(view, width));
  return out;
}

std::vector<Line> LayoutMessage(std::string_view message, std::string_view detail,
                                const ViewState& view, int width, int height) {
  width = std::max(width, 1);
  height = std::max(height, 1);
  std::vector<Line> out;
  out.push_back(TitleBar({{"", "kvtop"}}, view.state, width));
  auto centred = [&](std::string_view text, Style style) {
    const int pad = std::max(0, (width - DisplayWidth(text)) / 2);
    return Builder()
        .Add(std::string(static_cast<size_t>(pad), ' '))
        .Add(std::string(text), style)
        .Fit(width);
  };
  const int middle = std::max(1, height / 2 - 1);
  out.resize(static_cast<size_t>(std::min(middle, height - 1)), Builder().Fit(width));
  out.push_back(centred(message, Style::kError));
  if (!detail.empty()) out.push_back(centred(detail, Style::kDim));
  out.resize(static_cast<size_t>(std::max(0, height - 1)), Builder().Fit(width));
  out.push_back(Footer(view, width));
  return out;
}

std::string LineText(const Line& line) {
  std::string out;
  for (const Span& s : line) out += s.text;
  return out;
}

const char* SortKeyName(SortKey key) {
  switch (key) {
    case SortKey::kTokens:
      return "tokens";
    case SortKey::kBytes:
      return "bytes";
    case SortKey::kAge:
      return "age";
    case SortKey::kClient:
      return "client";
    case SortKey::kId:
      return "id";
  }
  return "tokens";
}

SortKey NextSortKey(SortKey key) { return static_cast<SortKey>((static_cast<int>(key) + 1) % 5); }

// ---- Plain text ---------------------------------------------------------------------------------

std::string RenderPlain(const Snapshot& s, int width) {
  std::string out;
  auto line = [&](const Line& l) {
    std::string text = LineText(l);
    while (!text.empty() && text.back() == ' ') text.pop_back();
    out += text + "\n";
  };
  line(ItemLine(TitleItems(s), width));
  line(ItemLine(PoolItems(s), width));
  line(ItemLine(KvItems(s), width));
  line(ItemLine(TotalItems(s), width));
  if (const std::vector<Item> tier = TierItems(s); !tier.empty()) line(ItemLine(tier, width));
  if (const std::vector<Item> prefix = PrefixItems(s); !prefix.empty()) {
    line(ItemLine(prefix, width));
  }

  char buf[256];
  out += "\nLayers " + std::to_string(s.layers.size()) + "\n";
  out +=
      "  LAYER    TOKENS      BYTES  BITS/ELT    BUDGET   EVICT  TOKENS (vs busiest or budget)\n";
  double max_tokens = 0;
  for (const LayerRow& l : s.layers) max_tokens = std::max(max_tokens, l.tokens);
  for (const LayerRow& l : s.layers) {
    Builder bar;
    const double fraction = l.budget_tokens > 0 ? l.tokens / l.budget_tokens
                                                : (max_tokens > 0 ? l.tokens / max_tokens : 0);
    AddBar(bar, fraction, 20, /*unicode=*/false, Style::kBar);
    std::snprintf(buf, sizeof(buf), "  %5d %9.0f %10s %9.3f %9.0f %7.0f  ", l.layer, l.tokens,
                  HumanBytes(l.bytes).c_str(), l.bits_per_element, l.budget_tokens, l.evictions);
    out += buf + LineText(bar.Fit(20)) + "\n";
  }
  out += "\nHeads " + std::to_string(s.heads.size()) + "\n";
  out += "  LAYER HEAD    TOKENS K_BITS V_BITS BITS/ELT  K_REL_ERR  V_REL_ERR  SAMPLES\n";
  for (const HeadRow& h : s.heads) {
    std::snprintf(buf, sizeof(buf), "  %5d %4d %9.0f %6.0f %6.0f %8.3f %10.4g %10.4g %8.0f\n",
                  h.layer, h.head, h.tokens, h.k_bits, h.v_bits, h.bits_per_element, h.k_rel_error,
                  h.v_rel_error, h.quality_samples);
    out += buf;
  }
  out += "\nSequences " + std::to_string(s.sequences.size()) + "\n";
  out += "  SESS/SEQ       CLIENT                 TOKENS      BYTES   EVICT      AGE\n";
  for (const SequenceRow& r : Sorted(s.sequences, SortKey::kId)) {
    std::snprintf(buf, sizeof(buf), "  %-14s %-20s %8.0f %10s %7.0f %8s\n", SequenceId(r).c_str(),
                  Printable(r.client).c_str(), r.tokens, HumanBytes(r.bytes).c_str(), r.evictions,
                  HumanAge(r.age_s).c_str());
    out += buf;
  }
  out += "\n" + QualitySummary(s) + "\n";
  out += "Policy: quant " + s.Str("policy", "quant_method") + " k" +
         s.Str("policy", "quant_k_bits") + " v" + s.Str("policy", "quant_v_bits") + ", budget " +
         s.Str("policy", "budget_mode") + ", evict " + s.Str("policy", "evict_policy") + "\n";
  return out;
}

// ---- JSON ---------------------------------------------------------------------------------------

namespace {

void AppendJsonValue(std::string& out, std::string_view v) {
  if (IsJsonNumber(v)) {
    out += v;
  } else {
    AppendJsonQuoted(&out, v);
  }
}

}  // namespace

std::string RenderJson(const StatsText& text) {
  std::string out = "{";
  for (size_t i = 0; i < text.sections.size(); ++i) {
    const StatsSection& section = text.sections[i];
    out += i ? ",\n  " : "\n  ";
    AppendJsonQuoted(&out, section.name);
    out += ": {";
    bool first = true;
    for (const auto& [k, v] : section.fields) {
      out += first ? "\n    " : ",\n    ";
      first = false;
      AppendJsonQuoted(&out, k);
      out += ": ";
      AppendJsonValue(out, v);
    }
    for (const StatsEntity& e : section.entities) {
      out += first ? "\n    " : ",\n    ";
      first = false;
      AppendJsonQuoted(&out, e.name);
      out += ": {";
      for (size_t j = 0; j < e.fields.size(); ++j) {
        if (j) out += ", ";
        AppendJsonQuoted(&out, e.fields[j].first);
        out += ": ";
        AppendJsonValue(out, e.fields[j].second);
      }
      out += "}";
    }
    out += first ? "}" : "\n  }";
  }
  out += text.sections.empty() ? "}\n" : "\n}\n";
  return out;
}

}  // namespace kvctl::kvtop
