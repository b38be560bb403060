// The config's key tables as data: the one list that parsing, validation, the effective-config dump
// and docs/config.md all come from. Other components use it to ask "is this key a memory lever?".
#pragma once
#include <string>
#include <vector>

namespace lt::config {

enum class Support {
  kSupported,  // read and honoured
  kNoEffect,   // accepted for AI Toolkit compatibility; documented why it changes nothing here
  kNotYet,     // an AI Toolkit key lora-train does not support yet: accepted only at its default
  kIgnored,    // serves only AI Toolkit's UI or bookkeeping: accepted with any value, changes nothing
};

struct KeyInfo {
  std::string name;           // the key itself: "batch_size"
  std::string path;           // "train.batch_size", "datasets[].resolution", "config.name"
  std::string section;        // "train", "datasets[]", "(top level)", ...
  std::string type;           // "integer", "number", "boolean", "string", "list of integers", ...
  std::string default_value;  // YAML text of the default ("1000", "fp32", "null", "= alpha")
  std::string allowed;        // "at least 1", "fp32, fp16, bf16", "" (anything of the type)
  std::string not_yet_values; // AI Toolkit values lora-train does not support yet ("lokr, lorm")
  Support support = Support::kSupported;
  bool ours = false;          // a lora-train key, not in AI Toolkit
  bool memory_lever = false;  // changing it changes peak memory (OOM_PLAYBOOK.md)
  std::string doc;
};

// Every key, in document order (sections in the order of AI Toolkit's example files).
const std::vector<KeyInfo>& all_keys();

// Looks a key up by dotted path; list indices are accepted ("datasets.0.resolution").
const KeyInfo* find_key(const std::string& dotted_path);

// true when the key (dotted, list indices accepted) is marked as a memory lever.
bool is_memory_lever(const std::string& dotted_path);

// true for keys that change nothing in lora-train (Support::kNoEffect or kIgnored).
bool changes_nothing(const KeyInfo& key);

// The full text of docs/config.md.
std::string render_config_reference();

}  // namespace lt::config
