// Paths the tests read from; set by tests/CMakeLists.txt.
#pragma once
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>

namespace lt::test {

inline std::filesystem::path source_dir() { return LT_SOURCE_DIR; }
inline std::filesystem::path fixtures_dir() { return LT_FIXTURES_DIR; }
inline std::filesystem::path binary_dir() { return LT_BINARY_DIR; }

// One case of the diffusers/transformers reference outputs (tests/fixtures/parity/<name>).
inline std::filesystem::path parity_case(const std::string& name) { return fixtures_dir() / "parity" / name; }

// ../shared beside the checkout (holds the real CLIP vocabulary); absent on some machines.
inline std::optional<std::filesystem::path> shared_dir() {
  auto p = source_dir().parent_path() / "shared";
  if (std::filesystem::exists(p)) return p;
  return std::nullopt;
}

// A fresh empty folder under the build tree for one test's output.
inline std::filesystem::path scratch_dir(const std::string& name) {
  auto p = binary_dir() / "test-scratch" / name;
  std::filesystem::remove_all(p);
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace lt::test
