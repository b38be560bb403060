// Reading diffusers/transformers config.json fields with one clear error for a wrong type.
#pragma once
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>

#include "loratrain/util/error.h"

namespace lt::models {

// The JSON document in `path` (a config.json, a tokenizer's files). One that cannot be opened or is
// not valid JSON throws lt::InputError naming the file and what it was read as (`what`).
nlohmann::json read_json_file(const std::filesystem::path& path, const std::string& what);

// j[key] as T; `fallback` when absent or null. A value of the wrong type throws lt::InputError
// "<what> config: '<key>' has the wrong type (<value>)".
template <typename T>
T json_get_or(const nlohmann::json& j, const char* key, T fallback, const char* what) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InputError(std::string(what) + " config: '" + key + "' has the wrong type (" + it->dump() + ")");
  }
}

}  // namespace lt::models
