// report.html from a run folder: what is read, what the page holds, escaping, live refresh.
#include <catch2/catch.hpp>

#include <regex>

#include "loratrain/report/run_report.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"
#include "report_fixture.h"

using lt::report::html_escape;
using lt::report::read_run_folder;
using lt::report::render_html;

namespace {

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

}  // namespace

CATCH_TEST_CASE("html_escape makes text and attribute values inert", "[report]") {
  CATCH_CHECK(html_escape("<script>alert('x')</script> & \"y\"") ==
              "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;y&quot;");
  CATCH_CHECK(html_escape("line one\n\tline two") == "line one\n\tline two");
  CATCH_CHECK(html_escape(std::string("a\0b\x1b", 4)) == "a\xEF\xBF\xBD" "b\xEF\xBF\xBD");
  CATCH_CHECK(html_escape("caf\xC3\xA9") == "caf\xC3\xA9");
}

CATCH_TEST_CASE("a run folder is read into the page's parts", "[report]") {
  const auto dir = lt::test::write_run_folder("report_read");
  auto run = read_run_folder(dir);
  CATCH_CHECK(run.name == "my-lora");
  CATCH_CHECK(run.outcome == "completed");
  CATCH_CHECK_FALSE(run.live());
  CATCH_CHECK(run.total_steps == 12);
  CATCH_REQUIRE(run.steps.size() == 10);
  CATCH_CHECK(run.steps.front().width == 64);
  CATCH_CHECK(run.steps.back().lr == Approx(1e-4));
  CATCH_REQUIRE(run.marks.size() == 3);  // two OOM attempts and a scale-up, by step
  CATCH_CHECK(run.marks[0].phase == "load");
  CATCH_CHECK(run.marks[1].step == 3);
  CATCH_CHECK(run.marks[2].kind == "scale-up");
  CATCH_REQUIRE(run.planned.size() == 1);  // the planner's change before the start, apart from the guard's
  CATCH_CHECK(run.planned[0].phase == "train_step");
  CATCH_CHECK(run.planned[0].predicted_after == 1500000000);
  CATCH_CHECK(run.peaks.size() == 4);
  CATCH_REQUIRE(run.grids.size() == 2);  // grids only, ordered by step
  CATCH_CHECK(run.grids[0].file == "samples/grid_000000000.png");
  CATCH_CHECK(run.grids[1].step == 5);
  CATCH_CHECK(run.changed_settings == std::vector<std::string>{"gradient_checkpointing", "low_vram"});
  CATCH_CHECK(run.notes.empty());

  CATCH_SECTION("a step logged twice (a crash, then a resume) keeps its last line; a cut-off line is noted") {
    std::ofstream(dir / "metrics.jsonl", std::ios::app) << "{\"step\":10,\"loss\":0.25,\"loss_avg\":0.2,\"lr\":1e-4}\n{\"step\":11,\"lo";
    run = read_run_folder(dir);
    CATCH_CHECK(run.steps.size() == 10);
    CATCH_CHECK(run.steps.back().loss == 0.25);
    CATCH_REQUIRE(run.notes.size() == 1);
    CATCH_CHECK_THAT(run.notes[0], Catch::Contains("1 unreadable line"));
  }
  CATCH_SECTION("no report.json yet: the rest is still shown, with a note") {
    std::filesystem::remove(dir / "report.json");
    run = read_run_folder(dir);
    CATCH_CHECK(run.outcome == "unknown");
    CATCH_CHECK(run.steps.size() == 10);
    CATCH_CHECK(run.steps_completed == 10);
    CATCH_CHECK_THAT(run.notes.at(0), Catch::Contains("no report.json yet"));
  }
  CATCH_SECTION("not a run folder") {
    const auto empty = lt::test::scratch_dir("report_empty");
    CATCH_CHECK_THROWS_AS(read_run_folder(empty), lt::InputError);
    CATCH_CHECK_THROWS_WITH(read_run_folder(empty / "nope"), Catch::Contains("no such run folder"));
  }
}

