// Model paths: local files and folders, or Hugging Face repo ids found in the local cache.
#include "loratrain/config/model_path.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <system_error>
#include <vector>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::config {

namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::string home_dir() {
  std::string home = env("HOME");
  if (!home.empty()) return home;
  if (const passwd* pw = getpwuid(getuid()); pw && pw->pw_dir) return pw->pw_dir;
  return "/";
}

// os.path.expanduser for "~" and "~/..." (what huggingface_hub applies to its settings).
fs::path expand_user(const std::string& p) {
  if (p == "~") return home_dir();
  if (starts_with(p, "~/")) return fs::path(home_dir()) / p.substr(2);
  return p;
}

bool valid_repo_part(const std::string& part) {
  if (part.empty()) return false;
  for (char ch : part) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                    ch == '_' || ch == '-' || ch == '.';
    if (!ok) return false;
  }
  const char first = part.front(), last = part.back();
  if (first == '-' || first == '.' || last == '-' || last == '.') return false;
  return part.find("--") == std::string::npos && part.find("..") == std::string::npos;
}

bool path_exists(const fs::path& p) {
  std::error_code ec;
  return fs::exists(p, ec);
}

std::string prefix(const std::string& what) { return what.empty() ? std::string() : what + ": "; }

// The folder huggingface_hub keeps a model repo in: models--org--name.
std::string repo_folder_name(const std::string& repo_id) {
  const size_t slash = repo_id.find('/');
  return "models--" + repo_id.substr(0, slash) + "--" + repo_id.substr(slash + 1);
}

std::string how_to_get(const std::string& repo_id, const HubCache& cache, const std::string& files = "") {
  return "To get it there, run `huggingface-cli download " + repo_id + (files.empty() ? "" : " " + files) +
         "` on a machine with network (gated repos such as FLUX.1-dev need `huggingface-cli login` and the "
         "license accepted on huggingface.co first) and copy its ~/.cache/huggingface/hub/" +
         repo_folder_name(repo_id) + " folder into " + cache.root.string() +
         "/, or point HF_HUB_CACHE at a copied cache; or give a local file or folder";
}

// A missing local path; strings shaped almost like a repo id get a hint on how those are written.
std::string missing_local(const std::string& what, const std::string& p) {
  const bool repo_shaped = std::count(p.begin(), p.end(), '/') == 1 && !starts_with(p, "/") &&
                           !starts_with(p, ".") && !starts_with(p, "~") && fs::path(p).extension().empty();
  return prefix(what) + "'" + p + "' does not exist" +
         (repo_shaped ? " (nor is it a valid Hugging Face repo id: org/name of letters, digits, '-', '_', '.')" : "");
}

// The snapshot of `repo_id` in the cache: the commit refs/main names, else the newest snapshot.
ResolvedPath find_snapshot(const std::string& repo_id, const std::string& what) {
  const HubCache cache = hub_cache();
  const fs::path repo_dir = cache.root / repo_folder_name(repo_id);
  const std::string intro = prefix(what) + "'" + repo_id +
                            "' is not a local path, so it is read as a Hugging Face repo id, which must already be "
                            "in the local Hugging Face cache (lora-train never downloads): ";
  if (!path_exists(repo_dir))
    throw InputError(intro + repo_dir.string() + " does not exist (cache root from " + cache.chosen_by + "). " +
                     how_to_get(repo_id, cache));

  ResolvedPath out;
  out.from_hub_cache = true;
  out.repo_id = repo_id;
  const fs::path snapshots = repo_dir / "snapshots";
  std::string commit;
  {
    std::ifstream ref(repo_dir / "refs" / "main");
    if (ref) std::getline(ref, commit);
    commit = trim(commit);
  }
  if (!commit.empty() && path_exists(snapshots / commit)) {
    out.path = snapshots / commit;
    out.commit = commit;
    return out;
  }

  // No usable refs/main (a copied cache, or a download by commit): take the newest snapshot.
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  std::error_code ec;
  for (fs::directory_iterator it(snapshots, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_directory(ec)) continue;
    found.emplace_back(fs::last_write_time(it->path(), ec), it->path().filename().string());
  }
  if (found.empty())
    throw InputError(intro + repo_dir.string() + " holds no snapshot in snapshots/ (an interrupted download or "
                     "an incomplete copy). " + how_to_get(repo_id, cache));
  std::sort(found.begin(), found.end());
  out.commit = found.back().second;
  out.path = snapshots / out.commit;
  out.note = repo_id + ": " +
             (commit.empty() ? "no refs/main in the cache"
                             : "refs/main names " + commit + ", which has no snapshot folder") +
             "; using " +
             (found.size() == 1 ? std::string("the only snapshot, ")
                                : "the newest of " + std::to_string(found.size()) + " snapshots, ") +
             out.commit;
  return out;
}

}  // namespace

