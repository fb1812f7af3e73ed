// Renderings of `tandem bench` results (see report.h): statistics, JSON, Markdown, SVG.
#include "bench/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace tandem::bench {

std::optional<double> hist_percentile_us(std::span<const uint64_t> hist, double q) {
  uint64_t total = 0;
  for (uint64_t c : hist) total += c;
  if (total == 0) return std::nullopt;
  const uint64_t target = std::max<uint64_t>(1, uint64_t(std::ceil(q * double(total))));
  uint64_t seen = 0;
  for (size_t i = 0; i < hist.size(); ++i) {
    seen += hist[i];
    if (seen >= target) return std::ldexp(1.0, int(i));
  }
  return std::ldexp(1.0, int(hist.size()) - 1);
}

std::optional<double> relative_spread(std::span<const double> values) {
  if (values.empty()) return std::nullopt;
  double sum = 0, lo = values[0], hi = values[0];
  for (double v : values) {
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const double mean = sum / double(values.size());
  if (mean == 0) return std::nullopt;
  return (hi - lo) / mean;
}

double bound_ms(const PathBytes& b, const Bandwidths& bw) {
  const auto time = [](double bytes, double gbps) { return bytes > 0 ? bytes / (gbps * 1e9) : 0.0; };
  return std::max({time(b.hbm, bw.hbm_gbps), time(b.dram, bw.dram_gbps), time(b.link, bw.link_gbps)}) * 1e3;
}

CellSummary summarize(const Cell& cell) {
  CellSummary s;
  std::vector<std::vector<const LaneRun*>> by_lane;
  for (const LaneRun& r : cell.runs) {
    auto it = std::find_if(s.lanes.begin(), s.lanes.end(), [&](const LaneSummary& l) { return l.lane == r.lane; });
    if (it == s.lanes.end()) {
      s.lanes.emplace_back();
      s.lanes.back().lane = r.lane;
      by_lane.emplace_back();
      it = s.lanes.end() - 1;
    }
    by_lane[size_t(it - s.lanes.begin())].push_back(&r);
  }
  for (size_t i = 0; i < s.lanes.size(); ++i) {
    LaneSummary& l = s.lanes[i];
    const auto& runs = by_lane[i];
    std::vector<double> tps;
    double step = 0;
    for (const LaneRun* r : runs) {
      tps.push_back(r->tokens_per_s());
      step += r->step_ms();
    }
    l.repeats = int64_t(runs.size());
    double sum = 0;
    for (double t : tps) sum += t;
    l.mean_tokens_per_s = sum / double(tps.size());
    l.min_tokens_per_s = *std::min_element(tps.begin(), tps.end());
    l.max_tokens_per_s = *std::max_element(tps.begin(), tps.end());
    l.spread = relative_spread(tps);
    l.mean_step_ms = step / double(runs.size());
    l.bound_ms = runs[0]->bound_ms;
    l.cold_share = runs[0]->cold_share;
    l.bytes = runs[0]->bytes;
    bool all_counters = true;
    LaneCounters c;
    double wait_sum = 0;
    for (const LaneRun* r : runs) {
      if (!r->counters) {
        all_counters = false;
        break;
      }
      c.handoffs += r->counters->handoffs;
      c.overruns += r->counters->overruns;
      wait_sum += r->counters->wait_mean_us * double(r->counters->handoffs);
      auto worst = [](std::optional<double> a, std::optional<double> b) {
        return a && b ? std::optional<double>(std::max(*a, *b)) : a ? a : b;
      };
      c.wait_p50_us = worst(c.wait_p50_us, r->counters->wait_p50_us);
      c.wait_p99_us = worst(c.wait_p99_us, r->counters->wait_p99_us);
    }
    if (all_counters) {
      c.wait_mean_us = c.handoffs ? wait_sum / double(c.handoffs) : 0;
      l.counters = c;
    }
  }
  if (s.lanes.size() > 1 && s.lanes[0].mean_tokens_per_s > 0)
    for (size_t i = 1; i < s.lanes.size(); ++i) s.lanes[i].ratio = s.lanes[i].mean_tokens_per_s / s.lanes[0].mean_tokens_per_s;
  s.steady = s.lanes.empty() || !s.lanes[0].spread || *s.lanes[0].spread <= kSteadySpread;
  const auto& r = cell.runs;
  if (r.size() == 3 && r[0].lane == r[2].lane && r[1].lane != r[0].lane) {
    const double a = (r[0].tokens_per_s() + r[2].tokens_per_s()) / 2;
    if (a > 0) {
      s.aba_ratio = r[1].tokens_per_s() / a;
      s.aba_spread = std::abs(r[0].tokens_per_s() - r[2].tokens_per_s()) / a;
    }
  }
  return s;
}

namespace {

nlohmann::json opt(std::optional<double> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

nlohmann::json counters_json(const std::optional<LaneCounters>& c) {
  if (!c) return nullptr;
  return {{"handoffs", c->handoffs},        {"overruns", c->overruns},          {"wait_mean_us", c->wait_mean_us},
          {"wait_p50_us_le", opt(c->wait_p50_us)}, {"wait_p99_us_le", opt(c->wait_p99_us)}};
}

nlohmann::json bytes_json(const PathBytes& b) {
  return {{"hbm", b.hbm}, {"dram", b.dram}, {"link", b.link}, {"total", b.total()}};
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += ch;
    }
  }
  return out;
}

std::string num(double v) { return std::abs(v) >= 100 ? fmt::format("{:.0f}", v) : fmt::format("{:.1f}", v); }
std::string size_str(double bytes) {
  if (bytes == 0) return "0";
  if (bytes >= 1e9) return fmt::format("{:.3f} GB", bytes / 1e9);
  if (bytes >= 1e6) return fmt::format("{:.1f} MB", bytes / 1e6);
  return fmt::format("{:.1f} kB", bytes / 1e3);
}
std::string pct(std::optional<double> v) { return v ? fmt::format("{:.1f}%", *v * 100) : "-"; }
std::string times(std::optional<double> v) { return v ? fmt::format("×{:.2f}", *v) : "-"; }

std::vector<std::string> distinct_kinds(const Report& r) {
  std::vector<std::string> kinds;
  for (const Cell& c : r.cells)
    if (std::find(kinds.begin(), kinds.end(), c.kind) == kinds.end()) kinds.push_back(c.kind);
  return kinds;
}
std::vector<int64_t> distinct_users(const Report& r) {
  std::vector<int64_t> users;
  for (const Cell& c : r.cells)
    if (std::find(users.begin(), users.end(), c.users) == users.end()) users.push_back(c.users);
  return users;
}

std::string bandwidth_line(const Report& r) {
  const Bandwidths& b = r.bandwidths;
  const auto path = [](const char* name, double gbps, const std::string& source) {
    return source == "not used" ? fmt::format("{} not used", name) : fmt::format("{} {:.0f} GB/s ({})", name, gbps, source);
  };
  return fmt::format("Bound = max over paths of bytes / bandwidth, with {}, {}, {}.",
                     path("HBM", b.hbm_gbps, b.hbm_source), path("CPU DRAM", b.dram_gbps, b.dram_source),
                     path("PCIe link", b.link_gbps, b.link_source));
}

}  // namespace

