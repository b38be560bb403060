// --config / --write-fix: read a lora-train config (AI Toolkit schema: job/config/process[0] with
// train/model/datasets/sample), learn what is already set, and write it back with one fix applied.
// Defaults below are AI Toolkit's (docs/reference: ai-toolkit.md §1), which lora-train shares.
#include <yaml-cpp/yaml.h>

#include <algorithm>

#include "advice.h"
#include "guard_ladder.h"
#include "loratrain/diagnose/fixes.h"
#include "loratrain/diagnose/report.h"
#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"

namespace lt::diagnose {
namespace {

YAML::Node load_config(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) throw InputError("config not found: " + path.string());
  try {
    return YAML::LoadFile(path.string());
  } catch (const YAML::ParserException& e) {
    throw ConfigError(path.string(), e.mark.line + 1, e.mark.column + 1, e.msg);
  } catch (const YAML::BadFile&) {
    throw InputError("cannot read config: " + path.string());
  }
}

// config.process[0] (or a bare process mapping). Mutable view into `root`.
YAML::Node process_node(YAML::Node root, const std::filesystem::path& path) {
  if (root["config"] && root["config"]["process"] && root["config"]["process"].IsSequence() &&
      root["config"]["process"].size() > 0)
    return root["config"]["process"][0];
  if (root["process"] && root["process"].IsSequence() && root["process"].size() > 0) return root["process"][0];
  if (root.IsMap() && (root["train"] || root["model"] || root["datasets"])) return root;
  throw ConfigError(path.string(), 0, 0, "no config.process[0] section (expected the AI Toolkit / lora-train layout)");
}

template <class T>
std::optional<T> get(const YAML::Node& n, const char* key) {
  if (!n || !n.IsMap() || !n[key] || !n[key].IsScalar()) return std::nullopt;
  try {
    return n[key].as<T>();
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

std::vector<int> ints_of(const YAML::Node& n) {
  std::vector<int> out;
  if (!n) return out;
  try {
    if (n.IsScalar()) out.push_back(n.as<int>());
    else if (n.IsSequence())
      for (const auto& e : n) out.push_back(e.as<int>());
  } catch (const YAML::Exception&) {
  }
  return out;
}

int lower_resolution(int r) { return r > 1024 ? 1024 : r > 768 ? 768 : r > 512 ? 512 : r; }

bool apply_fix(const Fix& f, YAML::Node proc, std::string* what) {
  YAML::Node train = proc["train"];
  YAML::Node model = proc["model"];
  YAML::Node sample = proc["sample"];
  YAML::Node datasets = proc["datasets"];
  auto set_true = [&](YAML::Node sec, const char* key) {
    if (get<bool>(sec, key).value_or(false)) return false;
    sec[key] = true;
    return true;
  };
  auto lower_buckets = [&]() {
    bool changed = false;
    if (!datasets || !datasets.IsSequence()) return false;
    for (std::size_t i = 0; i < datasets.size(); ++i) {
      YAML::Node ds = datasets[i];
      std::vector<int> r = ints_of(ds["resolution"]);
      if (r.empty()) r = {512};
      std::sort(r.begin(), r.end());
      r.erase(std::unique(r.begin(), r.end()), r.end());
      if (r.size() >= 2) r.pop_back();
      else if (r[0] > 512) r[0] = lower_resolution(r[0]);
      else continue;
      YAML::Node seq(YAML::NodeType::Sequence);
      for (int v : r) seq.push_back(v);
      seq.SetStyle(YAML::EmitterStyle::Flow);
      ds["resolution"] = seq;
      changed = true;
    }
    return changed;
  };

  if (f.id == "gradient_checkpointing" || f.id == "checkpointing_and_resolution") {
    bool changed = set_true(train, "gradient_checkpointing");
    if (f.id == "checkpointing_and_resolution") changed = lower_buckets() || changed;
    if (changed && what) *what = "train.gradient_checkpointing: true" + std::string(f.id == "gradient_checkpointing" ? "" : " and a lower resolution");
    return changed;
  }
  if (f.id == "batch_size_1") {
    int old = get<int>(train, "batch_size").value_or(1);
    if (old <= 1) return false;
    train["batch_size"] = 1;
    const char* acc_key = train["gradient_accumulation"] ? "gradient_accumulation" : "gradient_accumulation_steps";
    int acc = std::max(1, get<int>(train, acc_key).value_or(1));
    train[acc_key] = old * acc;
    if (what) *what = "train.batch_size: 1, train." + std::string(acc_key) + ": " + std::to_string(old * acc);
    return true;
  }
  if (f.id == "remove_largest_bucket") {
    bool changed = lower_buckets();
    if (changed && what) *what = "datasets[].resolution without the largest bucket";
    return changed;
  }
  if (f.id == "num_frames") {
    bool changed = false;
    if (datasets && datasets.IsSequence()) {
      for (std::size_t i = 0; i < datasets.size(); ++i) {
        YAML::Node ds = datasets[i];
        int n = get<int>(ds, "num_frames").value_or(1);
        if (n > 1) {
          ds["num_frames"] = lower_frames(n);
          changed = true;
        }
      }
    }
    int sn = get<int>(sample, "num_frames").value_or(1);
    if (sn > 1) {
      sample["num_frames"] = lower_frames(sn);
      changed = true;
    }
    if (changed && what) *what = "datasets[].num_frames and sample.num_frames lowered";
    return changed;
  }
  if (f.id == "skip_baseline_sample") {
    bool c = set_true(train, "skip_first_sample");
    if (c && what) *what = "train.skip_first_sample: true";
    return c;
  }
  if (f.id == "shrink_sampling") {
    bool changed = false;
    for (const char* k : {"width", "height"}) {
      int v = get<int>(sample, k).value_or(512);
      if (v > 512) {
        sample[k] = 512;
        changed = true;
      }
    }
    int steps = get<int>(sample, "sample_steps").value_or(20);
    if (steps > 20) {
      sample["sample_steps"] = 20;
      changed = true;
    }
    if (auto every = get<int>(sample, "sample_every"); every && *every > 0) {
      sample["sample_every"] = *every * 2;
      changed = true;
    }
    int nf = get<int>(sample, "num_frames").value_or(1);
    if (nf > 17) {
      sample["num_frames"] = 17;
      changed = true;
    }
    if (changed && what) *what = "sample: smaller width/height/steps, less often";
    return changed;
  }
  if (f.id == "disable_sampling") {
    bool c = set_true(train, "disable_sampling");
    if (c && what) *what = "train.disable_sampling: true";
    return c;
  }
  if (f.id == "low_vram") {
    bool changed = set_true(model, "low_vram");
    changed = set_true(model, "quantize") || changed;
    if (changed && what) *what = "model.low_vram: true, model.quantize: true";
    return changed;
  }
  // lora-train's attention is always memory-efficient (train.sdp does nothing): its lever is the chunk.
  if (f.id == "memory_efficient_attention") {
    YAML::Node memory = proc["memory"];
    const int chunk = get<int>(memory, "attention_chunk").value_or(0);
    if (chunk > 0 && chunk <= kGuardAttentionChunk) return false;
    memory["attention_chunk"] = kGuardAttentionChunk;
    if (what) *what = "memory.attention_chunk: " + std::to_string(kGuardAttentionChunk);
    return true;
  }
  if (f.id == "vae_tiling") {
    YAML::Node memory = proc["memory"];
    bool c = set_true(memory, "vae_tiling");
    if (c && what) *what = "memory.vae_tiling: true";
    return c;
  }
  if (f.id == "optimizer_8bit") {
    std::string opt = get<std::string>(train, "optimizer").value_or("adamw");
    if (opt.find("8bit") != std::string::npos) return false;
    train["optimizer"] = "adamw8bit";
    if (what) *what = "train.optimizer: adamw8bit";
    return true;
  }
  return false;  // allocator_config, free_gpu: not config settings
}

}  // namespace

void merge_config_settings(Diagnosis& d, const std::filesystem::path& config) {
  YAML::Node root = load_config(config);
  YAML::Node proc = process_node(root, config);
  YAML::Node train = proc["train"], model = proc["model"], sample = proc["sample"], datasets = proc["datasets"];
  YAML::Node memory = proc["memory"];
  Settings& s = d.settings;
  s.attention_chunk = get<int>(memory, "attention_chunk").value_or(0);
  s.vae_tiling = get<bool>(memory, "vae_tiling").value_or(false);
  s.gradient_checkpointing = get<bool>(train, "gradient_checkpointing").value_or(true);
  s.batch_size = get<int>(train, "batch_size").value_or(1);
  if (auto a = get<int>(train, "gradient_accumulation_steps")) s.gradient_accumulation = *a;
  if (auto a = get<int>(train, "gradient_accumulation")) s.gradient_accumulation = *a;
  s.disable_sampling = get<bool>(train, "disable_sampling").value_or(false);
  s.skip_first_sample = get<bool>(train, "skip_first_sample").value_or(false);
  if (auto o = get<std::string>(train, "optimizer")) s.optimizer = *o;
  if (auto p = get<std::string>(train, "dtype")) s.precision = *p;
  s.low_vram = get<bool>(model, "low_vram").value_or(false);
  s.quantize = get<bool>(model, "quantize").value_or(false);
  if (auto w = get<int>(sample, "width")) s.sample_width = *w;
  if (auto h = get<int>(sample, "height")) s.sample_height = *h;
  if (auto st = get<int>(sample, "sample_steps")) s.sample_steps = *st;
  if (auto e = get<int>(sample, "sample_every")) s.sample_every = *e;
  if (datasets && datasets.IsSequence()) {
    std::vector<int> res;
    int frames = 0;
    for (const auto& ds : datasets) {
      std::vector<int> r = ints_of(ds["resolution"]);
      if (r.empty()) r = {512};
      res.insert(res.end(), r.begin(), r.end());
      frames = std::max(frames, get<int>(ds, "num_frames").value_or(1));
    }
    std::sort(res.begin(), res.end());
    res.erase(std::unique(res.begin(), res.end()), res.end());
    s.resolutions = res;
    if (!res.empty()) s.max_resolution = res.back();
    s.num_frames = frames;
    if (frames > 1) d.kind = ModelKind::kVideo;
    else if (d.kind == ModelKind::kVideo) d.kind = ModelKind::kImage;
  }
  d.tried = tried_levers(d);
  detail::add_tried_notes(d);
  d.fixes = plan_fixes(d);
}

std::string write_fixed_config(const Diagnosis& d, const std::filesystem::path& config,
                               const std::filesystem::path& out, std::string* what) {
  YAML::Node root = load_config(config);
  YAML::Node proc = process_node(root, config);
  for (const Fix& f : d.fixes) {
    if (f.config_key.empty()) continue;
    if (apply_fix(f, proc, what)) {
      YAML::Emitter e;
      e << root;
      write_file_atomic(out, std::string(e.c_str()) + "\n");
      return f.id;
    }
  }
  return "";
}

}  // namespace lt::diagnose
