// The live progress line and the JSONL metrics file.
#pragma once
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace lt::train {

struct StepStats {
  int64_t step = 0;        // 1-based step just finished
  int64_t total_steps = 0;
  double loss = 0;
  double lr = 0;
  double seconds = 0;      // wall time of this step
  int64_t mem_allocated = 0;
  int64_t mem_peak = 0;
  int64_t batch_size = 0;
  int64_t width = 0, height = 0;  // the bucket (pixels) of the step's first batch
};

// One fixed-field line per step: `step 12/60 | loss 0.1234 (avg 0.1301) | lr 1.0e-04 | 1.52 s/it |
// ETA 1m13s | mem 312 MiB / 401 MiB`. On a terminal it redraws in place; otherwise it prints a
// plain line every `plain_every` steps (and the first and last).
class ProgressLine {
 public:
  explicit ProgressLine(int plain_every = 10);
  void update(const StepStats& s);
  void finish();  // ends the in-place line
  double smoothed_loss() const { return smoothed_; }

 private:
  bool tty_;
  int plain_every_;
  double smoothed_ = 0;
  double smoothed_seconds_ = 0;
  int64_t seen_ = 0;
  bool drawn_ = false;
};

// Appends one JSON object per step to metrics.jsonl (for plots).
class MetricsFile {
 public:
  explicit MetricsFile(const std::filesystem::path& path, bool append);
  void write(const StepStats& s, double smoothed_loss);

 private:
  std::ofstream out_;
};

std::string format_duration(double seconds);

}  // namespace lt::train