nlohmann::json to_json(const Report& report) {
  nlohmann::json cells = nlohmann::json::array();
  for (const Cell& cell : report.cells) {
    nlohmann::json runs = nlohmann::json::array();
    for (const LaneRun& r : cell.runs)
      runs.push_back({{"lane", r.lane},
                      {"users", r.users},
                      {"decode_steps", r.decode_steps},
                      {"prefill_s", r.prefill_s},
                      {"decode_s", r.decode_s},
                      {"tokens_per_s", r.tokens_per_s()},
                      {"tokens_per_s_per_user", r.users ? r.tokens_per_s() / double(r.users) : 0.0},
                      {"step_ms", r.step_ms()},
                      {"bound_ms", r.bound_ms},
                      {"x_bound", r.bound_ms > 0 ? nlohmann::json(r.step_ms() / r.bound_ms) : nlohmann::json(nullptr)},
                      {"bytes_per_step", bytes_json(r.bytes)},
                      {"cold_share", r.cold_share},
                      {"cold_share_source", r.cold_share_source},
                      {"counters", counters_json(r.counters)}});
    const CellSummary s = summarize(cell);
    nlohmann::json lanes = nlohmann::json::array();
    for (const LaneSummary& l : s.lanes)
      lanes.push_back({{"lane", l.lane},
                       {"repeats", l.repeats},
                       {"mean_tokens_per_s", l.mean_tokens_per_s},
                       {"mean_tokens_per_s_per_user", cell.users ? l.mean_tokens_per_s / double(cell.users) : 0.0},
                       {"min_tokens_per_s", l.min_tokens_per_s},
                       {"max_tokens_per_s", l.max_tokens_per_s},
                       {"spread", opt(l.spread)},
                       {"ratio_to_first", opt(l.ratio)},
                       {"mean_step_ms", l.mean_step_ms},
                       {"bound_ms", l.bound_ms},
                       {"cold_share", l.cold_share},
                       {"bytes_per_step", bytes_json(l.bytes)},
                       {"counters", counters_json(l.counters)}});
    cells.push_back({{"kind", cell.kind},
                     {"users", cell.users},
                     {"runs", runs},
                     {"summary", {{"baseline", s.lanes.empty() ? "" : s.lanes[0].lane},
                                  {"lanes", lanes},
                                  {"aba_ratio", opt(s.aba_ratio)},
                                  {"aba_spread", opt(s.aba_spread)},
                                  {"steady", s.steady}}}});
  }
  return {{"schema", "tandem-bench/1"},
          {"date", report.date},
          {"label", report.label},
          {"model", report.model},
          {"device", report.device},
          {"command", report.command},
          {"machine", report.machine},
          {"options", report.options},
          {"bandwidths_gbps",
           {{"hbm", report.bandwidths.hbm_gbps},
            {"dram", report.bandwidths.dram_gbps},
            {"link", report.bandwidths.link_gbps},
            {"source",
             {{"hbm", report.bandwidths.hbm_source},
              {"dram", report.bandwidths.dram_source},
              {"link", report.bandwidths.link_source}}}}},
          {"definitions",
           {{"tokens_per_s", "users x decode steps / decode seconds (prefill excluded)"},
            {"spread", "(max - min) / mean of a lane's repeats in the cell"},
            {"ratio_to_first", "lane mean / mean of the first listed lane (= B / mean(A) for A,B,A)"},
            {"aba_spread", "|A1 - A2| / mean(A)"},
            {"steady", fmt::format("the first lane's spread in the cell is at most {:g}: otherwise the machine changed "
                                   "speed while the cell ran and its ratios are not to be relied on",
                                   kSteadySpread)},
            {"wait_p50_us_le", "upper edge of the power-of-two histogram bucket holding the quantile"},
            {"bound_ms", "max over paths (hbm, dram, link) of bytes_per_step / bandwidth"}}},
          {"cells", cells},
          {"notes", report.notes}};
}

