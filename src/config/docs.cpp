// The key tables as data (all_keys) and docs/config.md rendered from them, so the reference can
// never drift from what the parser accepts (tests/config checks the file is up to date).
#include <algorithm>
#include <sstream>

#include "loratrain/config/schema.h"
#include "loratrain/util/strings.h"
#include "schema_tables.h"

namespace lt::config {

const std::vector<KeyInfo>& all_keys() {
  static const std::vector<KeyInfo> keys = [] {
    std::vector<KeyInfo> out;
    auto top = [&](const char* path, const char* type, const char* dflt, const char* allowed, const char* doc) {
      KeyInfo k;
      k.name = path;
      k.path = path;
      k.section = "(top level)";
      k.type = type;
      k.default_value = dflt;
      k.allowed = allowed;
      k.doc = doc;
      out.push_back(k);
    };
    top("job", "string", "required", "extension", "Job kind. Required. (AI Toolkit's train, extract, generate and mod jobs are not supported yet.)");
    top("config.name", "string", "required", "a plain folder name",
        "Name of the run: its folder (training_folder/<name>) and adapter file name. Required. Replaces [name] in every string.");
    top("config.process", "list of sections", "required", "exactly one item", "The trainer process (keys below). Required.");
    top("meta", "mapping", "{}", "",
        "Free-form notes (name: \"[name]\", version: '1.0'). AI Toolkit copies them into the adapter's "
        "metadata; lora-train keeps them in the effective config only.");
    out.back().support = Support::kIgnored;
    detail::collect_keys(detail::process_table(), "", out);
    return out;
  }();
  return keys;
}

namespace {
// "datasets.0.resolution" -> "datasets[].resolution"
std::string table_path(const std::string& dotted) {
  std::string out;
  for (const auto& part : split(dotted, '.')) {
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos) out += "[]";
    else out += (out.empty() ? "" : ".") + part;
  }
  return out;
}
}  // namespace

const KeyInfo* find_key(const std::string& dotted_path) {
  const std::string path = table_path(dotted_path);
  for (const auto& k : all_keys())
    if (k.path == path) return &k;
  return nullptr;
}

bool is_memory_lever(const std::string& dotted_path) {
  const KeyInfo* k = find_key(dotted_path);
  return k && k->memory_lever;
}

bool changes_nothing(const KeyInfo& key) {
  return key.support == Support::kNoEffect || key.support == Support::kIgnored;
}

namespace {

std::string cell(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|') out += "\\|";
    else if (ch == '\n') out += ' ';
    else out += ch;
  }
  return out;
}

std::string code(const std::string& s) { return s.empty() ? "" : "`" + cell(s) + "`"; }

std::string status(const KeyInfo& k) {
  if (k.ours) return "lora-train";
  switch (k.support) {
    case Support::kSupported: return "supported";
    case Support::kNoEffect: return "accepted, no effect";
    case Support::kNotYet: return "not yet (only the default)";
    case Support::kIgnored: return "ignored (AI Toolkit UI)";
  }
  return "";
}

const char* kIntro = R"(# Config reference

<!-- Generated from the key tables in src/config/schema.cpp by render_config_reference().
     Do not edit by hand: run `LT_UPDATE_DOCS=1 build/tests/config/test_config "[docs]"`. -->

lora-train reads ostris AI Toolkit's YAML job files unchanged: the same sections, key names and
defaults. This page lists every key lora-train knows, generated from the tables the parser itself
uses.

```yaml
job: extension
config:
  name: my_lora                 # the run folder: <training_folder>/my_lora/
  process:
    - type: sd_trainer
      training_folder: output
      device: cuda:0
      network: {type: lora, linear: 16, linear_alpha: 16}
      save: {dtype: float16, save_every: 250}
      datasets:
        - folder_path: /data/my_images
          resolution: [512, 768]
      train: {batch_size: 1, steps: 2000, lr: 1e-4, optimizer: adamw8bit, dtype: bf16}
      model: {name_or_path: /models/sd15.safetensors}
      sample: {sampler: ddpm, sample_every: 250, prompts: ["a photo of [trigger]"]}
      memory: {vram_limit: 22GiB, oom_guard: {enabled: true}}   # lora-train's own section
meta:
  name: "[name]"
```

## How values are read

- **Substitution.** `[name]` in any string becomes `config.name`. `${VAR}` becomes the environment
  variable `VAR`; an unset variable is an error pointing at it.
- **Overrides.** `lora-train run config.yaml --set train.batch_size=2 --set datasets.0.resolution=[512]`
  sets any key inside the process. Values are YAML (scalars or flow lists) and are checked exactly
  like values in the file; an error names the override (`--set train.batch_size=abc: expected an
  integer, got 'abc'`). List items are addressed by index (`datasets.0`, `sample.samples.1`). An
  override replaces the file's value before that value is checked, so it can fix a file value that
  would be rejected (`--set train.diff_output_preservation=false`).
- **AI Toolkit's files.** Its example configs and the jobs its UI writes (YAML from the advanced
  editor, or the `.job_config.json` it runs) load unchanged. The UI's model names are read as
  families (`arch: sd15` is sd1, `wan21:1b` is wan21, flex1 is flux) and its `save_format: diffusers`
  is the `peft` key layout. Keys that serve only its UI are accepted and listed in the run log.
