// Output of `lora-train diagnose`: the human report and the JSON document (docs/diagnose.md).
#pragma once
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "loratrain/diagnose/diagnosis.h"

namespace lt::diagnose {

constexpr int kJsonSchemaVersion = 1;

nlohmann::json to_json(const Diagnosis& d, const std::string& input_name);
std::string format_report(const Diagnosis& d, const std::string& input_name);

// --config/--write-fix: reads a lora-train (AI Toolkit schema) YAML config, fills the settings it
// states into `d` (they are authoritative for "already done") and re-plans the fixes.
void merge_config_settings(Diagnosis& d, const std::filesystem::path& config);

// Writes `config` with the first fix that maps to a config key applied, atomically, to `out`.
// Returns the applied fix's id, or "" when no fix maps to the config (nothing is written then).
// Throws lt::InputError / lt::ConfigError when the config cannot be read.
std::string write_fixed_config(const Diagnosis& d, const std::filesystem::path& config,
                               const std::filesystem::path& out, std::string* what = nullptr);

}  // namespace lt::diagnose