std::string to_markdown(const Report& report) {
  std::string md = fmt::format("# tandem bench: {} on {} ({})\n\n", report.label, report.device, report.date);
  md += fmt::format("Command: `{}`\n\n", report.command);
  if (report.machine.contains("hostname"))
    md += fmt::format("Machine: {}\n\n", report.machine.dump());
  // At a glance: each lane against the first, per kind and users.
  const auto users = distinct_users(report);
  std::map<std::pair<std::string, int64_t>, CellSummary> sums;
  for (const Cell& c : report.cells) sums[{c.kind, c.users}] = summarize(c);
  size_t unsteady = 0;
  for (const auto& [key, s] : sums) unsteady += s.steady ? 0 : 1;
  const std::string dagger = "†";
  if (unsteady > 0)
    md += fmt::format("**{} of {} cells were not steady** (marked {}): their {} runs differ by more than {:.0f}%, so the "
                      "machine changed speed while they ran; rerun them before relying on their ratios.\n\n",
                      unsteady, sums.size(), dagger, report.cells[0].runs.empty() ? "" : report.cells[0].runs[0].lane,
                      kSteadySpread * 100);
  if (!report.cells.empty()) {
    const CellSummary first = summarize(report.cells[0]);
    for (size_t li = 1; li < first.lanes.size(); ++li) {
      const std::string& lane = first.lanes[li].lane;
      md += fmt::format("## {} / {}: decode tokens/s ratio (spread of the {} runs)\n\n| kind |", lane, first.lanes[0].lane,
                        first.lanes[0].lane);
      for (int64_t u : users) md += fmt::format(" {} user{} |", u, u == 1 ? "" : "s");
      md += "\n| --- |";
      for (size_t i = 0; i < users.size(); ++i) md += " ---: |";
      md += "\n";
      for (const std::string& kind : distinct_kinds(report)) {
        md += fmt::format("| {} |", kind);
        for (int64_t u : users) {
          auto it = sums.find({kind, u});
          std::string v = "-";
          if (it != sums.end() && li < it->second.lanes.size())
            v = fmt::format("{} ({}){}", times(it->second.lanes[li].ratio), pct(it->second.lanes[0].spread),
                            it->second.steady ? "" : " " + dagger);
          md += fmt::format(" {} |", v);
        }
        md += "\n";
      }
      md += "\n";
    }
  }
  md += "## All cells\n\n";
  md += "| kind | users | lane | runs | tok/s total | tok/s per user | spread | ratio | wait p50 / p99 µs | overruns | "
        "cold share | bytes/step (hbm / dram / link) | step ms | bound ms | × bound |\n";
  md += "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (const Cell& c : report.cells) {
    const CellSummary s = sums[{c.kind, c.users}];
    for (const LaneSummary& l : s.lanes) {
      auto edge = [](std::optional<double> v) { return v ? fmt::format("<{:.0f}", *v) : std::string("-"); };
      const std::string wait =
          l.counters ? fmt::format("{} / {}", edge(l.counters->wait_p50_us), edge(l.counters->wait_p99_us)) : "n/a";
      md += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.1f}% | {} / {} / {} | {:.3f} | {:.3f} | {} |\n",
                        c.kind, c.users, l.lane, l.repeats, num(l.mean_tokens_per_s),
                        num(l.mean_tokens_per_s / double(std::max<int64_t>(1, c.users))),
                        l.repeats > 1 ? pct(l.spread) + (&l == &s.lanes[0] && !s.steady ? " " + dagger : "") : "-",
                        times(l.ratio),
                        wait, l.counters ? fmt::format("{}", l.counters->overruns) : "n/a", l.cold_share * 100,
                        size_str(l.bytes.hbm), size_str(l.bytes.dram), size_str(l.bytes.link), l.mean_step_ms, l.bound_ms,
                        l.bound_ms > 0 ? fmt::format("{:.2f}", l.mean_step_ms / l.bound_ms) : "-");
    }
  }
  md += fmt::format("\n{}\n", bandwidth_line(report));
  md += "Ratio: lane mean / mean of the first listed lane (B / mean(A) for A, B, A). Spread: (max - min) / mean of a "
        "lane's runs in the cell. Waits: upper edges of power-of-two histogram buckets, decode steps only.\n";
  for (const std::string& n : report.notes) md += fmt::format("\n- {}", n);
  if (!report.notes.empty()) md += "\n";
  return md;
}

