// Accuracy on the development set of real users' logs (tests/data/logs/real: failed runs from the
// trainers' issue trackers, labelled by hand). The thresholds are the project's goals; misses are
// printed so a regression says which logs it broke. tests/data/logs/heldout is never read here.
#include <catch2/catch.hpp>

#include <sstream>

#include "loratrain/diagnose/accuracy.h"
#include "test_paths.h"

using namespace lt::diagnose;

CATCH_TEST_CASE("real logs: OOM verdict, phase and first fix reach the goals", "[diagnose][accuracy]") {
  const auto dir = lt::test::source_dir() / "tests" / "data" / "logs" / "real";
  const AccuracyReport r = score_folder(dir);
  std::ostringstream misses;
  for (const CaseScore& c : r.scored)
    for (const FieldMiss& m : c.misses)
      misses << c.name << ": " << m.field << " expected " << m.expected.dump() << ", got " << m.got.dump() << "\n";
  CATCH_INFO("misses:\n" << misses.str());
  CATCH_REQUIRE(r.cases >= 15);
  CATCH_CHECK(r.oom.ratio() >= 0.97);
  CATCH_CHECK(r.phase.ratio() >= 0.85);
  CATCH_CHECK(r.first_fix.ratio() >= 0.85);
}

CATCH_TEST_CASE("accuracy scoring counts what the labels state", "[diagnose][accuracy]") {
  CATCH_CHECK(field_matches("first_fix", nlohmann::json::array({"low_vram", "skip_baseline_sample"}), "low_vram"));
  CATCH_CHECK_FALSE(field_matches("first_fix", nlohmann::json::array({"low_vram"}), "free_gpu"));
  CATCH_CHECK_FALSE(field_matches("step", 3, 4));
  // The top-level corpus is labelled by construction: everything matches there.
  const AccuracyReport top = score_folder(lt::test::source_dir() / "tests" / "data" / "logs");
  CATCH_CHECK(top.cases >= 40);
  CATCH_CHECK(top.fields.correct == top.fields.total);
  CATCH_CHECK_THROWS(score_folder(lt::test::source_dir() / "tests" / "data" / "logs" / "no-such-folder"));
}
