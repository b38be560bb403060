// The smoke run: the real config made short (N steps at its largest resolution, one preview, one
// save, a temporary folder), run under the guard like any other, then judged from its report.
#include "loratrain/train/smoke.h"

#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loratrain/config/config.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

fs::path make_temp_folder(const std::optional<fs::path>& root) {
  const fs::path base = root.value_or(fs::temp_directory_path());
  fs::create_directories(base);
  std::string pattern = (base / "lora-train-smoke-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) throw Error(ExitCode::kRuntime, "could not make a temporary folder in " + base.string());
  return pattern;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default:
        // XML 1.0 allows tab, newline and carriage return among the control characters.
        if (static_cast<unsigned char>(c) < 0x20 && c != '\t' && c != '\n' && c != '\r') out += ' ';
        else out += c;
    }
  }
  return out;
}

std::string iso_time_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  return buf;
}

// Mean seconds of the steps after the first (the first pays one-time costs), from metrics.jsonl.
double seconds_per_step(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<double> seconds;
  std::string line;
  while (std::getline(in, line)) {
    if (trim(line).empty()) continue;
    const json j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("seconds")) seconds.push_back(j["seconds"].get<double>());
  }
  if (seconds.empty()) return 0;
  const size_t from = seconds.size() > 1 ? 1 : 0;
  double sum = 0;
  for (size_t i = from; i < seconds.size(); ++i) sum += seconds[i];
  return sum / static_cast<double>(seconds.size() - from);
}

struct Verdict {
  int exit_code = 0;
  std::string summary;
};

// The JUnit XML a CI system reads: one suite; a test case per phase that ran (its peak), one for
// the step time and one for the verdict (a failure when the config did not fit as written, an
// error when the run failed).
std::string junit_xml(const std::string& config, const SmokeResult& r, const json& report, const Verdict& v,
                      double total_seconds) {
  const json peaks = report.value("peaks", json::object());
  std::vector<std::string> cases;
  for (const auto& [phase, p] : peaks.items()) {
    const int64_t peak = p.value("peak_allocated", int64_t{0});
    cases.push_back(fmt::format("    <testcase classname=\"smoke.memory\" name=\"{}\" time=\"0\">\n"
                                "      <system-out>peak {} ({} bytes)</system-out>\n    </testcase>\n",
                                xml_escape(phase), format_bytes(peak), peak));
  }
  cases.push_back(fmt::format("    <testcase classname=\"smoke.speed\" name=\"seconds_per_step\" time=\"{:.3f}\">\n"
                              "      <system-out>{:.3f} s/step over {} steps</system-out>\n    </testcase>\n",
                              r.seconds_per_step, r.seconds_per_step, report.value("steps_completed", 0)));
  std::string verdict_body;
  int failures = 0, errors = 0;
  if (v.exit_code == 3 && !r.changes.empty() && report.value("exit_code", 0) == 0) {
    failures = 1;
    std::string list;
    for (const auto& c : r.changes) list += c + "\n";
    verdict_body = fmt::format("\n      <failure message=\"{}\" type=\"changed\">{}</failure>\n    ",
                               xml_escape(v.summary), xml_escape(list));
  } else if (v.exit_code != 0) {
    errors = 1;
    verdict_body = fmt::format("\n      <error message=\"{}\" type=\"exit {}\"/>\n    ", xml_escape(v.summary), v.exit_code);
  }
  cases.push_back(fmt::format("    <testcase classname=\"smoke\" name=\"fits_unchanged\" time=\"{:.3f}\">{}</testcase>\n",
                              total_seconds, verdict_body));
  std::string properties;
  auto property = [&](const std::string& name, const std::string& value) {
    properties += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", xml_escape(name), xml_escape(value));
  };
  property("config", config);
  property("run_dir", r.run_dir.string());
  property("exit_code", std::to_string(v.exit_code));
  property("seconds_per_step", fmt::format("{:.4f}", r.seconds_per_step));
  property("device", report.value("device", std::string()));
  for (const auto& [phase, p] : peaks.items()) property("peak_" + phase, std::to_string(p.value("peak_allocated", int64_t{0})));
  for (size_t i = 0; i < r.changes.size(); ++i) property(fmt::format("change_{}", i + 1), r.changes[i]);
  const std::string suite = "lora-train smoke " + config;
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<testsuites name=\"lora-train smoke\" tests=\"{0}\" failures=\"{1}\" errors=\"{2}\" time=\"{3:.3f}\">\n"
      "  <testsuite name=\"{4}\" tests=\"{0}\" failures=\"{1}\" errors=\"{2}\" skipped=\"0\" time=\"{3:.3f}\" "
      "timestamp=\"{5}\">\n    <properties>\n{6}    </properties>\n{7}  </testsuite>\n</testsuites>\n",
      cases.size(), failures, errors, total_seconds, xml_escape(suite), iso_time_now(), properties,
      [&] {
        std::string all;
        for (const auto& c : cases) all += c;
        return all;
      }());
}

}  // namespace

