// Scoring `diagnose` against a folder of labelled logs: <name>.log + <name>.expected.json (the
// fields that must match, as in tests/data/logs). Used by bench/diagnose/diagnose_accuracy and by
// the accuracy test over tests/data/logs/real.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lt::diagnose {

struct Tally {
  int correct = 0;
  int total = 0;
  double ratio() const { return total > 0 ? static_cast<double>(correct) / total : 1.0; }
};

struct FieldMiss {
  std::string field;
  nlohmann::json expected;
  nlohmann::json got;
};

struct CaseScore {
  std::string name;             // the log's file name
  std::vector<FieldMiss> misses;
  nlohmann::json diagnosis;     // to_json() of the diagnosis
};

struct AccuracyReport {
  int cases = 0;
  Tally oom;        // expected "oom" vs the verdict (every case that states it)
  Tally phase;      // expected "phase" (every case that states it)
  Tally first_fix;  // expected "first_fix" on cases expected to be GPU OOMs
  Tally fields;     // every stated field
  std::vector<CaseScore> scored;  // all cases, in name order
};

// The tool's value for an expectation key: "first_fix" is the first fix's id, "tried_to_allocate"
// the memory number, anything else the JSON field of that name.
nlohmann::json actual_field(const nlohmann::json& diagnosis, const std::string& key);

// Whether `got` satisfies `expected`: equal, or one of an expected array for "first_fix"/"phase"
// (labels that accept several answers).
bool field_matches(const std::string& key, const nlohmann::json& expected, const nlohmann::json& got);

// Diagnoses every <name>.log of `dir` (not recursive) that has a <name>.expected.json.
// Throws lt::InputError when the folder cannot be read or an expectation is not valid JSON.
AccuracyReport score_folder(const std::filesystem::path& dir);

}  // namespace lt::diagnose