CATCH_TEST_CASE("the page: charts, guard markers, grids, settings, all text escaped", "[report]") {
  const auto dir = lt::test::write_run_folder("report_render");
  const std::string page = render_html(read_run_folder(dir), "2026-12-05 10:00:00");
  CATCH_CHECK(lt::starts_with(page, "<!DOCTYPE html>"));
  // Loss: raw and average as paths with one point per step (M then 9 L).
  std::smatch m;
  CATCH_REQUIRE(std::regex_search(page, m, std::regex(R"(<path class="loss" d="(M[^"]*)\")")));
  CATCH_CHECK(count(m[1].str(), "L") == 9);
  CATCH_CHECK(count(page, "<path class=\"loss-avg\"") == 1);
  CATCH_CHECK(count(page, "<path class=\"lr\"") == 1);
  // Every guard action and scale-up on the timeline, with its description as a tooltip.
  CATCH_CHECK(count(page, "<g class=\"guard-mark oom\"") == 2);
  CATCH_CHECK(count(page, "<g class=\"guard-mark scale-up\"") == 1);
  CATCH_CHECK_THAT(page, Catch::Contains("<title>step 3, train_step: OOM (early_steps) -&gt; gradient checkpointing on &lt;denoiser&gt;</title>"));
  CATCH_CHECK(count(page, "<tr class=\"guard-row") == 3);
  // The planned change: a row of its own with the predicted peaks, not a mark on the loss chart.
  CATCH_CHECK(count(page, "<tr class=\"planned-row\">") == 1);
  CATCH_CHECK_THAT(page, Catch::Contains("1.86 GiB &rarr; 1.40 GiB"));
  CATCH_CHECK_THAT(page, Catch::Contains("memory.attention_chunk: 0 -&gt; 1024 &lt;same results&gt;"));
  // Memory: one bar per phase seen.
  CATCH_CHECK(count(page, "<rect class=\"mem-peak\"") == 4);
  CATCH_CHECK_THAT(page, Catch::Contains("858.31 MiB"));  // train_step's 900000000 bytes
  // Grids by relative path, in step order.
  CATCH_CHECK(page.find("src=\"samples/grid_000000000.png\"") < page.find("src=\"samples/grid_000000005.png\""));
  CATCH_CHECK(count(page, "<img ") == 2);
  // Settings: the guard's changes highlighted; config.yaml as text.
  CATCH_CHECK(count(page, "<tr class=\"changed\">") == 2);
  CATCH_CHECK_THAT(page, Catch::Contains("# &lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;quotes&quot;"));
  CATCH_CHECK(count(page, "<script") == 0);  // the page runs nothing, the config's markup included
  CATCH_CHECK(count(page, "http") == 0);     // nothing from the network (and no refresh: the run ended)
}

CATCH_TEST_CASE("a live run's page reloads itself; an ended run's page does not", "[report]") {
  const auto live_dir = lt::test::write_run_folder("report_live", "running");
  const std::string live = render_html(read_run_folder(live_dir), "now");
  CATCH_CHECK_THAT(live, Catch::Contains("<meta http-equiv=\"refresh\" content=\"30\">"));
  CATCH_CHECK_THAT(live, Catch::Contains("the run is live"));
  for (const char* ended : {"completed", "interrupted", "oom_exhausted", "save_failed"}) {
    const auto dir = lt::test::write_run_folder(std::string("report_") + ended, ended);
    const std::string page = render_html(read_run_folder(dir), "now");
    CATCH_CHECK(page.find("http-equiv") == std::string::npos);
    CATCH_CHECK_THAT(page, Catch::Contains(std::string(ended) + " (exit 0)"));
  }
}

CATCH_TEST_CASE("write_run_report replaces report.html atomically; an empty run still renders", "[report]") {
  const auto dir = lt::test::write_run_folder("report_write");
  const auto path = lt::report::write_run_report(dir);
  CATCH_CHECK(path == dir / "report.html");
  CATCH_CHECK_THAT(lt::test::read_bytes(path), Catch::Contains("id=\"loss-chart\""));
  size_t files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  CATCH_CHECK(files == 5);  // report.json, metrics.jsonl, config.yaml, samples/, report.html: no temporary left

  const auto fresh = lt::test::scratch_dir("report_fresh") / "run";
  std::filesystem::create_directories(fresh);
  lt::test::write_bytes(fresh / "config.yaml", "job: extension\n");
  const std::string page = lt::test::read_bytes(lt::report::write_run_report(fresh));
  CATCH_CHECK_THAT(page, Catch::Contains("No step has finished yet."));
  CATCH_CHECK_THAT(page, Catch::Contains("No preview grid yet."));
}
