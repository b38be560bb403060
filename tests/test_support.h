// Helpers that many test files share: whole-file reads and writes, JSON files, the message of
// an expected error, byte sizes. Keep <torch/torch.h> out (tensor_support.h has the tensor ones).
#pragma once
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "loratrain/util/error.h"
#include "test_paths.h"

namespace lt::test {

constexpr int64_t MiB = int64_t{1} << 20;
constexpr int64_t GiB = int64_t{1} << 30;

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Creates the parent folders first.
inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

inline nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  return nlohmann::json::parse(in);
}

// The message of the `E` that `f` throws; "(no error)" when it throws none (any other exception
// propagates and fails the test).
template <class E>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(no error)";
}
inline std::string config_error_of(const std::function<void()>& f) { return error_of<lt::ConfigError>(f); }
inline std::string input_error_of(const std::function<void()>& f) { return error_of<lt::InputError>(f); }

}  // namespace lt::test
