// Walks tests/data/logs: every <name>.log is diagnosed and compared with <name>.expected.json
// (only the fields the expectation states). The corpus covers trainer x phase x look-alike.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "loratrain/diagnose/accuracy.h"
#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/report.h"
#include "test_paths.h"

using namespace lt::diagnose;
namespace fs = std::filesystem;

namespace {

fs::path corpus_dir() { return lt::test::source_dir() / "tests" / "data" / "logs"; }

std::vector<fs::path> corpus_logs() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(corpus_dir()))
    if (e.path().extension() == ".log") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

CATCH_TEST_CASE("corpus: every log matches its expected diagnosis", "[diagnose][corpus]") {
  auto logs = corpus_logs();
  CATCH_REQUIRE(logs.size() >= 30);
  int failures = 0;
  for (const fs::path& log : logs) {
    fs::path exp_path = log;
    exp_path.replace_extension(".expected.json");
    CATCH_INFO("log: " << log.filename().string());
    CATCH_REQUIRE(fs::exists(exp_path));
    std::ifstream in(exp_path);
    nlohmann::json expected = nlohmann::json::parse(in);
    Diagnosis d = diagnose_path(log.string());
    nlohmann::json j = to_json(d, log.filename().string());
    for (auto it = expected.begin(); it != expected.end(); ++it) {
      nlohmann::json got = actual_field(j, it.key());
      if (!field_matches(it.key(), it.value(), got)) {
        ++failures;
        CATCH_INFO(log.filename().string() << ": " << it.key());
        CATCH_CHECK(got.dump() == it.value().dump());
      }
    }
    // The text report renders for every case.
    CATCH_CHECK_FALSE(format_report(d, log.filename().string()).empty());
  }
  CATCH_CHECK(failures == 0);
}

CATCH_TEST_CASE("corpus: OOM verdicts come with fixes, look-alikes with advice", "[diagnose][corpus]") {
  for (const fs::path& log : corpus_logs()) {
    CATCH_INFO("log: " << log.filename().string());
    Diagnosis d = diagnose_path(log.string());
    if (d.recovered) {
      CATCH_CHECK(d.fixes.empty());
      CATCH_CHECK_FALSE(d.notes.empty());
    } else if (d.oom) {
      CATCH_CHECK_FALSE(d.fixes.empty());
      CATCH_CHECK_FALSE(d.evidence.empty());
      CATCH_CHECK(d.phase != Phase::kUnknown);
    } else if (d.cause != Cause::kNone && d.cause != Cause::kOther) {
      CATCH_CHECK_FALSE(d.notes.empty());
    }
  }
}

CATCH_TEST_CASE("allocator numbers are parsed from both message formats", "[diagnose][memory]") {
  Diagnosis n = diagnose_text(
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.65 GiB "
      "of which 1.06 GiB is free. Including non-PyTorch memory, this process has 22.57 GiB memory in use. Of the "
      "allocated memory 17.30 GiB is allocated by PyTorch, and 4.50 GiB is reserved by PyTorch but unallocated.\n");
  const int64_t gib = int64_t(1) << 30;
  CATCH_CHECK(n.oom);
  CATCH_CHECK(*n.memory.tried_to_allocate == 2 * gib);
  CATCH_CHECK(*n.memory.total == static_cast<int64_t>(23.65 * gib + 0.5));
  CATCH_CHECK(*n.memory.allocated_by_pytorch == static_cast<int64_t>(17.30 * gib + 0.5));
  CATCH_CHECK(*n.memory.reserved_unallocated == static_cast<int64_t>(4.50 * gib));
  CATCH_CHECK(n.memory.fragmentation);
  CATCH_REQUIRE_FALSE(n.fixes.empty());
  CATCH_CHECK(n.fixes[0].id == "allocator_config");
  CATCH_CHECK(n.fixes[0].setting.find("expandable_segments:True") != std::string::npos);

  Diagnosis o = diagnose_text(
      "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 8.00 GiB total capacity; 7.25 GiB already "
      "allocated; 0 bytes free; 7.31 GiB reserved in total by PyTorch)\n");
  CATCH_CHECK(*o.memory.tried_to_allocate == 20 * (int64_t(1) << 20));
  CATCH_CHECK(*o.memory.total == 8 * gib);
  CATCH_CHECK(*o.memory.free == 0);
  CATCH_CHECK(*o.memory.reserved_unallocated == static_cast<int64_t>(7.31 * gib + 0.5) - static_cast<int64_t>(7.25 * gib));
  CATCH_CHECK_FALSE(o.memory.fragmentation);
}

CATCH_TEST_CASE("fixes skip what the log shows is already done", "[diagnose][fixes]") {
  std::string base =
      "running training\n"
      "steps:   0%|          | 3/1000 [00:01<?, 1.0s/it, avr_loss=0.1]\n"
      "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n";
  Diagnosis off = diagnose_text("--train_batch_size 2 --gradient_checkpointing false\n" + base);
  CATCH_REQUIRE_FALSE(off.fixes.empty());
  CATCH_CHECK(off.fixes[0].id == "gradient_checkpointing");
  Diagnosis on = diagnose_text("gradient_checkpointing: true\nbatch_size: 1\n" + base);
  for (const Fix& f : on.fixes) {
    CATCH_CHECK(f.id != "gradient_checkpointing");
    CATCH_CHECK(f.id != "batch_size_1");
  }
}

CATCH_TEST_CASE("fixes speak the detected trainer's vocabulary", "[diagnose][fixes]") {
  std::string oom = "steps:   0%|          | 2/1000 [00:01<?, 1.0s/it, loss=0.1]\n"
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB.\n";
  Diagnosis k = diagnose_text("accelerate launch sdxl_train_network.py --network_module=networks.lora\n" + oom);
  CATCH_CHECK(k.trainer == Trainer::kKohya);
  CATCH_REQUIRE_FALSE(k.fixes.empty());
  CATCH_CHECK(k.fixes[0].setting == "--gradient_checkpointing");
  Diagnosis u = diagnose_text(oom);
  CATCH_CHECK(u.trainer == Trainer::kUnknown);
  CATCH_CHECK(u.fixes[0].setting == "train.gradient_checkpointing: true");
  CATCH_CHECK(u.fixes[0].config_key == "train.gradient_checkpointing");
}
