// Loading a job config: the top level (job / config{name, process[]} / meta), overrides, the rules
// that span several keys, the on-disk checks a run needs, and the effective-config dump.
#include "loratrain/config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <tuple>
#include <set>
#include <sstream>
#include <system_error>

#include "loratrain/config/model_path.h"
#include "loratrain/config/schema.h"
#include "loratrain/util/atomic_file.h"
#include "loratrain/util/strings.h"
#include "schema_tables.h"

namespace lt::config {

using detail::Ctx;
using detail::Val;

namespace {

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(line);
  }
  return lines;
}

[[noreturn]] void fail_at(const std::string& file, const YAML::Mark& mark, const std::string& message) {
  if (mark.line < 0) throw ConfigError(file, 0, 0, message);
  throw ConfigError(file, mark.line + 1, mark.column + 1, message);
}

void read_top_level(JobConfig& job, const YAML::Node& root, Ctx& c) {
  const std::string& file = c.file;
  if (root.IsNull()) throw ConfigError(file, 1, 1, "the config is empty (expected job:, config: and meta:)");
  if (!root.IsMap()) fail_at(file, root.Mark(), "expected a mapping with job:, config: and meta: at the top level");

  YAML::Node job_node, config_node, meta_node;
  YAML::Mark job_mark, config_mark, meta_mark;
  bool has_job = false, has_config = false, has_meta = false;
  std::map<std::string, int> seen;
  for (auto it = root.begin(); it != root.end(); ++it) {
    if (!it->first.IsScalar()) fail_at(file, it->first.Mark(), "expected a key name");
    const std::string key = it->first.Scalar();
    if (seen.count(key))
      fail_at(file, it->first.Mark(), "key '" + key + "' appears twice (first on line " + std::to_string(seen[key]) + ")");
    seen[key] = it->first.Mark().line + 1;
    const YAML::Mark mark = detail::value_mark(it->first, it->second);
    if (key == "job") job_node = it->second, job_mark = mark, has_job = true;
    else if (key == "config") config_node = it->second, config_mark = mark, has_config = true;
    else if (key == "meta") meta_node = it->second, meta_mark = mark, has_meta = true;
    else detail::fail_unknown_key(key, {"job", "config", "meta"}, it->first.Mark(), key, "the top level", c);
  }
  if (!has_job) throw ConfigError(file, 1, 1, "missing required key 'job' (AI Toolkit configs start with job: extension)");
  if (!has_config) throw ConfigError(file, 1, 1, "missing required key 'config' (with name: and process:)");

  detail::Rules job_rules;
  job_rules.one_of = {"extension"};
  job_rules.not_yet_values = {"train", "extract", "generate", "mod"};
  detail::read_value(job.job, Val{job_node, job_mark, "job"}, c, job_rules);

  if (!config_node.IsMap()) fail_at(file, config_mark, "config: expected a mapping with name: and process:");
  YAML::Node name_node, process_node;
  YAML::Mark name_mark, process_mark;
  bool has_name = false, has_process = false;
  seen.clear();
  for (auto it = config_node.begin(); it != config_node.end(); ++it) {
    if (!it->first.IsScalar()) fail_at(file, it->first.Mark(), "expected a key name");
    const std::string key = it->first.Scalar();
    if (seen.count(key))
      fail_at(file, it->first.Mark(), "key '" + key + "' appears twice in config (first on line " +
                                          std::to_string(seen[key]) + ")");
    seen[key] = it->first.Mark().line + 1;
    const YAML::Mark mark = detail::value_mark(it->first, it->second);
    if (key == "name") name_node = it->second, name_mark = mark, has_name = true;
    else if (key == "process") process_node = it->second, process_mark = it->first.Mark(), has_process = true;
    else detail::fail_unknown_key(key, {"name", "process"}, it->first.Mark(), "config." + key, "config", c);
  }
  if (!has_name || name_node.IsNull())
    fail_at(file, has_name ? name_mark : config_mark, "config: missing required key 'name' (the run's folder and file name)");
  // [name] cannot refer to itself: read the name before substitution is switched on.
  detail::read_value(job.name, Val{name_node, name_mark, "config.name"}, c, detail::Rules{});
  if (job.name.empty() || job.name.find_first_of("/\\") != std::string::npos || job.name == "." || job.name == "..")
    fail_at(file, name_mark, "config.name: expected a plain folder name (no '/'), got '" + job.name + "'");
  c.name = job.name;

  if (!has_process || process_node.IsNull())
    fail_at(file, has_process ? process_mark : config_mark, "config: missing required key 'process' (a list with one trainer process)");
  if (!process_node.IsSequence())
    fail_at(file, process_node.Mark(), "config.process: expected a list (each item starting with '- ')");
  if (process_node.size() == 0) fail_at(file, process_mark, "config.process: the list is empty; add one process (type: sd_trainer, ...)");
  if (process_node.size() > 1)
    fail_at(file, process_node[1].Mark(),
            "config.process: lora-train runs one process per config, this one has " +
                std::to_string(process_node.size()) + " (split them into separate configs)");
  const YAML::Node item = process_node[0];
  if (!item.IsMap()) fail_at(file, item.Mark(), "config.process: expected a mapping of keys (type:, model:, ...)");
  c.record("", item.Mark());
  ProcessConfig process;
  detail::read_section(process, detail::process_table(), Val{item, item.Mark(), ""}, c, "the process");
  job.process.push_back(std::move(process));

  // meta serves AI Toolkit's bookkeeping: any value is accepted; a mapping is kept for the dump.
  if (has_meta) {
    c.record("meta", meta_mark);
    if (meta_node.IsMap()) detail::read_value(job.meta, Val{meta_node, meta_mark, "meta"}, c, detail::Rules{});
  }
}

