// A run folder as the trainer leaves it, written by hand: report.json with OOM-guard actions and a
// scale-up, metrics.jsonl, config.yaml, two preview grids.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>

#include "test_paths.h"

namespace lt::test {

// A valid 16x16 RGB PNG (one colour), as a preview grid stand-in.
inline const std::string& tiny_png() {
  static const std::string bytes(
      "\x89\x50\x4e\x47\x0d\x0a\x1a\x0a\x00\x00\x00\x0d\x49\x48\x44\x52\x00\x00\x00\x10\x00\x00\x00\x10\x08\x02\x00\x00"
      "\x00\x90\x91\x68\x36\x00\x00\x00\x16\x49\x44\x41\x54\x78\xda\x63\x38\x61\xa3\x41\x12\x62\x18\xd5\x30\xaa\x61\xf8"
      "\x6a\x00\x00\x1e\x04\x2c\x10\x31\xdf\x9a\xa9\x00\x00\x00\x00\x49\x45\x4e\x44\xae\x42\x60\x82",
      79);
  return bytes;
}

inline void write_bytes(const std::filesystem::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// `outcome`: "completed", "running", ... The config holds markup that must come out as text.
inline std::filesystem::path write_run_folder(const std::string& name, const std::string& outcome = "completed") {
  const auto dir = scratch_dir(name) / "my-lora";
  std::filesystem::create_directories(dir / "samples");
  write_bytes(dir / "report.json", R"json({
  "outcome": ")json" + outcome + R"json(", "exit_code": 0, "steps_completed": 10, "total_steps": 12, "device": "cpu (simulated VRAM 1.50 GiB)",
  "attempts": [
    {"attempt": 1, "phase": "load", "step": 0, "classification": "load", "action": "enable_low_vram",
     "description": "low_vram on: encoders leave the device", "error": "CPU out of memory (simulated VRAM)"},
    {"attempt": 2, "phase": "train_step", "step": 3, "classification": "early_steps", "action": "enable_checkpointing",
     "description": "gradient checkpointing on <denoiser>", "error": "tried to allocate 64.00 MiB"}
  ],
  "planned_changes": [{"action": "chunk_attention", "description": "memory.attention_chunk: 0 -> 1024 <same results>",
                       "phase": "train_step", "predicted_peak_before": 2000000000, "predicted_peak_after": 1500000000}],
  "scale_ups": [{"step": 8, "lever": "larger_bucket", "description": "bucket 64 re-enabled", "reverted": false}],
  "peaks": {"load": {"peak_allocated": 300000000, "peak_reserved": 320000000, "entered": 2},
            "cache": {"peak_allocated": 350000000, "peak_reserved": 360000000, "entered": 1},
            "train_step": {"peak_allocated": 900000000, "peak_reserved": 1000000000, "entered": 11},
            "save": {"peak_allocated": 310000000, "peak_reserved": 320000000, "entered": 1}},
  "initial_settings": {"batch_size": 2, "gradient_checkpointing": false, "low_vram": false},
  "final_settings": {"batch_size": 2, "gradient_checkpointing": true, "low_vram": true},
  "lora": "/runs/my-lora/my-lora.safetensors"
})json");
  std::string metrics;
  for (int step = 1; step <= 10; ++step) {
    const double loss = 0.5 / step + 0.05 * (step % 3);
    metrics += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) + ",\"loss_avg\":" +
               std::to_string(0.5 / step) + ",\"lr\":" + std::to_string(1e-4 * step / 10) +
               ",\"seconds\":0.5,\"mem_allocated\":1000,\"mem_peak\":2000,\"batch_size\":2,\"width\":64,\"height\":48}\n";
  }
  write_bytes(dir / "metrics.jsonl", metrics);
  write_bytes(dir / "config.yaml", "job: extension\nconfig:\n  name: my-lora\n  # <script>alert('x')</script> & \"quotes\"\n");
  write_bytes(dir / "samples" / "grid_000000000.png", tiny_png());
  write_bytes(dir / "samples" / "grid_000000005.png", tiny_png());
  write_bytes(dir / "samples" / "1700000000000__000000005_0.png", tiny_png());  // a single preview, not a grid
  return dir;
}

}  // namespace lt::test
