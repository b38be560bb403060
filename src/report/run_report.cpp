// report.html from a run folder (see run_report.h): reading the folder, then the page top to
// bottom: header, loss chart with the guard's actions on it, learning rate, peak memory per
// phase, the guard's actions in a table, preview grids by step, the settings in effect.
#include "loratrain/report/run_report.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <sstream>

#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::report {

namespace fs = std::filesystem;
using nlohmann::json;

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      case '\n':
      case '\t': out += c; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) out += "\xEF\xBF\xBD";  // U+FFFD
        else out += c;
    }
  }
  return out;
}

// ---- reading the run folder ------------------------------------------------------------------

namespace {

constexpr uintmax_t kMaxTextBytes = 4 * 1024 * 1024;  // config.yaml and report.json are far smaller

std::optional<std::string> read_text(const fs::path& path, std::vector<std::string>& notes) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  const uintmax_t size = fs::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (ec || !in) {
    notes.push_back(path.filename().string() + " cannot be read");
    return std::nullopt;
  }
  std::string text(static_cast<size_t>(std::min(size, kMaxTextBytes)), '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (size > kMaxTextBytes) notes.push_back(path.filename().string() + " is larger than 4 MiB: shown in part");
  return text;
}

std::string text_of(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_null()) return "";
  return j.dump();
}

template <typename T>
T number_or(const json& j, const char* key, T fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<T>() : fallback;
}

std::string string_or(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() ? text_of(*it) : "";
}

void read_report_json(const fs::path& path, RunSummary& run) {
  auto text = read_text(path, run.notes);
  if (!text) {
    run.outcome = "unknown";
    run.notes.push_back("no report.json yet: outcome, OOM-guard actions and memory per phase are not known");
    return;
  }
  json r;
  try {
    r = json::parse(*text);
  } catch (const json::exception& e) {
    run.outcome = "unknown";
    run.notes.push_back("report.json is not valid JSON (" + printable(e.what()) + ")");
    return;
  }
  if (!r.is_object()) {
    run.outcome = "unknown";
    run.notes.push_back("report.json is not a JSON object");
    return;
  }
  run.outcome = string_or(r, "outcome");
  if (run.outcome.empty()) run.outcome = "unknown";
  run.exit_code = number_or<int>(r, "exit_code", 0);
  run.steps_completed = number_or<int64_t>(r, "steps_completed", 0);
  run.total_steps = number_or<int64_t>(r, "total_steps", 0);
  run.device = string_or(r, "device");
  run.lora = string_or(r, "lora");
  if (auto it = r.find("attempts"); it != r.end() && it->is_array()) {
    for (const auto& a : *it) {
      if (!a.is_object()) continue;
      GuardMark m;
      m.kind = "oom";
      m.step = number_or<int64_t>(a, "step", 0);
      m.phase = string_or(a, "phase");
      m.classification = string_or(a, "classification");
      m.action = string_or(a, "action");
      m.description = string_or(a, "description");
      m.error = string_or(a, "error");
      run.marks.push_back(std::move(m));
    }
  }
  if (auto it = r.find("planned_changes"); it != r.end() && it->is_array()) {
    for (const auto& c : *it) {
      if (!c.is_object()) continue;
      PlannedMark m;
      m.phase = string_or(c, "phase");
      m.action = string_or(c, "action");
      m.description = string_or(c, "description");
      m.predicted_before = number_or<int64_t>(c, "predicted_peak_before", 0);
      m.predicted_after = number_or<int64_t>(c, "predicted_peak_after", 0);
      run.planned.push_back(std::move(m));
    }
  }
  if (auto it = r.find("scale_ups"); it != r.end() && it->is_array()) {
    for (const auto& s : *it) {
      if (!s.is_object()) continue;
      GuardMark m;
      m.kind = "scale-up";
      m.step = number_or<int64_t>(s, "step", 0);
      m.phase = "train_step";
      m.action = string_or(s, "lever");
      m.description = string_or(s, "description");
      auto reverted = s.find("reverted");
      if (reverted != s.end() && reverted->is_boolean() && reverted->get<bool>()) m.description += " (reverted)";
      run.marks.push_back(std::move(m));
    }
  }
  std::stable_sort(run.marks.begin(), run.marks.end(), [](const GuardMark& a, const GuardMark& b) { return a.step < b.step; });
  if (auto it = r.find("peaks"); it != r.end() && it->is_object()) {
    for (auto p = it->begin(); p != it->end(); ++p) {
      if (!p->is_object()) continue;
      run.peaks.push_back({p.key(), number_or<int64_t>(*p, "peak_allocated", 0), number_or<int64_t>(*p, "peak_reserved", 0),
                           number_or<int64_t>(*p, "entered", 0)});
    }
    // In the order a run goes through them (JSON objects come back sorted by name).
    const auto order = [](const std::string& phase) {
      const char* kOrder[] = {"load", "cache", "baseline_sample", "train_step", "sample", "save"};
      return std::find(std::begin(kOrder), std::end(kOrder), phase) - std::begin(kOrder);
    };
    std::stable_sort(run.peaks.begin(), run.peaks.end(), [&](const PhasePeak& a, const PhasePeak& b) { return order(a.phase) < order(b.phase); });
  }
  const json initial = r.value("initial_settings", json::object());
  if (auto it = r.find("final_settings"); it != r.end() && it->is_object()) {
    for (auto s = it->begin(); s != it->end(); ++s) {
      run.settings.emplace_back(s.key(), text_of(*s));
      if (initial.is_object() && initial.contains(s.key()) && initial[s.key()] != *s) run.changed_settings.push_back(s.key());
    }
  }
}

