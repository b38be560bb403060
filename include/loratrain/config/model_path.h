// Where a model path from the config lives on disk: a local file or folder as given, or a Hugging
// Face repo id ("black-forest-labs/FLUX.1-dev") looked up in the local Hugging Face cache, the way
// huggingface_hub lays it out. Nothing here touches the network: lora-train never downloads.
//
// Cache root, as huggingface_hub picks it: $HF_HUB_CACHE, else $HUGGINGFACE_HUB_CACHE (its older
// name), else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.
// A repo lives in <root>/models--<org>--<name>/snapshots/<commit>/, where refs/main holds the
// commit of the main branch; without refs/main (a copied cache) the newest snapshot is used.
#pragma once
#include <filesystem>
#include <string>

namespace lt::config {

// true when `s` is written as a Hugging Face repo id and no such local path exists: exactly
// "org/name", each part letters, digits, '_', '-', '.', not starting or ending with '-' or '.',
// no "--" or "..", at most 96 characters (huggingface_hub's rules), and `name` not ending in a
// weight-file extension (.safetensors, .ckpt, .pt, .pth, .bin, .gguf: a missing local file instead).
bool looks_like_repo_id(const std::string& s);

// The cache root in effect and which setting chose it ("HF_HUB_CACHE", "HF_HOME",
// "the default"...), for messages.
struct HubCache {
  std::filesystem::path root;
  std::string chosen_by;
};
HubCache hub_cache();

struct ResolvedPath {
  std::filesystem::path path;  // what to open: the local path, or the snapshot folder (or a file in it)
  bool from_hub_cache = false;
  std::string repo_id;         // set when from_hub_cache
  std::string commit;          // the snapshot's folder name, when from_hub_cache
  std::string note;            // non-empty when worth logging (e.g. "refs/main missing, used snapshot X")
};

// `name_or_path` as a local path when it exists, else as a repo id in the cache. Throws
// lt::InputError when neither is there; for a repo id the message says where it looked and how
// to get the files there. `what` names the setting in messages ("model.name_or_path").
ResolvedPath resolve_model_path(const std::string& name_or_path, const std::string& what);

// An adapter file as AI Toolkit finds one: a file as given; a folder (local or a cached repo's
// snapshot) holding `filename`. Throws lt::InputError when it is not there.
ResolvedPath resolve_adapter_file(const std::string& path_or_repo, const std::string& what,
                                  const std::string& filename = "pytorch_lora_weights.safetensors");

}  // namespace lt::config
