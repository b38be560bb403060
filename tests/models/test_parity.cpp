// Data-driven parity with the reference implementations (diffusers / transformers): every folder
// holding a meta.json under the parity root (tests/fixtures/parity, or $LT_PARITY_DIR) is a case.
// A case whose class has no runner is reported as SKIPPED and counted, never passed.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "models/parity_runners.h"
#include "test_support.h"

namespace lt::test::parity {

using lt::test::read_json;

namespace {
std::map<std::string, Runner>& registry() {
  static std::map<std::string, Runner> runners;
  return runners;
}

std::filesystem::path parity_root() {
  if (const char* env = std::getenv("LT_PARITY_DIR"); env && *env) return env;
  return fixtures_dir() / "parity";
}

std::vector<std::filesystem::path> discover(const std::filesystem::path& root) {
  std::vector<std::filesystem::path> dirs;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_regular_file() && entry.path().filename() == "meta.json") dirs.push_back(entry.path().parent_path());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}
}  // namespace

void register_runner(const std::string& class_name, Runner runner) { registry()[class_name] = std::move(runner); }

const Runner* find_runner(const std::string& class_name) {
  auto it = registry().find(class_name);
  return it == registry().end() ? nullptr : &it->second;
}

at::Tensor Case::input(const std::string& name) const {
  if (!io->contains(name)) throw std::runtime_error(this->name + ": io.safetensors has no '" + name + "'");
  return io->load(name);
}

std::shared_ptr<io::SafetensorsFile> Case::open(const std::string& file) const { return io::SafetensorsFile::open(dir / file); }

CATCH_TEST_CASE("parity: every case under the parity root matches its reference outputs", "[parity]") {
  torch::NoGradGuard no_grad;
  const auto root = parity_root();
  CATCH_INFO("parity root: " << root.string());
  CATCH_REQUIRE(std::filesystem::is_directory(root));
  const auto dirs = discover(root);
  CATCH_REQUIRE(!dirs.empty());

  int passed = 0, failed = 0, skipped = 0;
  for (const auto& dir : dirs) {
    Case c;
    c.dir = dir;
    c.name = std::filesystem::relative(dir, root).generic_string();
    c.meta = read_json(dir / "meta.json");
    if (std::filesystem::exists(dir / "config.json")) c.config = read_json(dir / "config.json");
    const std::string cls = c.meta.value("class", std::string());
    const Runner* runner = find_runner(cls);
    if (!runner) {
      ++skipped;
      CATCH_WARN("SKIPPED parity case " << c.name << ": no runner for class '" << cls << "'");
      continue;
    }
    // One case's failure is reported with its name and does not stop the others.
    CATCH_INFO("parity case " << c.name << " (" << cls << ")");
    bool ok = true;
    try {
      c.io = io::SafetensorsFile::open(dir / "io.safetensors");
      // meta.json may state a numeric relative tolerance; the documented default otherwise.
      const double rel = c.meta.contains("tolerance") && c.meta["tolerance"].is_number() ? c.meta["tolerance"].get<double>()
                                                                                          : 1e-4;
      std::vector<Pass> passes;
      try {
        passes = (*runner)(c);
      } catch (const SkipCase& e) {
        ++skipped;
        CATCH_WARN("SKIPPED parity case " << c.name << ": " << e.what());
        continue;
      }
      CATCH_CHECK(!passes.empty());
      ok = ok && !passes.empty();
      for (const auto& pass : passes) {
        int compared = 0;
        for (const auto& info : c.io->tensors()) {
          if (info.name.rfind("out.", 0) != 0) continue;
          CATCH_INFO("pass [" << pass.label << "] output " << info.name);
          auto it = pass.outputs.find(info.name);
          CATCH_CHECK(it != pass.outputs.end());
          if (it == pass.outputs.end()) {
            ok = false;
            continue;
          }
          at::Tensor expected = c.io->load(info.name, at::kDouble);
          at::Tensor got = it->second.detach().to(at::kDouble);
          CATCH_CHECK(got.sizes() == expected.sizes());
          if (got.sizes() != expected.sizes()) {
            ok = false;
            continue;
          }
          // Integer outputs (token ids, masks) must match exactly.
          const std::string dtype = io::dtype_name(info.dtype);
          const bool exact = dtype[0] == 'I' || dtype[0] == 'U' || dtype == "BOOL";
          const double scale = std::max(1.0, expected.abs().max().item<double>());
          const double tolerance = exact ? 0.0 : rel * scale;
          const double diff = (got - expected).abs().max().item<double>();
          CATCH_INFO("max|diff| = " << diff << ", tolerance " << tolerance);
          CATCH_CHECK(diff <= tolerance);
          ok = ok && diff <= tolerance;
          ++compared;
        }
        CATCH_CHECK(compared > 0);
      }
    } catch (const std::exception& e) {
      ok = false;
      CATCH_FAIL_CHECK("parity case " << c.name << " threw: " << e.what());
    }
    if (ok) ++passed;
    else ++failed;
  }
  CATCH_WARN("parity: " << passed << " passed, " << failed << " failed, " << skipped << " skipped (no runner) under " << root.string());
}

}  // namespace lt::test::parity
