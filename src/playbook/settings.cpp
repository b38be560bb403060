#include "loratrain/playbook/settings.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "loratrain/config/config.h"
#include "loratrain/util/strings.h"

namespace lt::playbook {

const char* to_string(Quantize q) {
  switch (q) {
    case Quantize::none: return "none";
    case Quantize::fp8: return "fp8";
    case Quantize::int8: return "int8";
  }
  return "none";
}

namespace {

Quantize quantize_from_string(const std::string& name) {
  for (Quantize q : {Quantize::none, Quantize::fp8, Quantize::int8}) {
    if (name == to_string(q)) return q;
  }
  return Quantize::none;
}

}  // namespace

std::vector<int> MemorySettings::active_resolutions() const {
  const int keep = std::max<int>(0, static_cast<int>(resolutions.size()) - dropped_largest);
  return std::vector<int>(resolutions.begin(), resolutions.begin() + keep);
}

int MemorySettings::largest_resolution() const {
  auto active = active_resolutions();
  return active.empty() ? 0 : active.back();
}

bool MemorySettings::operator==(const MemorySettings& o) const {
  return gradient_checkpointing == o.gradient_checkpointing && batch_size == o.batch_size &&
         grad_accumulation == o.grad_accumulation && resolutions == o.resolutions &&
         dropped_largest == o.dropped_largest && sample_width == o.sample_width && sample_height == o.sample_height &&
         sample_steps == o.sample_steps && sample_every == o.sample_every && disable_sampling == o.disable_sampling &&
         skip_first_sample == o.skip_first_sample && low_vram == o.low_vram && quantize == o.quantize &&
         num_frames == o.num_frames && sample_num_frames == o.sample_num_frames && is_video == o.is_video &&
         attention_chunk == o.attention_chunk && vae_tiling == o.vae_tiling;
}

std::string summarize(const MemorySettings& s) {
  std::string buckets;
  for (int r : s.active_resolutions()) buckets += (buckets.empty() ? "" : ",") + std::to_string(r);
  std::string out = fmt::format("checkpointing {}, batch {} x accumulation {}, buckets [{}]",
                                s.gradient_checkpointing ? "on" : "off", s.batch_size, s.grad_accumulation, buckets);
  if (s.is_video) out += fmt::format(", frames {}", s.num_frames);
  if (s.disable_sampling) {
    out += ", sampling off";
  } else {
    out += fmt::format(", samples {}x{}/{} steps{}", s.sample_width, s.sample_height, s.sample_steps,
                       s.skip_first_sample ? " (no baseline)" : "");
  }
  if (s.attention_chunk > 0) out += fmt::format(", attention in chunks of {}", s.attention_chunk);
  if (s.vae_tiling) out += ", VAE tiled";
  if (s.low_vram) out += ", low_vram";
  if (s.quantize != Quantize::none) out += fmt::format(", base {}", to_string(s.quantize));
  return out;
}

SettingsChange changes(const MemorySettings& before, const MemorySettings& after) {
  SettingsChange c;
  c.checkpointing = before.gradient_checkpointing != after.gradient_checkpointing;
  c.batch_size = before.batch_size != after.batch_size;
  c.buckets = before.dropped_largest != after.dropped_largest || before.resolutions != after.resolutions;
  c.frames = before.num_frames != after.num_frames;
  c.quantize = before.quantize == Quantize::none && after.quantize != Quantize::none;
  c.low_vram = !before.low_vram && after.low_vram;
  c.attention = before.attention_chunk != after.attention_chunk;
  c.vae_tiling = before.vae_tiling != after.vae_tiling;
  return c;
}

void to_json(nlohmann::json& j, const MemorySettings& s) {
  j = nlohmann::json{{"gradient_checkpointing", s.gradient_checkpointing},
                     {"batch_size", s.batch_size},
                     {"gradient_accumulation", s.grad_accumulation},
                     {"resolutions", s.resolutions},
                     {"active_resolutions", s.active_resolutions()},
                     {"dropped_largest", s.dropped_largest},
                     {"sample_width", s.sample_width},
                     {"sample_height", s.sample_height},
                     {"sample_steps", s.sample_steps},
                     {"sample_every", s.sample_every},
                     {"disable_sampling", s.disable_sampling},
                     {"skip_first_sample", s.skip_first_sample},
                     {"low_vram", s.low_vram},
                     {"quantize", to_string(s.quantize)},
                     {"num_frames", s.num_frames},
                     {"sample_num_frames", s.sample_num_frames},
                     {"is_video", s.is_video},
                     {"attention_chunk", s.attention_chunk},
                     {"vae_tiling", s.vae_tiling}};
}

void from_json(const nlohmann::json& j, MemorySettings& s) {
  s.gradient_checkpointing = j.value("gradient_checkpointing", s.gradient_checkpointing);
  s.batch_size = j.value("batch_size", s.batch_size);
  s.grad_accumulation = j.value("gradient_accumulation", s.grad_accumulation);
  s.resolutions = j.value("resolutions", s.resolutions);
  s.dropped_largest = j.value("dropped_largest", s.dropped_largest);
  s.sample_width = j.value("sample_width", s.sample_width);
  s.sample_height = j.value("sample_height", s.sample_height);
  s.sample_steps = j.value("sample_steps", s.sample_steps);
  s.sample_every = j.value("sample_every", s.sample_every);
  s.disable_sampling = j.value("disable_sampling", s.disable_sampling);
  s.skip_first_sample = j.value("skip_first_sample", s.skip_first_sample);
  s.low_vram = j.value("low_vram", s.low_vram);
  s.quantize = quantize_from_string(j.value("quantize", std::string(to_string(s.quantize))));
  s.num_frames = j.value("num_frames", s.num_frames);
  s.sample_num_frames = j.value("sample_num_frames", s.sample_num_frames);
  s.is_video = j.value("is_video", s.is_video);
  s.attention_chunk = j.value("attention_chunk", s.attention_chunk);
  s.vae_tiling = j.value("vae_tiling", s.vae_tiling);
}

MemorySettings settings_from_config(const config::ProcessConfig& p, bool is_video) {
  MemorySettings s;
  s.gradient_checkpointing = p.train.gradient_checkpointing;
  s.batch_size = p.train.batch_size;
  // AI Toolkit has both spellings; the larger one is what the user asked for.
  s.grad_accumulation = std::max(p.train.gradient_accumulation, p.train.gradient_accumulation_steps);
  std::set<int> resolutions;
  int frames = 1;
  for (const auto& d : p.datasets) {
    resolutions.insert(d.resolution.begin(), d.resolution.end());
    frames = std::max(frames, d.num_frames);
  }
  s.resolutions.assign(resolutions.begin(), resolutions.end());
  s.sample_width = p.sample.width;
  s.sample_height = p.sample.height;
  s.sample_steps = p.sample.sample_steps;
  s.sample_every = p.sample.sample_every;
  s.disable_sampling = p.train.disable_sampling;
  s.skip_first_sample = p.train.skip_first_sample;
  s.low_vram = p.model.low_vram;
  if (p.model.quantize) {
    s.quantize = to_lower(p.model.qtype).find("int8") != std::string::npos ? Quantize::int8 : Quantize::fp8;
  }
  s.attention_chunk = p.memory.attention_chunk;
  s.vae_tiling = p.memory.vae_tiling;
  s.is_video = is_video;
  s.num_frames = is_video ? frames : 1;
  s.sample_num_frames = is_video ? p.sample.num_frames : 1;
  return s;
}

config::JobConfig config_with_settings(const config::JobConfig& job, const MemorySettings& s) {
  config::JobConfig out = job;
  auto set = [&out](const std::string& key, const std::string& value) {
    config::set_value(out, key, value, "oom-guard");
  };
  set("train.gradient_checkpointing", s.gradient_checkpointing ? "true" : "false");
  set("train.batch_size", std::to_string(s.batch_size));
  set("train.gradient_accumulation", std::to_string(s.grad_accumulation));
  set("train.gradient_accumulation_steps", "1");
  const auto active = s.active_resolutions();
  const auto& p = config::the_process(out);
  for (size_t i = 0; i < p.datasets.size(); ++i) {
    const auto& d = p.datasets[i];
    std::vector<int> kept;
    for (int r : d.resolution) {
      if (std::find(active.begin(), active.end(), r) != active.end()) kept.push_back(r);
    }
    if (kept.empty() && !active.empty()) kept.push_back(active.back());
    const std::string prefix = "datasets." + std::to_string(i) + ".";
    set(prefix + "resolution", flow_list(kept));
    if (s.is_video) set(prefix + "num_frames", std::to_string(std::min(d.num_frames, s.num_frames)));
  }
  set("sample.width", std::to_string(s.sample_width));
  set("sample.height", std::to_string(s.sample_height));
  set("sample.sample_steps", std::to_string(s.sample_steps));
  if (s.is_video) set("sample.num_frames", std::to_string(s.sample_num_frames));
  set("train.disable_sampling", s.disable_sampling ? "true" : "false");
  set("train.skip_first_sample", s.skip_first_sample ? "true" : "false");
  set("model.low_vram", s.low_vram ? "true" : "false");
  set("model.quantize", s.quantize != Quantize::none ? "true" : "false");
  if (s.quantize == Quantize::int8) set("model.qtype", "qint8");
  if (s.quantize == Quantize::fp8) set("model.qtype", "qfloat8");
  set("memory.attention_chunk", std::to_string(s.attention_chunk));
  set("memory.vae_tiling", s.vae_tiling ? "true" : "false");
  config::validate(out);
  return out;
}

int reduced_frames(int frames) {
  if (frames <= 1) return 1;
  return 4 * (((frames - 1) / 4) / 2) + 1;
}

int increased_frames(int frames, int cap) {
  // The next step up is the smallest value of the reduction sequence from the cap above `frames`.
  int best = cap;
  for (int f = cap; f > frames; f = reduced_frames(f)) {
    best = f;
    if (f == 1) break;
  }
  return std::max(frames, std::min(best, cap));
}

int frames_on_video_grid(int frames) {
  if (frames <= 1) return 1;
  const int up = 4 * (frames / 4) + 1;
  return up > 1024 ? up - 4 : up;
}

std::vector<std::string> put_frames_on_video_grid(config::ProcessConfig& p) {
  std::vector<std::string> notes;
  const auto note = [&notes](const std::string& key, int from, int to) {
    notes.push_back(fmt::format("{}: {} is not of the form 4k+1 that the video VAE encodes (1 frame, then 4 per latent "
                                "frame); using {}, as diffusers' WanPipeline rounds it",
                                key, from, to));
  };
  for (size_t i = 0; i < p.datasets.size(); ++i) {
    int& frames = p.datasets[i].num_frames;
    if (frames <= 1) continue;
    const int on_grid = std::max(frames_on_video_grid(frames), 5);
    if (on_grid != frames) note(fmt::format("datasets.{}.num_frames", i), frames, on_grid);
    frames = on_grid;
  }
  if (const int on_grid = frames_on_video_grid(p.sample.num_frames); on_grid != p.sample.num_frames) {
    note("sample.num_frames", p.sample.num_frames, on_grid);
    p.sample.num_frames = on_grid;
  }
  return notes;
}

}  // namespace lt::playbook
