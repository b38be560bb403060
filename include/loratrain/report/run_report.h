// report.html: one self-contained page about a training run, for a person to look at. It is built
// from what the run folder already holds, so `lora-train report RUN_DIR` and the trainer write
// the same page:
//   report.json    outcome, steps, the OOM guard's actions and scale-ups, peak memory per phase,
//                  the memory settings in effect
//   metrics.jsonl  per step: loss, its moving average, learning rate, memory, bucket
//   samples/       grid_<step>.png, one preview grid per sampling step (referenced, not embedded)
//   config.yaml    the effective config the run started from
// The page has inline CSS and inline SVG charts only: no script, no network. While the run is
// live (report.json says "running") a <meta refresh> reloads it; once the run ended it stays still.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace lt::report {

struct StepPoint {
  int64_t step = 0;
  double loss = 0;
  double loss_avg = 0;  // the progress line's moving average
  double lr = 0;
  int64_t mem_peak = 0;
  int64_t width = 0, height = 0;  // the step's bucket
};

// One OOM-guard action (an attempt) or scale-up, placed on the step axis.
struct GuardMark {
  int64_t step = 0;          // the step it happened in (0: before training, e.g. at load)
  std::string phase;         // load, cache, baseline_sample, train_step, sample, save
  std::string kind;          // "oom" or "scale-up"
  std::string classification;
  std::string action;        // the ladder's action name
  std::string description;   // what changed, in words
  std::string error;         // the error's first line (OOM only)
};

// A change the planner made before the start (report.json "planned_changes"): a phase was
// predicted not to fit, so the run started from the ladder's first fitting rung. Not an OOM.
struct PlannedMark {
  std::string phase;        // the phase predicted over the budget
  std::string action;       // the ladder's action name
  std::string description;  // what changed, in the config's keys
  int64_t predicted_before = 0;
  int64_t predicted_after = 0;
};

struct PhasePeak {
  std::string phase;
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  int64_t entered = 0;
};

struct SampleGrid {
  int64_t step = 0;
  std::string file;  // relative to the run folder: samples/grid_000000100.png
};

// Everything the page shows, read from a run folder.
struct RunSummary {
  std::string name;              // the run folder's name
  std::string outcome;           // running, completed, interrupted, oom_exhausted, environment, save_failed
  int exit_code = 0;             // meaningful once the run ended
  int64_t steps_completed = 0;
  int64_t total_steps = 0;
  std::string device;
  std::string lora;              // the final LoRA file, when written
  std::vector<StepPoint> steps;  // by step; a step logged twice (a resumed crash) keeps its last line
  std::vector<GuardMark> marks;
  std::vector<PlannedMark> planned;  // before the first step, in the order they were made
  std::vector<PhasePeak> peaks;
  std::vector<std::pair<std::string, std::string>> settings;  // memory settings now, key -> value
  std::vector<std::string> changed_settings;                  // keys that differ from the config's
  std::vector<SampleGrid> grids;
  std::string config_yaml;
  std::vector<std::string> notes;  // what could not be read (shown on the page)
  bool live() const { return outcome == "running"; }
};

// Reads a run folder. Missing or broken parts become notes; lt::InputError when `run_dir` is not
// a run folder at all (no config.yaml, metrics.jsonl or report.json).
RunSummary read_run_folder(const std::filesystem::path& run_dir);

// The page. `written_at` is shown as when the page was made (e.g. "2026-12-05 14:03:10").
std::string render_html(const RunSummary& run, const std::string& written_at);

// Reads `run_dir`, renders and atomically replaces run_dir/report.html; returns its path.
std::filesystem::path write_run_report(const std::filesystem::path& run_dir);

// Text made safe inside HTML elements and attribute values: & < > " ' as entities, control
// characters other than newline and tab as U+FFFD.
std::string html_escape(const std::string& text);

}  // namespace lt::report
