// The run as a process: stop signals (Ctrl-C, SIGTERM) save a resumable state and exit 130 / 143,
// a full disk (a file-size limit) leaves every file saved before intact with one clear message,
// and the run folder's report.html follows the run.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <regex>

#include "cli_process.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/train/trainer.h"
#include "train_fixture.h"
#include "tensor_support.h"
#include "test_support.h"

using lt::test::read_tensors;
using lt::test::same_tensors;

namespace {

namespace fs = std::filesystem;

// Files a failed atomic write could have left behind.
std::vector<std::string> temporary_files(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().find(".tmp-") != std::string::npos) found.push_back(e.path().string());
  }
  return found;
}

// The child trains with this process's thread setup, so its steps match in-process runs bit for
// bit: the same intra-op thread count, and OpenBLAS at one thread in both (the binary sets it).
// Call it before the in-process runs that the child's are compared with.
lt::test::ChildOptions child_options() {
  lt::train::configure_cpu_threads();
  lt::test::ChildOptions options;
  options.num_threads = at::get_num_threads();
  return options;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++n;
  return n;
}

}  // namespace

CATCH_TEST_CASE("SIGTERM mid-run (and again during the save): exit 143, and the resumed run ends bit-identical",
                "[train][e2e][resume][signal]") {
  auto root = lt::test::scratch_dir("run_sigterm");
  constexpr int kSteps = 16;
  const auto child = child_options();
  lt::train::RunRequest straight;
  straight.config_path = lt::test::write_tiny_config(root / "a", "term", kSteps);
  auto whole = lt::train::run_training(straight);
  CATCH_REQUIRE(whole.exit_code == 0);

  const auto config = lt::test::write_tiny_config(root / "b", "term", kSteps);
  const fs::path run = root / "b" / "term";
  const pid_t pid = lt::test::start_lora_train({"run", config.string()}, root / "b" / "output.txt", child);
  // Two steps done: the run is in the middle of training.
  CATCH_REQUIRE(lt::test::wait_until(pid, [&] { return lt::test::line_count(run / "metrics.jsonl") >= 2; }));
  CATCH_REQUIRE(::kill(pid, SIGTERM) == 0);
  // A second signal as soon as the save begins: noted, the save completes.
  lt::test::wait_until(pid, [&] { return lt::test::read_file(run / "log.txt").find("saving the resumable state") != std::string::npos; });
  ::kill(pid, SIGTERM);
  const auto ended = lt::test::wait_child(pid);
  const std::string output = lt::test::read_file(root / "b" / "output.txt");
  CATCH_INFO(output);
  // The second signal lands during the save (noted: exit 143) or, rarely, after the run returned
  // and the default handler was back (killed by it); the state was saved whole either way.
  CATCH_CHECK(((ended.exited && ended.code == 143) || (!ended.exited && ended.code == SIGTERM)));
  CATCH_CHECK_THAT(output, Catch::Contains("SIGTERM at step"));
  CATCH_CHECK_THAT(output, Catch::Contains("state saved in"));
  std::smatch at;
  CATCH_REQUIRE(std::regex_search(output, at, std::regex("interrupted at step ([0-9]+)")));
  const int stopped_at = std::stoi(at[1].str());
  CATCH_CHECK(stopped_at >= 2);
  CATCH_CHECK(stopped_at < kSteps);
  CATCH_CHECK(temporary_files(run).empty());
  const std::string report = lt::test::read_file(run / "report.json");
  CATCH_CHECK_THAT(report, Catch::Contains("\"outcome\": \"interrupted\""));
  CATCH_CHECK_THAT(report, Catch::Contains("\"exit_code\": 143"));

  lt::train::RunRequest resume;
  resume.config_path = config;
  auto resumed = lt::train::run_training(resume);
  CATCH_REQUIRE(resumed.exit_code == 0);
  CATCH_CHECK(resumed.steps_completed == kSteps);
  CATCH_REQUIRE(resumed.losses.size() == static_cast<size_t>(kSteps - stopped_at));
  for (size_t i = 0; i < resumed.losses.size(); ++i) CATCH_CHECK(resumed.losses[i] == whole.losses[stopped_at + i]);
  CATCH_CHECK(same_tensors(read_tensors(root / "a" / "term" / "term.safetensors"), read_tensors(run / "term.safetensors")));
}

CATCH_TEST_CASE("Ctrl-C (SIGINT) mid-run: exit 130 with the state saved", "[train][e2e][resume][signal]") {
  auto root = lt::test::scratch_dir("run_sigint");
  const auto config = lt::test::write_tiny_config(root, "int", 16);
  const fs::path run = root / "int";
  const pid_t pid = lt::test::start_lora_train({"run", config.string()}, root / "output.txt", child_options());
  CATCH_REQUIRE(lt::test::wait_until(pid, [&] { return lt::test::line_count(run / "metrics.jsonl") >= 1; }));
  // While it trains, the page says so and reloads itself.
  const std::string live = lt::test::read_file(run / "report.html");
  CATCH_REQUIRE(::kill(pid, SIGINT) == 0);
  CATCH_CHECK_THAT(live, Catch::Contains("<meta http-equiv=\"refresh\" content=\"30\">"));
  CATCH_CHECK_THAT(live, Catch::Contains("the run is live"));
  const auto ended = lt::test::wait_child(pid);
  CATCH_INFO(lt::test::read_file(root / "output.txt"));
  CATCH_CHECK(ended.exited);
  CATCH_CHECK(ended.code == 130);
  CATCH_CHECK_THAT(lt::test::read_file(root / "output.txt"), Catch::Contains("Ctrl-C (SIGINT) at step"));
  CATCH_CHECK(fs::exists(run / "state" / "training_state.safetensors"));
}

