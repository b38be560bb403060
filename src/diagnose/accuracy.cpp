#include "loratrain/diagnose/accuracy.h"

#include <algorithm>
#include <fstream>

#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/report.h"
#include "loratrain/util/error.h"

namespace lt::diagnose {

namespace fs = std::filesystem;

nlohmann::json actual_field(const nlohmann::json& diagnosis, const std::string& key) {
  if (key == "first_fix") return diagnosis["fixes"].empty() ? nlohmann::json(nullptr) : diagnosis["fixes"][0]["id"];
  if (key == "tried_to_allocate") return diagnosis["memory"]["tried_to_allocate"];
  return diagnosis.contains(key) ? diagnosis.at(key) : nlohmann::json(nullptr);
}

bool field_matches(const std::string& key, const nlohmann::json& expected, const nlohmann::json& got) {
  if (expected.is_array() && (key == "first_fix" || key == "phase"))
    return std::find(expected.begin(), expected.end(), got) != expected.end();
  return expected == got;
}

AccuracyReport score_folder(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError("not a folder of labelled logs: " + dir.string());
  std::vector<fs::path> logs;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".log") continue;
    fs::path expected = e.path();
    expected.replace_extension(".expected.json");
    if (fs::exists(expected)) logs.push_back(e.path());
  }
  if (ec) throw InputError("cannot read " + dir.string() + ": " + ec.message());
  std::sort(logs.begin(), logs.end());

  AccuracyReport report;
  for (const fs::path& log : logs) {
    fs::path exp_path = log;
    exp_path.replace_extension(".expected.json");
    std::ifstream in(exp_path);
    nlohmann::json expected;
    try {
      expected = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(exp_path.string() + ": not valid JSON (" + e.what() + ")");
    }
    CaseScore score;
    score.name = log.filename().string();
    score.diagnosis = to_json(diagnose_path(log.string()), score.name);
    for (auto it = expected.begin(); it != expected.end(); ++it) {
      const nlohmann::json got = actual_field(score.diagnosis, it.key());
      const bool ok = field_matches(it.key(), it.value(), got);
      ++report.fields.total;
      report.fields.correct += ok;
      if (!ok) score.misses.push_back({it.key(), it.value(), got});
      Tally* tally = nullptr;
      if (it.key() == "oom") tally = &report.oom;
      if (it.key() == "phase") tally = &report.phase;
      if (it.key() == "first_fix" && expected.value("oom", false)) tally = &report.first_fix;
      if (tally) {
        ++tally->total;
        tally->correct += ok;
      }
    }
    ++report.cases;
    report.scored.push_back(std::move(score));
  }
  return report;
}

}  // namespace lt::diagnose
