// The bounded state one pass over a log leaves behind: the latest activity lines, each cause's
// events, traceback frames, memory numbers, settings, identification scores, lora-train's guard
// lines and environment clues. No log line is kept beyond a few capped snippets.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "identify.h"
#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/diagnosis.h"
#include "phase_rules.h"

namespace lt::diagnose::detail {

constexpr size_t kMarkerTextCap = 400;

// One remembered line: when (sequence number of the logical line), where (physical line), what.
struct Marker {
  int64_t seq = -1;
  int64_t line = 0;
  std::string text;  // raw, capped; made valid UTF-8 only when reported
  bool seen() const { return seq >= 0; }
  void set(int64_t s, int64_t l, std::string_view t) {
    seq = s;
    line = l;
    text.assign(t.data(), std::min(t.size(), kMarkerTextCap));
  }
};

constexpr int kStageCount = static_cast<int>(Stage::kSaving) + 1;

// Where the run was: the latest line of each activity (indexed by Stage; kTrainingStep is "the
// training loop began") and the training progress.
struct Activity {
  std::array<Marker, kStageCount> markers;
  Marker progress;             // latest training progress (bar or step line)
  int64_t completed = -1;      // steps completed per that progress (-1: none seen)
  int64_t total = -1;
  bool training_seen = false;  // a training bar/step line or "running training" was seen
  int64_t sample_at_step = -1; // "generating sample images at step N" (sd-scripts / musubi)
  Marker& marker(Stage s) { return markers[static_cast<int>(s)]; }
  const Marker& marker(Stage s) const { return markers[static_cast<int>(s)]; }
};

constexpr int kCauseCount = static_cast<int>(Cause::kOther) + 1;

struct CauseRecord {
  int count = 0;
  int fatal_count = 0;
  Marker first;       // first event after the latest training progress
  Marker last;
  Marker last_fatal;
  Activity at_first;  // activity when `first` happened
  std::vector<Frame> frames;  // the traceback that ended on this cause's exception line
  bool has_frames() const { return !frames.empty(); }
};

// lora-train's own log (src/memory/guard.cpp, src/train/trainer.cpp).
struct GuardLog {
  bool seen = false;          // an OOM / host-RAM line of the guard
  bool oom = false;           // "OOM in phase ..." (not only a warning)
  bool host = false;          // "host RAM exhausted"
  bool environment = false;   // "only X of Y is free at start" or an environment class
  bool gave_up = false;       // the action was "give up: ..."
  std::string phase;          // load, cache, baseline_sample, train_step, sample, save
  std::string classification; // the guard's playbook class after the em dash
  std::optional<int64_t> step;
  std::optional<int> batch, frames, bucket;
  int events = 0;             // OOM lines seen
  std::vector<std::string> actions;  // what the guard changed, in order (bounded)
  bool chunked_attention = false;    // an action set memory.attention_chunk
  bool tiled_vae = false;            // an action set memory.vae_tiling
  // The summary's "price of #N (<levers>): <time and peak change>" lines (guard.cpp summary()), bounded.
  std::vector<std::string> prices;
  Marker line;                // the latest OOM line
  // The end of a run (trainer.cpp run()): the summary and "done:".
  bool finished = false;      // "done: <lora> (N steps)"
  std::optional<int64_t> finished_steps;
  std::string settings_now;   // "oom-guard: settings now: ..." (summarize() of the final settings)
  std::string effective_config;  // "the settings that worked: <path>"
  Marker done_line;
};

// Memory numbers of the latest allocator message.
struct MemoryLog {
  MemoryNumbers numbers;
  int64_t seq = -1;
  std::vector<int64_t> process_uses;  // "Process N has X memory in use" (bounded)
};

// Signs that the machine, not the config, is the problem.
struct EnvironmentClues {
  bool pinned_memory = false;         // the OOM came from pinned host memory (pin_memory, cudaHostAlloc)
  bool wsl = false;                   // the log shows Windows Subsystem for Linux
  uint64_t ranks_seen = 0;            // bit per rank that wrote a line ("[rankN]:", "rank: N")
  uint64_t oom_ranks = 0;             // bit per rank that reported a GPU OOM
  int launcher_children = 0;          // DeepSpeed's launcher "Killing subprocess N" lines
  int highest_rank = -1;
};

// sd-scripts' attention: train_util.py replace_unet_modules() logs which memory-efficient attention
// the U-Net uses; without --mem_eff_attn / --xformers / --sdpa it logs nothing and uses plain attention.
struct KohyaAttention {
  bool command_line = false;     // a training command line with every argument on it (no --config_file)
  bool flag_on_command = false;  // ... and it had --xformers / --sdpa / --mem_eff_attn
};

struct AnalyzerState {
  int64_t seq = 0;
  int64_t lines = 0;
  Activity act;
  std::array<CauseRecord, kCauseCount> causes;
  bool oom_recovered_only = true;     // every GPU OOM so far was one AI Toolkit skipped
  int64_t last_oom_recovered_seq = -1;
  int oom_hard_count = 0;
  int oom_weak_count = 0;
  // The traceback being read.
  bool in_traceback = false;
  bool expect_code_line = false;      // the line after a frame is its source line
  int64_t traceback_seq = -1;         // where the traceback being read began
  std::vector<Frame> frames;
  MemoryLog mem;
  Settings settings;
  IdentityScores identity;
  std::vector<bool> counted;          // identification keywords count once
  GuardLog guard;
  EnvironmentClues env;
  KohyaAttention kohya_attention;
  std::string low;                    // lowercase copy of the current line (reused)
};

}  // namespace lt::diagnose::detail

namespace lt::diagnose {
struct LogAnalyzer::State : detail::AnalyzerState {};
}  // namespace lt::diagnose