CATCH_TEST_CASE("a full disk while saving: the previous LoRA and state stay as they were, one clear message, exit 1",
                "[train][e2e][io]") {
  auto root = lt::test::scratch_dir("run_disk_full");
  const auto config = lt::test::write_tiny_config(root, "full", 2);
  const fs::path run = root / "full";
  lt::train::RunRequest first;
  first.config_path = config;
  CATCH_REQUIRE(lt::train::run_training(first).exit_code == 0);
  const fs::path lora = run / "full.safetensors";
  const fs::path state = run / "state" / "training_state.safetensors";
  const std::string lora_before = lt::test::read_file(lora);
  const std::string state_before = lt::test::read_file(state);

  // Resume to step 4 with files limited to half the LoRA's size: the final save's first write
  // fails with EFBIG, as it would with ENOSPC on a full disk. Everything else the run appends
  // (log, metrics, report) stays well under the limit.
  const rlim_t limit = lora_before.size() / 2;
  CATCH_REQUIRE(fs::file_size(run / "log.txt") + 16384 < limit);
  CATCH_REQUIRE(state_before.size() > limit);
  auto limited = child_options();
  limited.file_size_limit = limit;
  const pid_t pid = lt::test::start_lora_train({"run", config.string(), "--set", "train.steps=4"}, root / "output.txt", limited);
  const auto ended = lt::test::wait_child(pid);
  const std::string output = lt::test::read_file(root / "output.txt");
  CATCH_INFO(output);
  CATCH_CHECK(ended.exited);
  CATCH_CHECK(ended.code == 1);
  CATCH_CHECK(count("\n" + output, "\nE ") == 1);  // one error message (console lines: "E hh:mm:ss ...")
  CATCH_CHECK_THAT(output, Catch::Contains("saving step 4 failed: cannot save " + lora.string() +
                                           ": write failed: File too large; the previous full.safetensors is unchanged"));
  CATCH_CHECK_THAT(output, Catch::Contains("the training state of step 2 and the LoRA files saved before are intact"));
  CATCH_CHECK(lt::test::read_file(lora) == lora_before);
  CATCH_CHECK(lt::test::read_file(state) == state_before);
  CATCH_CHECK(temporary_files(run).empty());
  CATCH_CHECK_THAT(lt::test::read_file(run / "report.json"), Catch::Contains("\"outcome\": \"save_failed\""));

  // With room again, the same command resumes from the intact state and finishes.
  lt::train::RunRequest again;
  again.config_path = config;
  again.overrides = {"train.steps=4"};
  auto finished = lt::train::run_training(again);
  CATCH_CHECK(finished.exit_code == 0);
  CATCH_CHECK(finished.losses.size() == 2);
}

CATCH_TEST_CASE("report.html is rewritten when the run stops and when it ends, with every part filled in",
                "[train][e2e][report]") {
  auto root = lt::test::scratch_dir("run_report");
  const auto config = lt::test::write_tiny_config(root, "rep", 4, "", "        simulate_vram: 0\n",
                                                  "      sample:\n        sample_every: 2\n        width: 64\n        height: 64\n"
                                                  "        sample_steps: 2\n        sampler: ddim\n        prompts: [\"a red circle\"]\n");
  lt::train::RunRequest request;
  request.config_path = config;
  request.overrides = {"train.disable_sampling=false", "save.save_every=2"};
  request.stop_after_steps = 3;
  auto interrupted = lt::train::run_training(request);
  CATCH_REQUIRE(interrupted.exit_code == 130);
  const fs::path run = root / "rep";
  std::string page = lt::test::read_file(run / "report.html");
  CATCH_CHECK(page.find("http-equiv=\"refresh\"") == std::string::npos);
  CATCH_CHECK_THAT(page, Catch::Contains("interrupted (exit 130)"));
  CATCH_CHECK_THAT(page, Catch::Contains("step 3 of 4"));

  request.stop_after_steps.reset();
  CATCH_REQUIRE(lt::train::run_training(request).exit_code == 0);
  page = lt::test::read_file(run / "report.html");
  CATCH_CHECK_THAT(page, Catch::Contains("completed (exit 0)"));
  CATCH_CHECK(page.find("http-equiv") == std::string::npos);
  CATCH_CHECK(count(page, "<path class=\"loss\"") == 1);
  CATCH_CHECK(count(page, "<path class=\"lr\"") == 1);
  CATCH_CHECK(count(page, "<rect class=\"mem-peak\"") >= 3);  // load, cache, train_step, sample, save
  CATCH_CHECK_THAT(page, Catch::Contains("src=\"samples/grid_000000000.png\""));
  CATCH_CHECK_THAT(page, Catch::Contains("src=\"samples/grid_000000004.png\""));
  CATCH_CHECK_THAT(page, Catch::Contains("name: rep"));  // config.yaml
}