std::vector<std::string> smoke_overrides(const fs::path& config_path, const std::vector<std::string>& overrides, int steps,
                                         const fs::path& run_root) {
  const config::JobConfig job = config::load_config(config_path, overrides);
  const config::ProcessConfig& p = config::the_process(job);
  int largest = 0;
  for (const auto& d : p.datasets) {
    for (int r : d.resolution) largest = std::max(largest, r);
  }
  std::vector<std::string> out = overrides;
  out.push_back("training_folder=" + run_root.string());
  out.push_back("train.steps=" + std::to_string(steps));
  // Every image at the largest resolution: each step runs a largest bucket.
  for (size_t i = 0; i < p.datasets.size(); ++i) out.push_back(fmt::format("datasets.{}.resolution={}", i, flow_list({largest})));
  // One preview after the last step (none before training), one save at the end.
  out.push_back("train.skip_first_sample=true");
  out.push_back("train.force_first_sample=false");
  out.push_back("sample.sample_every=" + std::to_string(steps));
  out.push_back("sample.sample_start_step=0");
  out.push_back("save.save_every=" + std::to_string(steps));
  return out;
}

SmokeResult run_smoke(const SmokeRequest& request) {
  if (request.steps < 1) throw InputError("--smoke: the number of steps must be at least 1");
  const auto started = std::chrono::steady_clock::now();
  SmokeResult r;
  const fs::path root = make_temp_folder(request.temp_root);
  RunRequest run;
  run.config_path = request.config_path;
  run.overrides = smoke_overrides(request.config_path, request.overrides, request.steps, root);
  run.fresh = true;
  spdlog::info("smoke: {} steps of {} at its largest resolution, one preview, one save, in {}", request.steps,
               request.config_path.string(), root.string());

  RunResult result;
  std::optional<Error> failure;
  try {
    result = run_training(run);
  } catch (const Error& e) {
    failure.emplace(e.code(), e.what());
  }
  r.run_dir = result.run_dir;
  if (r.run_dir.empty()) {
    const config::JobConfig job = config::load_config(request.config_path, request.overrides);
    r.run_dir = root / job.name;
  }
  json report = json::object();
  if (fs::exists(r.run_dir / "report.json")) {
    std::ifstream in(r.run_dir / "report.json");
    report = json::parse(in, nullptr, false);
    if (!report.is_object()) report = json::object();
  }
  for (const auto& c : report.value("planned_changes", json::array())) r.changes.push_back("planned: " + c.value("description", ""));
  for (const auto& a : report.value("attempts", json::array())) {
    const std::string action = a.value("action", "");
    if (action == "empty_cache_retry" || starts_with(action, "give_up")) continue;
    r.changes.push_back(fmt::format("after an OOM in {}: {}", a.value("phase", ""), a.value("description", "")));
  }
  r.seconds_per_step = seconds_per_step(r.run_dir / "metrics.jsonl");

  Verdict v;
  if (failure) {
    v.exit_code = static_cast<int>(failure->code());
    v.summary = failure->what();
  } else if (result.exit_code != 0) {
    v.exit_code = result.exit_code;
    v.summary = fmt::format("the run ended with exit code {} ({})", result.exit_code, report.value("outcome", ""));
  } else if (!r.changes.empty()) {
    v.exit_code = static_cast<int>(ExitCode::kOomExhausted);
    v.summary = fmt::format("fits only after {} change(s) by the guard", r.changes.size());
    if (fs::exists(r.run_dir / "effective.yaml")) {
      r.fixed_yaml = r.run_dir / "fixed.yaml";
      fs::copy_file(r.run_dir / "effective.yaml", *r.fixed_yaml, fs::copy_options::overwrite_existing);
    }
  } else {
    v.summary = "fits unchanged";
  }
  if (result.exit_code == static_cast<int>(ExitCode::kOomExhausted) || result.exit_code == static_cast<int>(ExitCode::kEnvironment)) {
    if (fs::exists(r.run_dir / "fixed.yaml")) r.fixed_yaml = r.run_dir / "fixed.yaml";
  }
  r.exit_code = v.exit_code;
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

  if (fs::exists(r.run_dir)) {
    json smoke = {{"steps", request.steps},
                  {"exit_code", v.exit_code},
                  {"verdict", v.summary},
                  {"changes", r.changes},
                  {"seconds_per_step", r.seconds_per_step},
                  {"seconds", total},
                  {"fixed_yaml", r.fixed_yaml ? json(r.fixed_yaml->string()) : json(nullptr)}};
    report["smoke"] = smoke;
    write_file_atomic(r.run_dir / "report.json", report.dump(2) + "\n");
  }
  if (request.junit) {
    write_file_atomic(*request.junit, junit_xml(request.config_path.string(), r, report, v, total));
  }
  for (const auto& c : r.changes) spdlog::info("smoke: change: {}", c);
  spdlog::info("smoke: {} (exit {}), {:.3f} s/step; report {}{}", v.summary, v.exit_code, r.seconds_per_step,
               (r.run_dir / "report.json").string(), r.fixed_yaml ? ", fixed config " + r.fixed_yaml->string() : "");
  if (failure) throw *failure;
  return r;
}

}  // namespace lt::train
