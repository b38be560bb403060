// Parsers for the line formats that carry numbers: tqdm bars and step lines (training progress),
// PyTorch's allocator message, traceback frames, rank prefixes, and lora-train's own lines.
// Each is called by the analyzer for the lines its keywords found.
#pragma once
#include <string_view>

#include "analyzer_state.h"

namespace lt::diagnose::detail {

// tqdm: "desc:  12%|#2        | 12/100 [00:10<01:00,  1.50it/s, loss=0.1]".
void parse_progress_bar(AnalyzerState& st, std::string_view low, std::string_view text, int64_t line);

// "steps: 10 loss: 0.1 iter time (s): ..." (DeepSpeed in diffusion-pipe), "step 12/2000 | loss ..."
// (lora-train), "Step 3: loss=..." and similar step lines that carry a loss or a rate.
void parse_step_line(AnalyzerState& st, std::string_view low, size_t pos, size_t end, std::string_view text,
                     int64_t line);

// sd-scripts / musubi train(): "epoch 1/16" (and SimpleTuner's "Epoch 1/10"): the loop began.
void parse_epoch_line(AnalyzerState& st, std::string_view low, size_t pos, size_t end, std::string_view text,
                      int64_t line);

// sd-scripts library/train_util.py, musubi training/trainer_base.py sample_images():
// "generating sample images at step / サンプル画像生成 ステップ: N" (N = 0: the baseline).
void parse_sample_at_step(AnalyzerState& st, std::string_view low, size_t end, std::string_view text, int64_t line);

// PyTorch's allocator message, both formats, ComfyUI's memory-fraction and the MPS message.
void parse_allocator_message(MemoryLog& mem, int64_t seq, std::string_view low);

// `File "<path>", line N, in <func>`: one more frame of the traceback being read.
void parse_frame_line(AnalyzerState& st, std::string_view low, std::string_view text, size_t path_start);

// The `rich` library's boxed traceback (sd-scripts and others install it): "│ <path>:<line> in
// <func>   │" is a frame, "│ ❱ 1145 │     return self._apply(convert)   │" the failing line of
// the last frame. True when the line was one of the box's lines.
bool parse_rich_traceback_line(AnalyzerState& st, std::string_view trimmed_low, std::string_view trimmed);

// "[rank3]: ..." / "rank: 3 (local_rank: 3)": the rank a line came from, or -1.
int rank_of_line(std::string_view low);

// lora-train: summarize() of its memory settings (src/playbook/settings.cpp), as printed at the start of
// training ("memory settings: ..."), in the guard's summary ("settings now: ...") and give-ups.
void apply_settings_summary(Settings& s, std::string_view low);

// lora-train: "oom-guard: ..." lines (src/memory/guard.cpp).
void parse_guard_line(AnalyzerState& st, std::string_view low, std::string_view text, int64_t line);

// lora-train: the end of a finished run (src/train/trainer.cpp run()): "done: <lora> (N steps)" and
// "the settings that worked: <path>". True when the line was one of them.
bool parse_run_end_line(AnalyzerState& st, std::string_view low, std::string_view text, int64_t line);

}  // namespace lt::diagnose::detail