// "KEY=VALUE" -> KEY, or a ConfigError naming the malformed override.
std::string override_key(const std::string& assignment) {
  const size_t eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigError("--set " + assignment, 0, 0, "expected KEY=VALUE, e.g. --set train.batch_size=2");
  return trim(assignment.substr(0, eq));
}

bool has_origin(const JobConfig& job, const std::string& key) { return job.origins.count(key) > 0; }

// Media files a dataset folder may hold (AI Toolkit's image and video extensions).
bool is_image_file(const std::string& ext) {
  static const char* exts[] = {".jpg", ".jpeg", ".png", ".webp", ".bmp"};
  return std::any_of(std::begin(exts), std::end(exts), [&](const char* e) { return ext == e; });
}
bool is_video_file(const std::string& ext) {
  static const char* exts[] = {".mp4", ".webm", ".mov", ".mkv", ".avi", ".m4v", ".wmv", ".flv", ".gif"};
  return std::any_of(std::begin(exts), std::end(exts), [&](const char* e) { return ext == e; });
}

}  // namespace

// ---- loading -----------------------------------------------------------------------------------------

JobConfig parse_config_text(const std::string& text, const std::string& display_name,
                            const std::vector<std::string>& overrides) {
  JobConfig job;
  job.source_file = display_name;
  std::set<std::string> overridden;
  for (const auto& o : overrides) overridden.insert(override_key(o));
  Ctx c;
  c.file = display_name;
  c.lines = split_lines(text);
  c.origins = &job.origins;
  c.overridden = &overridden;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    fail_at(display_name, e.mark, "YAML syntax error: " + e.msg);
  }
  try {
    read_top_level(job, root, c);
  } catch (const YAML::Exception& e) {
    // Defensive: every read checks node types first, so yaml-cpp should never throw here.
    fail_at(display_name, e.mark, "could not read this value: " + e.msg);
  }
  for (const auto& o : overrides) apply_override(job, o);
  validate(job);
  return job;
}

JobConfig load_config(const std::filesystem::path& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    const bool exists = std::filesystem::exists(path, ec);
    throw ConfigError(path.string(), 0, 0, exists ? "cannot read the config file" : "config file not found");
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config_text(text.str(), path.string(), overrides);
}

ProcessConfig& the_process(JobConfig& job) {
  if (job.process.size() != 1)
    throw ConfigError(job.source_file.string(), 0, 0,
                      "lora-train runs exactly one process per config, this one has " + std::to_string(job.process.size()));
  return job.process.front();
}

const ProcessConfig& the_process(const JobConfig& job) { return the_process(const_cast<JobConfig&>(job)); }

// ---- overrides ---------------------------------------------------------------------------------------