- **Model paths.** `model.name_or_path` (and `vae_path`, `assistant_lora_path`) is a local file or
  folder, or a Hugging Face repo id (`black-forest-labs/FLUX.1-dev`) that is already in the local
  Hugging Face cache: `HF_HUB_CACHE`, else `HF_HOME/hub`, else `~/.cache/huggingface/hub`, in
  `models--org--name/snapshots/<the commit refs/main names>`. Nothing is downloaded; when the repo is
  missing, the error says where it looked and how to get it there (`huggingface-cli download` on a
  machine with network, then copy the cache).
- **Errors.** Every problem is one line `config.yaml:LINE:COL: message` and exit code 2: YAML
  syntax, unknown keys (with the closest valid key), wrong types, values out of range or not
  allowed (with the allowed list), missing required keys, missing or empty dataset folders (checked
  when a run starts), and AI Toolkit keys lora-train does not support yet.
- **Status column.** *supported*: read and honoured. *accepted, no effect*: accepted for AI Toolkit
  compatibility, the reason is given. *ignored (AI Toolkit UI)*: serves only AI Toolkit's UI or
  bookkeeping; any value is accepted. *not yet (only the default)*: an AI Toolkit key lora-train does
  not support yet; it is accepted only at its default value (so files written by AI Toolkit's UI
  load) and reported as `key 'X' is an AI Toolkit setting that lora-train does not support yet`
  otherwise. *lora-train*: a key of ours, not in AI Toolkit.
- **Memory lever.** "yes" marks keys that change peak memory; the OOM guard and `lora-train
  diagnose` change these (see the OOM guide and OOM_PLAYBOOK.md for the order).
- **Effective config.** At run start the config with every default filled in is written to
  `<training_folder>/<name>/config.yaml`; it loads back to the same config.
)";

}  // namespace

std::string render_config_reference() {
  std::ostringstream out;
  out << kIntro;

  out << "\n## Memory levers at a glance\n\n";
  for (const auto& k : all_keys())
    if (k.memory_lever) out << "- `" << k.path << "`: " << cell(k.doc) << "\n";

  out << "\n## AI Toolkit keys that change nothing here\n\n"
         "Accepted so that AI Toolkit's files load unchanged. A run lists the ones its config sets once, at "
         "info level, at the start of its log. *ignored*: serves only AI Toolkit's UI or bookkeeping, any "
         "value is accepted. *no effect*: the value is checked, the reason is given.\n\n";
  for (const auto& k : all_keys())
    if (changes_nothing(k))
      out << "- `" << k.path << "` (" << (k.support == Support::kIgnored ? "ignored" : "no effect")
          << "): " << cell(k.doc) << "\n";

  out << "\n## AI Toolkit keys not supported yet\n\n"
         "They change training in AI Toolkit and lora-train does not implement them yet. Each is accepted at "
         "its default (so files written by AI Toolkit's UI load); any other value stops the run with "
         "`config.yaml:LINE:COL: key 'X' is an AI Toolkit setting that lora-train does not support yet`. "
         "They are never ignored silently.\n\n";
  for (const auto& k : all_keys())
    if (k.support == Support::kNotYet)
      out << "- `" << k.path << "` (default `" << cell(k.default_value) << "`): " << cell(k.doc) << "\n";
  out << "\nValues not supported yet of keys that are otherwise supported (the run stops the same way):\n\n";
  for (const auto& k : all_keys())
    if (k.support != Support::kNotYet && !k.not_yet_values.empty())
      out << "- `" << k.path << "`: " << cell(k.not_yet_values) << "\n";

  // One table per section, sections in order of first appearance.
  std::vector<std::string> sections;
  for (const auto& k : all_keys())
    if (std::find(sections.begin(), sections.end(), k.section) == sections.end()) sections.push_back(k.section);
  for (const auto& section : sections) {
    std::string title = section == "process" ? "Process keys (`config.process[0]`)" : "`" + section + "`";
    if (section == "(top level)") title = "Top level";
    out << "\n## " << title << "\n\n";
    std::string parent_path = section;
    if (ends_with(parent_path, "[]")) parent_path.resize(parent_path.size() - 2);
    for (const auto& parent : all_keys())
      if (parent.path == parent_path && !parent.doc.empty()) out << cell(parent.doc) << "\n\n";
    out << "| key | type | default | allowed | memory lever | status | meaning |\n";
    out << "|---|---|---|---|---|---|---|\n";
    for (const auto& k : all_keys()) {
      if (k.section != section) continue;
      std::string allowed = k.allowed;
      if (!k.not_yet_values.empty())
        allowed += (allowed.empty() ? "" : "; ") + std::string("not yet: ") + k.not_yet_values;
      const size_t dot = k.path.rfind('.');
      const std::string name =
          dot == std::string::npos || section == "(top level)" ? k.path : k.path.substr(dot + 1);
      out << "| `" << cell(name) << "` | " << cell(k.type) << " | " << code(k.default_value) << " | "
          << cell(allowed) << " | " << (k.memory_lever ? "yes" : "") << " | " << status(k) << " | " << cell(k.doc)
          << " |\n";
    }
  }
  return out.str();
}

}  // namespace lt::config