void read_metrics(const fs::path& path, RunSummary& run) {
  std::ifstream in(path);
  if (!in) return;
  std::map<int64_t, StepPoint> by_step;
  size_t broken = 0;
  for (std::string line; std::getline(in, line);) {
    if (trim(line).empty()) continue;
    try {
      const json j = json::parse(line);
      StepPoint p;
      p.step = j.at("step").get<int64_t>();
      p.loss = j.at("loss").get<double>();
      p.loss_avg = j.value("loss_avg", p.loss);
      p.lr = j.value("lr", 0.0);
      p.mem_peak = j.value("mem_peak", int64_t{0});
      p.width = j.value("width", int64_t{0});
      p.height = j.value("height", int64_t{0});
      by_step[p.step] = p;  // a step run again after a crash keeps its last line
    } catch (const json::exception&) {
      ++broken;  // e.g. a last line cut off by a crash
    }
  }
  for (const auto& [step, p] : by_step) run.steps.push_back(p);
  if (broken > 0) run.notes.push_back(fmt::format("metrics.jsonl: {} unreadable line(s) skipped", broken));
}

void find_grids(const fs::path& samples, RunSummary& run) {
  std::error_code ec;
  if (!fs::is_directory(samples, ec)) return;
  static const std::regex grid(R"(grid_(\d{1,12})\.png)");
  for (const auto& entry : fs::directory_iterator(samples, ec)) {
    const std::string name = entry.path().filename().string();
    std::smatch m;
    if (std::regex_match(name, m, grid)) run.grids.push_back({std::stoll(m[1].str()), "samples/" + name});
  }
  std::sort(run.grids.begin(), run.grids.end(), [](const SampleGrid& a, const SampleGrid& b) { return a.step < b.step; });
}

}  // namespace

RunSummary read_run_folder(const fs::path& run_dir) {
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) throw InputError(run_dir.string() + ": no such run folder");
  if (!fs::exists(run_dir / "config.yaml", ec) && !fs::exists(run_dir / "metrics.jsonl", ec) &&
      !fs::exists(run_dir / "report.json", ec)) {
    throw InputError(run_dir.string() + ": not a run folder (no config.yaml, metrics.jsonl or report.json); pass the "
                                        "folder `lora-train run` trains into: training_folder/<config name>");
  }
  RunSummary run;
  const fs::path normal = run_dir.lexically_normal();
  run.name = (normal.has_filename() ? normal : normal.parent_path()).filename().string();
  read_report_json(run_dir / "report.json", run);
  read_metrics(run_dir / "metrics.jsonl", run);
  find_grids(run_dir / "samples", run);
  if (auto text = read_text(run_dir / "config.yaml", run.notes)) run.config_yaml = *text;
  if (!run.steps.empty()) run.steps_completed = std::max(run.steps_completed, run.steps.back().step);
  return run;
}

// ---- SVG charts ------------------------------------------------------------------------------