void set_value(JobConfig& job, const std::string& dotted_key, const std::string& yaml_value, const std::string& label) {
  Ctx c;
  c.file = job.source_file.string();
  c.label = label.empty() ? "--set " + dotted_key + "=" + yaml_value : label;
  c.override_key = dotted_key;
  c.name = job.name;
  c.origins = &job.origins;
  const std::vector<std::string> parts = split(dotted_key, '.');
  if (dotted_key.empty() || std::any_of(parts.begin(), parts.end(), [](const std::string& p) { return p.empty(); }))
    throw ConfigError(c.label, 0, 0, "expected a dotted key such as train.batch_size or datasets.0.resolution");
  YAML::Node node;
  try {
    node = YAML::Load(yaml_value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(c.label, 0, 0, "the value is not valid YAML: " + e.msg);
  }
  ProcessConfig& process = the_process(job);
  detail::set_in(process, detail::process_table(), parts, 0, Val{node, YAML::Mark::null_mark(), dotted_key}, c);
  c.record(dotted_key, YAML::Mark::null_mark());
}

void apply_override(JobConfig& job, const std::string& assignment) {
  const std::string key = override_key(assignment);
  set_value(job, key, assignment.substr(assignment.find('=') + 1));
}

// ---- validation across keys ------------------------------------------------------------------------

ConfigError error_at(const JobConfig& job, const std::string& dotted_key, const std::string& message) {
  std::string key = dotted_key;
  while (true) {
    auto it = job.origins.find(key);
    if (it != job.origins.end()) {
      // An override's label already names its key ("--set model.name_or_path=x: ...").
      const bool named = it->second.line == 0 && starts_with(it->second.file, "--set " + dotted_key + "=");
      const std::string text = dotted_key.empty() || named ? message : dotted_key + ": " + message;
      return ConfigError(it->second.file, it->second.line, it->second.column, text);
    }
    if (key.empty()) break;
    const size_t dot = key.rfind('.');
    key = dot == std::string::npos ? std::string() : key.substr(0, dot);
  }
  return ConfigError(job.source_file.string(), 0, 0, dotted_key.empty() ? message : dotted_key + ": " + message);
}

void validate(JobConfig& job) {
  ProcessConfig& p = the_process(job);
  if (p.type.empty()) throw error_at(job, "", "missing required key 'type' (sd_trainer)");

  ModelConfig& m = p.model;
  if (m.name_or_path.empty()) {
    if (has_origin(job, "model")) throw error_at(job, "model", "missing required key 'name_or_path'");
    throw error_at(job, "", "missing required section 'model' (with name_or_path: the base checkpoint)");
  }
  if (p.datasets.empty()) {
    if (has_origin(job, "datasets")) throw error_at(job, "datasets", "at least one dataset is required");
    throw error_at(job, "", "missing required section 'datasets' (a list with at least one folder_path)");
  }
  for (size_t i = 0; i < p.datasets.size(); ++i) {
    if (p.datasets[i].folder_path.empty())
      throw error_at(job, "datasets." + std::to_string(i), "missing required key 'folder_path'");
  }
  // AI Toolkit: text embeddings are cached for all datasets or for none.
  const bool any_te_cache = std::any_of(p.datasets.begin(), p.datasets.end(),
                                        [](const DatasetConfig& d) { return d.cache_text_embeddings; });
  if (any_te_cache && !p.train.cache_text_embeddings) {
    for (size_t i = 0; i < p.datasets.size(); ++i)
      if (!p.datasets[i].cache_text_embeddings)
        throw error_at(job, "datasets." + std::to_string(i),
                       "cache_text_embeddings must be on for every dataset when one dataset has it "
                       "(or set train.cache_text_embeddings: true)");
  }

  TrainConfig& t = p.train;
  // AI Toolkit refuses this pair too: the text encoders cannot leave the GPU while being trained.
  if (t.unload_text_encoder && t.train_text_encoder)
    throw error_at(job, "train.unload_text_encoder",
                   "cannot unload the text encoders while training them (train.train_text_encoder is true)");
  if (t.gradient_accumulation > 1 && t.gradient_accumulation_steps != 1)
    throw error_at(job, "train.gradient_accumulation",
                   "gradient_accumulation and gradient_accumulation_steps cannot both be set; keep one");
  const std::string arch = effective_arch(m);
  if (m.assistant_lora_path && !arch.empty() && arch != "flux")
    throw error_at(job, "model.assistant_lora_path",
                   "assistant adapters are for Flux models only (as in AI Toolkit), but arch is " + arch);
  if (m.dtype && canonical_dtype(*m.dtype) != canonical_dtype(t.dtype))
    throw error_at(job, "model.dtype",
                   "'" + *m.dtype + "' disagrees with train.dtype '" + t.dtype +
                       "' (AI Toolkit uses train.dtype for the model); set train.dtype instead");

  SampleConfig& s = p.sample;
  if (!s.prompts.empty() && !s.samples.empty())
    throw error_at(job, "sample.samples", "give either sample.prompts or sample.samples, not both");
  for (size_t i = 0; i < s.samples.size(); ++i)
    if (trim(s.samples[i].prompt).empty())
      throw error_at(job, "sample.samples." + std::to_string(i), "missing required key 'prompt'");

  // Defaults that AI Toolkit derives from other keys.
  NetworkConfig& n = p.network;
  if (n.lokr_factor == 0) throw error_at(job, "network.lokr_factor", "must be -1 (automatic) or a positive factor, not 0");
  if ((n.type == "lokr" || n.type == "loha") && p.save.save_format == "peft")
    throw error_at(job, "save.save_format",
                   "the PEFT/diffusers layout holds LoRA adapters only; network.type " + n.type +
                       " is saved with save_format: safetensors (the LyCORIS keys ComfyUI and A1111/Forge load)");
  if (!n.linear_alpha) n.linear_alpha = n.alpha;
  if (n.conv && !n.conv_alpha) n.conv_alpha = static_cast<double>(*n.conv);
  if (!t.unet_lr) t.unet_lr = t.lr;
  if (!t.text_encoder_lr) t.text_encoder_lr = t.lr;
  if (!m.quantize_te) m.quantize_te = m.quantize;
  if (!m.dtype) m.dtype = t.dtype;
  if (!m.arch && m.arch_from_flags) m.arch = m.arch_from_flags;

  // The keys given that change nothing here, in the order they were written (overrides last).
  std::vector<std::pair<SourceLocation, std::string>> ignored;
  for (const auto& [path, at] : job.origins) {
    const KeyInfo* k = find_key(path);
    if (k && changes_nothing(*k)) ignored.emplace_back(at, path);
  }
  std::sort(ignored.begin(), ignored.end(), [](const auto& a, const auto& b) {
    const bool a_file = a.first.line > 0, b_file = b.first.line > 0;
    if (a_file != b_file) return a_file;
    return std::tie(a.first.line, a.first.column, a.second) < std::tie(b.first.line, b.first.column, b.second);
  });
  job.ignored_keys.clear();
  for (const auto& [at, path] : ignored) job.ignored_keys.push_back(path);
}

std::string ignored_keys_summary(const JobConfig& job) {
  if (job.ignored_keys.empty()) return "";
  std::string list;
  for (const auto& k : job.ignored_keys) list += (list.empty() ? "" : ", ") + k;
  return "accepted for AI Toolkit compatibility, no effect in lora-train (docs/config.md): " + list;
}

void validate_paths(const JobConfig& job) {
  namespace fs = std::filesystem;
  const ProcessConfig& p = the_process(job);
  for (size_t i = 0; i < p.datasets.size(); ++i) {
    const DatasetConfig& d = p.datasets[i];
    const std::string key = "datasets." + std::to_string(i) + ".folder_path";
    std::error_code ec;
    if (!fs::exists(d.folder_path, ec)) throw error_at(job, key, "dataset folder '" + d.folder_path + "' does not exist");
    if (!fs::is_directory(d.folder_path, ec)) throw error_at(job, key, "'" + d.folder_path + "' is not a folder");
    const bool video = d.num_frames > 1;
    size_t count = 0;
    for (fs::directory_iterator it(d.folder_path, ec), end; !ec && it != end; it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      const std::string ext = to_lower(it->path().extension().string());
      // A video dataset trains on clips and on images (one-frame clips).
      if (is_image_file(ext) || (video && is_video_file(ext))) ++count;
    }
    if (ec) throw error_at(job, key, "cannot list dataset folder '" + d.folder_path + "': " + ec.message());
    if (count == 0)
      throw error_at(job, key, "dataset folder '" + d.folder_path + "' is empty: it holds no " +
                                   (video ? "clips or images (.mp4, .webm, .mov, .mkv, .avi, .m4v, .wmv, .flv, .gif, .webp, .jpg, .jpeg, .png, .bmp; num_frames > 1)"
                                          : "images (.jpg, .jpeg, .png, .webp, .bmp)"));
  }
  const ModelConfig& m = p.model;
  // Local paths or repo ids in the local Hugging Face cache (model_path.h), reported at the key.
  auto check = [&](const std::string& key, const std::function<void()>& resolve) {
    try {
      resolve();
    } catch (const InputError& e) {
      throw error_at(job, key, e.what());
    }
  };
  check("model.name_or_path", [&] { resolve_model_path(m.name_or_path, ""); });
  if (m.vae_path) check("model.vae_path", [&] { resolve_model_path(*m.vae_path, ""); });
  if (m.assistant_lora_path)
    check("model.assistant_lora_path", [&] { resolve_adapter_file(*m.assistant_lora_path, ""); });
  std::error_code ec;
  if (m.tokenizer_path && !fs::exists(*m.tokenizer_path, ec))
    throw error_at(job, "model.tokenizer_path", "'" + *m.tokenizer_path + "' does not exist");
}

// ---- the effective config ----------------------------------------------------------------------------

std::string dump_effective_yaml(const JobConfig& job) {
  YAML::Emitter e;
  e.SetIndent(2);
  e.SetNullFormat(YAML::LowerNull);
  e << YAML::BeginMap;
  e << YAML::Key << "job" << YAML::Value;
  detail::emit_value(e, job.job);
  e << YAML::Key << "config" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "name" << YAML::Value;
  detail::emit_value(e, job.name);
  e << YAML::Key << "process" << YAML::Value << YAML::BeginSeq;
  for (const auto& p : job.process) detail::emit_section(p, detail::process_table(), e);
  e << YAML::EndSeq << YAML::EndMap;
  e << YAML::Key << "meta" << YAML::Value;
  detail::emit_value(e, job.meta);
  e << YAML::EndMap;
  return "# Effective config written by lora-train: every key of this run, defaults filled in.\n" +
         std::string(e.c_str()) + "\n";
}

void write_effective_yaml(const JobConfig& job, const std::filesystem::path& path) {
  write_file_atomic(path, dump_effective_yaml(job));
}

// ---- helpers for consumers -----------------------------------------------------------------------------

namespace {
YAML::Node param_node(const ParamMap& params, const std::string& key) {
  auto it = params.find(key);
  if (it == params.end()) return YAML::Node();
  if (it->second.collection) return YAML::Load(it->second.text);
  if (it->second.text.empty() && !it->second.quoted) return YAML::Node();
  return YAML::Node(it->second.text);
}
bool to_number(const std::string& s, double& out) {
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return !s.empty() && end == s.c_str() + s.size();
}
}  // namespace

std::optional<double> param_number(const ParamMap& params, const std::string& key, const std::string& what) {
  const YAML::Node n = param_node(params, key);
  if (!n || n.IsNull()) return std::nullopt;
  double v = 0;
  if (!n.IsScalar() || !to_number(trim(n.Scalar()), v)) throw InputError(what + "." + key + ": expected a number");
  return v;
}

std::optional<std::vector<double>> param_number_list(const ParamMap& params, const std::string& key,
                                                     const std::string& what) {
  const YAML::Node n = param_node(params, key);
  if (!n || n.IsNull()) return std::nullopt;
  if (!n.IsSequence()) throw InputError(what + "." + key + ": expected a list of numbers");
  std::vector<double> out;
  for (size_t i = 0; i < n.size(); ++i) {
    double v = 0;
    if (!n[i].IsScalar() || !to_number(trim(n[i].Scalar()), v))
      throw InputError(what + "." + key + ": expected a list of numbers");
    out.push_back(v);
  }
  return out;
}

std::optional<bool> param_bool(const ParamMap& params, const std::string& key, const std::string& what) {
  const YAML::Node n = param_node(params, key);
  if (!n || n.IsNull()) return std::nullopt;
  const std::string s = n.IsScalar() ? to_lower(trim(n.Scalar())) : "";
  if (s == "true" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "no" || s == "off") return false;
  throw InputError(what + "." + key + ": expected a boolean (true or false)");
}

std::string canonical_dtype(const std::string& dtype) {
  const std::string d = to_lower(dtype);
  if (d == "fp32" || d == "float32" || d == "float") return "fp32";
  if (d == "fp16" || d == "float16" || d == "half") return "fp16";
  if (d == "bf16" || d == "bfloat16") return "bf16";
  return d;
}

std::string effective_arch(const ModelConfig& model) {
  if (model.arch) return *model.arch;
  if (model.arch_from_flags) return *model.arch_from_flags;
  return "";
}

}  // namespace lt::config