namespace {

double nice_step(double range) {
  if (range <= 0) return 1;
  const double mag = std::pow(10.0, std::floor(std::log10(range)));
  const double r = range / mag;
  return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

// Ticks of one axis share a unit: thousands ("5k") when the axis reaches 10,000.
std::string tick_label(double v, bool thousands) {
  if (thousands && v != 0) return fmt::format("{:g}k", v / 1000);
  return fmt::format("{:g}", v);
}

constexpr const char* kPalette[] = {"#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2"};

}  // namespace

std::string to_svg(const Report& report) {
  const auto kinds = distinct_kinds(report);
  const auto users = distinct_users(report);
  std::vector<std::string> lanes;
  for (const Cell& c : report.cells)
    for (const LaneRun& r : c.runs)
      if (std::find(lanes.begin(), lanes.end(), r.lane) == lanes.end()) lanes.push_back(r.lane);
  std::map<std::pair<std::string, int64_t>, CellSummary> sums;
  for (const Cell& c : report.cells) sums[{c.kind, c.users}] = summarize(c);

  const int cols = int(std::min<size_t>(3, std::max<size_t>(1, kinds.size())));
  const int rows = int((std::max<size_t>(1, kinds.size()) + size_t(cols) - 1) / size_t(cols));
  const double pw = 380, ph = 280, top = 78, ml = 62, mr = 14, mt = 34, mb = 46;
  const double width = cols * pw + 20, height = top + rows * ph + 36;
  std::string svg = fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{0:.0f}\" height=\"{1:.0f}\" "
      "viewBox=\"0 0 {0:.0f} {1:.0f}\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
      "<rect x=\"0\" y=\"0\" width=\"{0:.0f}\" height=\"{1:.0f}\" fill=\"white\"/>\n",
      width, height);
  svg += fmt::format("<text x=\"14\" y=\"26\" font-size=\"17\" font-weight=\"bold\">{}</text>\n",
                     xml_escape(fmt::format("tandem bench: {} on {} ({}): decode tokens/s, all users", report.label,
                                            report.device, report.date)));
  svg += fmt::format("<text x=\"14\" y=\"46\" font-size=\"12\" fill=\"#444\">{}</text>\n",
                     xml_escape("bars: mean of a lane's runs; whiskers: min..max; ×: ratio to the first lane (" +
                                (lanes.empty() ? std::string("-") : lanes[0]) + ")" +
                                (std::any_of(sums.begin(), sums.end(), [](const auto& kv) { return !kv.second.steady; })
                                     ? fmt::format("; †: its runs differ by more than {:.0f}%: not steady", kSteadySpread * 100)
                                     : std::string())));
  double lx = 14;
  for (size_t i = 0; i < lanes.size(); ++i) {
    svg += fmt::format("<rect x=\"{:.0f}\" y=\"56\" width=\"14\" height=\"12\" fill=\"{}\"/>"
                       "<text x=\"{:.0f}\" y=\"67\" font-size=\"13\">{}</text>\n",
                       lx, kPalette[i % 6], lx + 19, xml_escape(lanes[i]));
    lx += 30 + 8.0 * double(lanes[i].size());
  }
  for (size_t k = 0; k < kinds.size(); ++k) {
    const double ox = 10 + double(k % size_t(cols)) * pw, oy = top + double(k / size_t(cols)) * ph;
    const double x0 = ox + ml, x1 = ox + pw - mr, y0 = oy + ph - mb, y1 = oy + mt;
    double ymax = 0;
    for (int64_t u : users)
      if (auto it = sums.find({kinds[k], u}); it != sums.end())
        for (const LaneSummary& l : it->second.lanes) ymax = std::max(ymax, l.max_tokens_per_s);
    const double step = nice_step(ymax / 5);
    const double top_v = std::max(step, std::ceil(ymax * 1.3 / step) * step);  // room for the upright ratios
    auto y_of = [&](double v) { return y0 - (y0 - y1) * v / top_v; };
    svg += fmt::format("<g>\n<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"14\" font-weight=\"bold\" text-anchor=\"middle\">{}</text>\n",
                       (x0 + x1) / 2, oy + 20, xml_escape(kinds[k]));
    for (double v = 0; v <= top_v + step / 2; v += step) {
      svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#ddd\"/>"
                         "<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"end\">{}</text>\n",
                         x0, y_of(v), x1, y_of(v), x0 - 5, y_of(v) + 4, tick_label(v, top_v >= 10000));
    }
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" text-anchor=\"middle\" "
                       "transform=\"rotate(-90 {:.1f} {:.1f})\">tokens/s</text>\n",
                       ox + 14, (y0 + y1) / 2, ox + 14, (y0 + y1) / 2);
    const double gw = (x1 - x0) / double(std::max<size_t>(1, users.size()));
    const double bw = std::min(40.0, gw * 0.8 / double(std::max<size_t>(1, lanes.size())));
    for (size_t g = 0; g < users.size(); ++g) {
      const double gx = x0 + gw * double(g) + (gw - bw * double(lanes.size())) / 2;
      svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"12\" text-anchor=\"middle\">{} user{}</text>\n",
                         x0 + gw * (double(g) + 0.5), y0 + 17, users[g], users[g] == 1 ? "" : "s");
      auto it = sums.find({kinds[k], users[g]});
      if (it == sums.end()) continue;
      for (const LaneSummary& l : it->second.lanes) {
        const size_t li = size_t(std::find(lanes.begin(), lanes.end(), l.lane) - lanes.begin());
        const double bx = gx + bw * double(li), by = y_of(l.mean_tokens_per_s);
        svg += fmt::format("<rect x=\"{:.1f}\" y=\"{:.1f}\" width=\"{:.1f}\" height=\"{:.1f}\" fill=\"{}\">"
                           "<title>{}</title></rect>\n",
                           bx + 1, by, bw - 2, std::max(0.0, y0 - by), kPalette[li % 6],
                           xml_escape(fmt::format("{} {} users {}: {} tok/s", kinds[k], users[g], l.lane, num(l.mean_tokens_per_s))));
        const double cx = bx + bw / 2;
        if (l.repeats > 1)
          svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"#222\"/>"
                             "<line x1=\"{3:.1f}\" y1=\"{1:.1f}\" x2=\"{4:.1f}\" y2=\"{1:.1f}\" stroke=\"#222\"/>"
                             "<line x1=\"{3:.1f}\" y1=\"{2:.1f}\" x2=\"{4:.1f}\" y2=\"{2:.1f}\" stroke=\"#222\"/>\n",
                             cx, y_of(l.min_tokens_per_s), y_of(l.max_tokens_per_s), cx - 4, cx + 4);
        if (l.ratio)  // upright text over a bar this narrow would run into its neighbours' labels
          svg += fmt::format("<text x=\"{0:.1f}\" y=\"{1:.1f}\" font-size=\"11\" font-weight=\"bold\" "
                             "transform=\"rotate(-90 {0:.1f} {1:.1f})\" dominant-baseline=\"middle\">{2}</text>\n",
                             cx, y_of(l.max_tokens_per_s) - 4,
                             xml_escape(fmt::format("×{:.2f}{}", *l.ratio, it->second.steady ? "" : " †")));
      }
    }
    svg += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{2:.1f}\" y2=\"{1:.1f}\" stroke=\"#333\"/>"
                       "<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{3:.1f}\" stroke=\"#333\"/>\n</g>\n",
                       x0, y0, x1, y1);
  }
  svg += fmt::format("<text x=\"14\" y=\"{:.0f}\" font-size=\"11\" fill=\"#444\">{}</text>\n", height - 12,
                     xml_escape(report.command.size() > 180 ? report.command.substr(0, 177) + "..." : report.command));
  svg += "</svg>\n";
  return svg;
}

std::string result_stem(const Report& report) {
  std::string s = fmt::format("{}-{}-{}", report.date, report.label, report.device);
  for (char& ch : s)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-')) ch = '-';
  return s;
}

}  // namespace tandem::bench