bool looks_like_repo_id(const std::string& s) {
  if (s.size() > 96 || path_exists(s)) return false;
  const size_t slash = s.find('/');
  if (slash == std::string::npos || s.find('/', slash + 1) != std::string::npos) return false;
  const std::string org = s.substr(0, slash), name = s.substr(slash + 1);
  if (!valid_repo_part(org) || !valid_repo_part(name)) return false;
  const std::string lower = to_lower(name);
  for (const char* ext : {".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".gguf", ".sft"})
    if (ends_with(lower, ext)) return false;
  return true;
}

HubCache hub_cache() {
  // huggingface_hub's constants.py order; an empty variable counts as unset.
  if (std::string v = env("HF_HUB_CACHE"); !v.empty()) return {expand_user(v), "HF_HUB_CACHE"};
  if (std::string v = env("HUGGINGFACE_HUB_CACHE"); !v.empty()) return {expand_user(v), "HUGGINGFACE_HUB_CACHE"};
  if (std::string v = env("HF_HOME"); !v.empty()) return {expand_user(v) / "hub", "HF_HOME"};
  if (std::string v = env("XDG_CACHE_HOME"); !v.empty())
    return {expand_user(v) / "huggingface" / "hub", "XDG_CACHE_HOME; HF_HUB_CACHE and HF_HOME are unset"};
  return {fs::path(home_dir()) / ".cache" / "huggingface" / "hub",
          "the default location; HF_HUB_CACHE, HF_HOME and XDG_CACHE_HOME are unset"};
}

ResolvedPath resolve_model_path(const std::string& name_or_path, const std::string& what) {
  if (path_exists(name_or_path)) return ResolvedPath{name_or_path, false, "", "", ""};
  if (!looks_like_repo_id(name_or_path)) throw InputError(missing_local(what, name_or_path));
  ResolvedPath out = find_snapshot(name_or_path, what);
  std::error_code ec;
  if (fs::is_empty(out.path, ec))
    throw InputError(prefix(what) + "'" + name_or_path + "': the cached snapshot " + out.path.string() +
                     " is empty (an incomplete copy). " + how_to_get(name_or_path, hub_cache()));
  return out;
}

ResolvedPath resolve_adapter_file(const std::string& path_or_repo, const std::string& what,
                                  const std::string& filename) {
  std::error_code ec;
  ResolvedPath out;
  if (path_exists(path_or_repo)) {
    out.path = path_or_repo;
    if (!fs::is_directory(out.path, ec)) return out;
  } else if (looks_like_repo_id(path_or_repo)) {
    out = find_snapshot(path_or_repo, what);
  } else {
    throw InputError(missing_local(what, path_or_repo));
  }
  const fs::path file = out.path / filename;
  if (!path_exists(file)) {
    std::string msg = prefix(what) + "'" + path_or_repo + "': " + out.path.string() + " holds no " + filename;
    if (out.from_hub_cache) msg += ". " + how_to_get(path_or_repo, hub_cache(), filename);
    throw InputError(msg);
  }
  out.path = file;
  return out;
}

}  // namespace lt::config