namespace {

constexpr double kChartWidth = 960, kChartHeight = 260;
constexpr double kLeft = 70, kRight = 16, kTop = 14, kBottom = 34;

std::string num(double v) { return fmt::format("{:.4g}", v); }
std::string px(double v) { return fmt::format("{:.1f}", v); }

// Round tick positions (1, 2 or 5 times a power of ten) covering [lo, hi].
std::vector<double> ticks(double lo, double hi, int wanted = 5) {
  if (!(hi > lo)) return {lo};
  const double raw = (hi - lo) / wanted;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  double step = magnitude;
  for (double f : {1.0, 2.0, 5.0, 10.0}) {
    step = f * magnitude;
    if (step >= raw) break;
  }
  std::vector<double> out;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push_back(std::fabs(t) < step * 1e-9 ? 0 : t);
  return out;
}

// Maps data coordinates into the plot area of one chart.
struct Axes {
  double x_lo, x_hi, y_lo, y_hi;
  double x(double v) const { return kLeft + (v - x_lo) / (x_hi - x_lo) * (kChartWidth - kLeft - kRight); }
  double y(double v) const { return kTop + (y_hi - v) / (y_hi - y_lo) * (kChartHeight - kTop - kBottom); }
};

Axes axes_for(const std::vector<StepPoint>& steps, int64_t total_steps, double y_lo, double y_hi) {
  const double x_hi = static_cast<double>(std::max<int64_t>({total_steps, steps.empty() ? 1 : steps.back().step, 1}));
  if (!(y_hi > y_lo)) {
    const double pad = std::fabs(y_lo) > 0 ? std::fabs(y_lo) * 0.1 : 1.0;
    y_lo -= pad;
    y_hi += pad;
  } else {
    const double pad = (y_hi - y_lo) * 0.05;
    y_lo -= pad;
    y_hi += pad;
  }
  return {0, x_hi, y_lo, y_hi};
}

// Grid lines, tick labels and the axis titles.
std::string frame(const Axes& a, const std::string& y_title) {
  std::string s;
  for (double t : ticks(a.y_lo, a.y_hi)) {
    s += fmt::format(R"(<line class="grid" x1="{}" x2="{}" y1="{}" y2="{}"/>)", px(kLeft), px(kChartWidth - kRight), px(a.y(t)), px(a.y(t)));
    s += fmt::format(R"(<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>)", px(kLeft - 6), px(a.y(t) + 4), num(t));
  }
  for (double t : ticks(a.x_lo, a.x_hi, 8)) {
    if (t != std::floor(t)) continue;  // steps are whole
    s += fmt::format(R"(<text class="tick" x="{}" y="{}" text-anchor="middle">{}</text>)", px(a.x(t)), px(kChartHeight - kBottom + 16), num(t));
  }
  s += fmt::format(R"(<line class="axis" x1="{0}" x2="{0}" y1="{1}" y2="{2}"/><line class="axis" x1="{0}" x2="{3}" y1="{2}" y2="{2}"/>)",
                   px(kLeft), px(kTop), px(kChartHeight - kBottom), px(kChartWidth - kRight));
  s += fmt::format(R"(<text class="axis-title" x="{}" y="{}" text-anchor="middle">step</text>)", px((kLeft + kChartWidth) / 2),
                   px(kChartHeight - 4));
  s += fmt::format(R"~(<text class="axis-title" x="12" y="{}" text-anchor="middle" transform="rotate(-90 12 {})">{}</text>)~",
                   px(kChartHeight / 2), px(kChartHeight / 2), html_escape(y_title));
  return s;
}

// A polyline through (step, value) as an SVG path; long runs keep every k-th point (and the last).
std::string series_path(const std::vector<StepPoint>& steps, const Axes& a, double StepPoint::*value, const char* css_class) {
  if (steps.empty()) return "";
  const size_t stride = std::max<size_t>(1, steps.size() / 2000);
  std::string d;
  for (size_t i = 0; i < steps.size(); i += stride) {
    d += fmt::format("{}{},{} ", d.empty() ? "M" : "L", px(a.x(static_cast<double>(steps[i].step))), px(a.y(steps[i].*value)));
  }
  if ((steps.size() - 1) % stride != 0) {
    d += fmt::format("L{},{}", px(a.x(static_cast<double>(steps.back().step))), px(a.y(steps.back().*value)));
  }
  return fmt::format(R"(<path class="{}" d="{}"/>)", css_class, trim(d));
}

std::string mark_title(const GuardMark& m) {
  std::string t = fmt::format("step {}, {}: ", m.step, m.phase);
  if (m.kind == "oom") {
    t += "OOM";
    if (!m.classification.empty()) t += " (" + m.classification + ")";
    t += " -> " + m.description;
  } else {
    t += "scale-up: " + m.description;
  }
  return t;
}

std::string svg_open(const char* id, const std::string& label, double height = kChartHeight) {
  return fmt::format(R"(<svg id="{}" class="chart" role="img" aria-label="{}" viewBox="0 0 {} {}" width="{}" height="{}">)", id,
                     html_escape(label), px(kChartWidth), px(height), px(kChartWidth), px(height));
}

std::string loss_chart(const RunSummary& run) {
  double lo = run.steps.front().loss, hi = lo;
  for (const auto& p : run.steps) {
    lo = std::min({lo, p.loss, p.loss_avg});
    hi = std::max({hi, p.loss, p.loss_avg});
  }
  const Axes a = axes_for(run.steps, run.total_steps, lo, hi);
  std::string s = svg_open("loss-chart", "loss and its moving average by step, with the OOM guard's actions");
  s += frame(a, "loss");
  s += series_path(run.steps, a, &StepPoint::loss, "loss");
  s += series_path(run.steps, a, &StepPoint::loss_avg, "loss-avg");
  for (const GuardMark& m : run.marks) {
    const double x = a.x(static_cast<double>(std::clamp<int64_t>(m.step, 0, static_cast<int64_t>(a.x_hi))));
    s += fmt::format(R"(<g class="guard-mark {}" data-step="{}"><title>{}</title>)"
                     R"(<line x1="{}" x2="{}" y1="{}" y2="{}"/><circle cx="{}" cy="{}" r="5"/></g>)",
                     m.kind, m.step, html_escape(mark_title(m)), px(x), px(x), px(kTop), px(kChartHeight - kBottom), px(x), px(kTop + 5));
  }
  return s + "</svg>";
}

std::string lr_chart(const RunSummary& run) {
  double lo = run.steps.front().lr, hi = lo;
  for (const auto& p : run.steps) {
    lo = std::min(lo, p.lr);
    hi = std::max(hi, p.lr);
  }
  const Axes a = axes_for(run.steps, run.total_steps, std::min(lo, 0.0), hi);
  return svg_open("lr-chart", "learning rate by step") + frame(a, "learning rate") +
         series_path(run.steps, a, &StepPoint::lr, "lr") + "</svg>";
}

// Horizontal bars, one row per phase: reserved (light) behind allocated (dark).
std::string memory_chart(const RunSummary& run) {
  constexpr double row = 30, label_width = 130, value_width = 190;
  const double height = kTop + row * static_cast<double>(run.peaks.size()) + 8;
  int64_t top = 1;
  for (const auto& p : run.peaks) top = std::max({top, p.peak_allocated, p.peak_reserved});
  const double bar_width = kChartWidth - label_width - value_width - kRight;
  std::string s = svg_open("memory-chart", "peak device memory per phase", height);
  for (size_t i = 0; i < run.peaks.size(); ++i) {
    const PhasePeak& p = run.peaks[i];
    const double y = kTop + row * static_cast<double>(i);
    const auto width = [&](int64_t bytes) { return px(bar_width * static_cast<double>(bytes) / static_cast<double>(top)); };
    s += fmt::format(R"(<g class="mem-row" data-phase="{}"><title>{}: peak {} allocated, {} reserved, entered {} times</title>)",
                     html_escape(p.phase), html_escape(p.phase), format_bytes(p.peak_allocated), format_bytes(p.peak_reserved), p.entered);
    s += fmt::format(R"(<text class="tick" x="{}" y="{}" text-anchor="end">{}</text>)", px(label_width - 8), px(y + 15), html_escape(p.phase));
    s += fmt::format(R"(<rect class="mem-reserved" x="{}" y="{}" width="{}" height="20"/>)", px(label_width), px(y), width(p.peak_reserved));
    s += fmt::format(R"(<rect class="mem-peak" x="{}" y="{}" width="{}" height="20"/>)", px(label_width), px(y + 4),
                     width(p.peak_allocated));
    s += fmt::format(R"(<text class="tick" x="{}" y="{}">{} / {}</text></g>)", px(label_width + bar_width + 8), px(y + 15),
                     format_bytes(p.peak_allocated), format_bytes(p.peak_reserved));
  }
  return s + "</svg>";
}

// ---- the page --------------------------------------------------------------------------------

constexpr int kRefreshSeconds = 30;

constexpr const char* kStyle = R"(
body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1000px; padding: 16px 20px 40px; color: #1d2430; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #d8dde6; }
.status { display: inline-block; padding: 1px 9px; border-radius: 10px; font-weight: 600; background: #e4e8ef; }
.status.running { background: #dbeafe; } .status.completed { background: #d9f2df; } .status.failed { background: #fbe0de; }
.facts { color: #4a5568; } .note { color: #8a4b08; }
svg.chart { max-width: 100%; height: auto; background: #fbfcfe; border: 1px solid #e2e6ee; }
.grid { stroke: #e6e9f0; } .axis { stroke: #5a6474; } .tick { font-size: 11px; fill: #4a5568; } .axis-title { font-size: 12px; fill: #2d3748; }
path.loss { fill: none; stroke: #9db4d6; stroke-width: 1; } path.loss-avg { fill: none; stroke: #1f4e99; stroke-width: 2.2; }
path.lr { fill: none; stroke: #2f855a; stroke-width: 2; }
.guard-mark line { stroke: #c53030; stroke-width: 1.5; stroke-dasharray: 4 3; } .guard-mark circle { fill: #c53030; }
.guard-mark.scale-up line { stroke: #2b6cb0; } .guard-mark.scale-up circle { fill: #2b6cb0; }
rect.mem-reserved { fill: #d6e0f0; } rect.mem-peak { fill: #3b5b92; }
.legend span { margin-right: 16px; } .swatch { display: inline-block; width: 14px; height: 4px; vertical-align: middle; margin-right: 5px; }
table { border-collapse: collapse; width: 100%; font-size: 13px; } th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e2e6ee; vertical-align: top; }
tr.changed td { background: #fff4d6; }
.grids { display: flex; flex-wrap: wrap; gap: 14px; } figure { margin: 0; } figure img { width: 240px; height: auto; border: 1px solid #d8dde6; image-rendering: pixelated; }
figcaption { font-size: 13px; color: #4a5568; }
pre { background: #f4f6fa; padding: 10px; overflow-x: auto; font-size: 12.5px; }
)";

std::string status_class(const std::string& outcome) {
  if (outcome == "running") return "running";
  if (outcome == "completed") return "completed";
  if (outcome == "unknown") return "";
  return "failed";
}

std::string header(const RunSummary& run, const std::string& written_at) {
  std::string s = "<header><h1>" + html_escape(run.name) + "</h1>";
  std::string status = run.outcome;
  if (!run.live() && run.outcome != "unknown") status += fmt::format(" (exit {})", run.exit_code);
  s += "<p><span id=\"status\" class=\"status " + status_class(run.outcome) + "\">" + html_escape(status) + "</span> ";
  s += fmt::format("step {} of {}", run.steps_completed, run.total_steps > 0 ? std::to_string(run.total_steps) : "?");
  if (!run.device.empty()) s += " &middot; " + html_escape(run.device);
  s += "</p><p class=\"facts\">page written " + html_escape(written_at);
  if (run.live()) s += fmt::format("; the run is live: this page reloads every {} s", kRefreshSeconds);
  s += "</p>";
  if (!run.lora.empty()) s += "<p class=\"facts\">LoRA: <code>" + html_escape(run.lora) + "</code></p>";
  for (const auto& note : run.notes) s += "<p class=\"note\">" + html_escape(note) + "</p>";
  return s + "</header>\n";
}

std::string loss_section(const RunSummary& run) {
  std::string s = "<section id=\"loss\"><h2>Loss</h2>";
  if (run.steps.empty()) return s + "<p>No step has finished yet.</p></section>\n";
  const StepPoint& last = run.steps.back();
  s += fmt::format("<p>step {}: loss {}, moving average {}, learning rate {}{}</p>", last.step, num(last.loss), num(last.loss_avg),
                   num(last.lr), last.width > 0 ? fmt::format(", bucket {}x{}", last.width, last.height) : std::string());
  s += "<p class=\"legend\"><span><i class=\"swatch\" style=\"background:#9db4d6\"></i>loss per step</span>"
       "<span><i class=\"swatch\" style=\"background:#1f4e99\"></i>moving average</span>"
       "<span><i class=\"swatch\" style=\"background:#c53030\"></i>OOM-guard action</span>"
       "<span><i class=\"swatch\" style=\"background:#2b6cb0\"></i>scale-up</span></p>";
  s += loss_chart(run);
  s += "</section>\n<section id=\"lr\"><h2>Learning rate</h2>" + lr_chart(run) + "</section>\n";
  return s;
}

std::string memory_section(const RunSummary& run) {
  std::string s = "<section id=\"memory\"><h2>Peak memory per phase</h2>";
  if (run.peaks.empty()) return s + "<p>No memory recorded yet.</p></section>\n";
  s += "<p class=\"legend\"><span><i class=\"swatch\" style=\"background:#3b5b92\"></i>peak allocated</span>"
       "<span><i class=\"swatch\" style=\"background:#d6e0f0\"></i>peak reserved</span></p>";
  return s + memory_chart(run) + "</section>\n";
}

std::string guard_section(const RunSummary& run) {
  std::string s = "<section id=\"guard\"><h2>OOM guard</h2>";
  if (!run.planned.empty()) {
    // The planner's changes come before step 1: a table of their own, not marks on the loss chart.
    s += "<p>Planned before the start (the planner predicted a phase would not fit; not an OOM):</p>"
         "<table id=\"planned\"><thead><tr><th>phase</th><th>predicted peak</th><th>change</th></tr></thead><tbody>";
    for (const PlannedMark& m : run.planned) {
      s += fmt::format("<tr class=\"planned-row\"><td>{}</td><td>{} &rarr; {}</td><td>{}</td></tr>", html_escape(m.phase),
                       format_bytes(m.predicted_before), format_bytes(m.predicted_after), html_escape(m.description));
    }
    s += "</tbody></table>";
  }
  if (run.marks.empty()) return s + "<p>No out-of-memory recovery and no scale-up in this run.</p></section>\n";
  s += "<table><thead><tr><th>step</th><th>phase</th><th>what happened</th><th>what changed</th><th>error</th></tr></thead><tbody>";
  for (const GuardMark& m : run.marks) {
    const std::string what = m.kind == "oom" ? "OOM" + (m.classification.empty() ? std::string() : " (" + m.classification + ")")
                                             : "scale-up (" + m.action + ")";
    s += fmt::format("<tr class=\"guard-row {}\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", m.kind, m.step,
                     html_escape(m.phase), html_escape(what), html_escape(m.description), html_escape(m.error));
  }
  return s + "</tbody></table></section>\n";
}

std::string samples_section(const RunSummary& run) {
  std::string s = "<section id=\"samples\"><h2>Previews by step</h2>";
  if (run.grids.empty()) return s + "<p>No preview grid yet.</p></section>\n";
  s += "<div class=\"grids\">";
  for (const SampleGrid& g : run.grids) {
    s += fmt::format("<figure><img src=\"{}\" alt=\"preview grid at step {}\"><figcaption>step {}{}</figcaption></figure>",
                     html_escape(g.file), g.step, g.step, g.step == 0 ? " (before training)" : "");
  }
  return s + "</div></section>\n";
}

std::string settings_section(const RunSummary& run) {
  std::string s = "<section id=\"settings\"><h2>Settings in effect</h2>";
  if (!run.settings.empty()) {
    s += "<p>Memory settings now";
    s += run.changed_settings.empty() ? " (as configured):" : " (highlighted: changed by the OOM guard):";
    s += "</p><table><tbody>";
    for (const auto& [key, value] : run.settings) {
      const bool changed = std::find(run.changed_settings.begin(), run.changed_settings.end(), key) != run.changed_settings.end();
      s += fmt::format("<tr{}><td>{}</td><td>{}</td></tr>", changed ? " class=\"changed\"" : "", html_escape(key), html_escape(value));
    }
    s += "</tbody></table>";
  }
  if (!run.config_yaml.empty()) {
    s += "<p>config.yaml (the effective config the run started from):</p><pre id=\"config\">" + html_escape(run.config_yaml) + "</pre>";
  }
  return s + "</section>\n";
}

}  // namespace

std::string render_html(const RunSummary& run, const std::string& written_at) {
  std::string page = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  if (run.live()) page += fmt::format("<meta http-equiv=\"refresh\" content=\"{}\">\n", kRefreshSeconds);
  page += "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n";
  page += "<title>" + html_escape(run.name) + " - lora-train report</title>\n<style>" + std::string(kStyle) + "</style></head>\n<body>\n";
  page += header(run, written_at);
  page += loss_section(run);
  page += memory_section(run);
  page += guard_section(run);
  page += samples_section(run);
  page += settings_section(run);
  page += "</body></html>\n";
  return page;
}

fs::path write_run_report(const fs::path& run_dir) {
  const RunSummary run = read_run_folder(run_dir);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char written_at[32];
  std::strftime(written_at, sizeof written_at, "%Y-%m-%d %H:%M:%S", &local);
  const fs::path path = run_dir / "report.html";
  write_file_atomic(path, render_html(run, written_at));
  return path;
}

}  // namespace lt::report
