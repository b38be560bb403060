#include "loratrain/data/cache.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <set>

#include "loratrain/data/rng.h"
#include "loratrain/io/safetensors.h"
#include "loratrain/util/error.h"

namespace lt::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kKeyField = "lt_cache_key";

at::Tensor to_cpu_unbatched(at::Tensor t) {
  t = t.detach();
  // [1, C, h, w] -> [C, h, w]; a clip's [1, C, f, h, w] -> [C, f, h, w]
  if ((t.dim() == 4 || t.dim() == 5) && t.size(0) == 1) t = t.squeeze(0);
  return t.to(torch::kCPU).contiguous();
}

void check_options(const CacheOptions& o, const char* what) {
  if (!o.in_memory && !o.to_disk)
    throw InputError(std::string(what) + ": caching needs memory or disk (both are off)");
}

// Reads the named tensors of a cache file whose stored key equals `key`. False when the file is
// missing; sets *stale when it exists but is unreadable or made for another key.
bool load_file(const fs::path& path, const std::string& key,
               std::vector<std::pair<std::string, at::Tensor>>* out, bool* stale) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return false;
  try {
    auto file = io::SafetensorsFile::open(path);
    auto it = file->metadata().find(kKeyField);
    if (it == file->metadata().end() || it->second != key) {
      *stale = true;
      return false;
    }
    out->clear();
    for (const io::TensorInfo& info : file->tensors()) out->emplace_back(info.name, file->load(info.name));
    return true;
  } catch (const std::exception& e) {
    spdlog::warn("cache file {} is unreadable and will be rebuilt: {}", path.string(), e.what());
    *stale = true;
    return false;
  }
}

void save_file(const fs::path& path, const std::string& key,
               const std::vector<std::pair<std::string, at::Tensor>>& tensors, const char* format) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec)
    throw Error(ExitCode::kRuntime,
                "cannot create cache folder " + path.parent_path().string() + ": " + ec.message());
  io::save_safetensors(path, tensors, {{kKeyField, key}, {"format", format}});
}

}  // namespace

// ---- latents ------------------------------------------------------------------------------------

LatentCache::LatentCache(const Dataset& dataset, CacheOptions options)
    : dataset_(&dataset), options_(std::move(options)) {
  check_options(options_, "latent cache");
}

std::string LatentCache::key(size_t image, const Placement& p, bool flip_x) const {
  const ImageRecord& rec = dataset_->images().at(image);
  std::string k = "lt-latent-v1|image=" + rec.content_hash + "|scale=" + std::to_string(p.scale_to_width) +
                  "x" + std::to_string(p.scale_to_height) + "|crop=" + std::to_string(p.crop_x) + "," +
                  std::to_string(p.crop_y) + "," + std::to_string(p.crop_width) + "x" +
                  std::to_string(p.crop_height) + "|flip_x=" + (flip_x ? "1" : "0");
  if (dataset_->is_video()) {
    // The frames themselves: a new num_frames, fps, shrink mode or window start is a new latent.
    const std::vector<int> frames = dataset_->clip_frame_indices(image, num_frames());
    std::string list;
    for (int f : frames) list += (list.empty() ? "" : ",") + std::to_string(f);
    k += "|num_frames=" + std::to_string(rec.is_clip() ? num_frames() : 1) + "|frames=" + list;
  }
  return k + "|model=" + options_.model_id;
}

void LatentCache::set_num_frames(int num_frames) {
  if (num_frames < 1) throw InputError("num_frames must be at least 1, got " + std::to_string(num_frames));
  options_.num_frames = num_frames;
}

int LatentCache::num_frames() const {
  return options_.num_frames > 0 ? options_.num_frames : dataset_->options().num_frames;
}

at::Tensor LatentCache::load_pixels(size_t image, const Placement& p, bool flip_x) const {
  if (dataset_->is_video()) return dataset_->load_clip_tensor(image, p, flip_x, num_frames()).unsqueeze(0);
  return dataset_->load_tensor(image, p, flip_x).unsqueeze(0);
}

fs::path LatentCache::disk_path(size_t image, const Placement& p, bool flip_x) const {
  const fs::path& img = dataset_->images().at(image).path;
  return img.parent_path() / "_latent_cache" /
         (img.stem().string() + "_" + Fnv64().update(key(image, p, flip_x)).hex() + ".safetensors");
}

CacheStats LatentCache::build(const BucketPlan& plan, const LatentEncoder& encoder,
                              const std::function<void(size_t, size_t)>& progress) {
  // num_repeats makes identical entries; each distinct sample is encoded once.
  std::vector<const BucketEntry*> todo;
  std::set<std::string> seen;
  for (const BucketEntry& e : plan.entries())
    if (seen.insert(key(e.image, e.placement, e.flip_x)).second) todo.push_back(&e);

  CacheStats stats;
  size_t done = 0;
  for (const BucketEntry* e : todo) {
    const std::string k = key(e->image, e->placement, e->flip_x);
    if (memory_.count(k)) {
      ++stats.in_memory;
    } else {
      bool have = false;
      if (options_.to_disk) {
        std::vector<std::pair<std::string, at::Tensor>> t;
        bool stale = false;
        if (load_file(disk_path(e->image, e->placement, e->flip_x), k, &t, &stale) &&
            !t.empty() && t.front().first == "latent") {
          have = true;
          ++stats.from_disk;
          if (options_.in_memory) memory_[k] = t.front().second;
        } else if (stale) {
          ++stats.rebuilt;
        }
      }
      if (!have) {
        at::Tensor pixels = load_pixels(e->image, e->placement, e->flip_x);  // [1, 3, (F,) H, W]
        at::Tensor latent;
        {
          torch::NoGradGuard no_grad;
          latent = to_cpu_unbatched(encoder(pixels));
        }
        ++stats.encoded;
        if (options_.to_disk)
          save_file(disk_path(e->image, e->placement, e->flip_x), k, {{"latent", latent}},
                    "lora-train latent cache");
        if (options_.in_memory) memory_[k] = latent;
      }
    }
    ++done;
    if (progress) progress(done, todo.size());
  }
  return stats;
}

bool LatentCache::contains(size_t image, const Placement& p, bool flip_x) const {
  const std::string k = key(image, p, flip_x);
  if (memory_.count(k)) return true;
  if (!options_.to_disk) return false;
  std::vector<std::pair<std::string, at::Tensor>> t;
  bool stale = false;
  return load_file(disk_path(image, p, flip_x), k, &t, &stale);
}

at::Tensor LatentCache::get(size_t image, const Placement& p, bool flip_x) const {
  const std::string k = key(image, p, flip_x);
  auto it = memory_.find(k);
  if (it != memory_.end()) return it->second;
  if (options_.to_disk) {
    std::vector<std::pair<std::string, at::Tensor>> t;
    bool stale = false;
    if (load_file(disk_path(image, p, flip_x), k, &t, &stale) && !t.empty()) return t.front().second;
  }
  throw Error(ExitCode::kRuntime, "latent cache: no latent for " +
                                      dataset_->images().at(image).path.string() + " (" + k +
                                      "); build() was not run for this bucket plan");
}

at::Tensor LatentCache::batch(const Batch& b) const {
  std::vector<at::Tensor> latents;
  latents.reserve(b.items.size());
  for (const BatchItem& item : b.items) latents.push_back(get(item));
  return torch::stack(latents);  // [B, C, h, w]
}

// ---- text embeddings ----------------------------------------------------------------------------

TextEmbeddingCache::TextEmbeddingCache(fs::path disk_dir, CacheOptions options)
    : dir_(std::move(disk_dir)), options_(std::move(options)) {
  check_options(options_, "text-embedding cache");
  if (options_.to_disk && dir_.empty())
    throw InputError("text-embedding cache: to_disk needs a folder");
}

std::string TextEmbeddingCache::key(const std::string& caption) const {
  return "lt-te-v1|model=" + options_.model_id + "|caption=" + caption;
}

fs::path TextEmbeddingCache::disk_path(const std::string& caption) const {
  return dir_ / (Fnv64().update(key(caption)).hex() + ".safetensors");
}

bool TextEmbeddingCache::try_load(const std::string& caption, TextEmbedding* out,
                                  bool* stale) const {
  if (!options_.to_disk) return false;
  return load_file(disk_path(caption), key(caption), out, stale);
}

TextEmbedding TextEmbeddingCache::encode_and_store(const std::string& caption,
                                                   const TextEncoder& encoder, CacheStats* stats) {
  TextEmbedding emb;
  {
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : encoder(caption)) {
      at::Tensor c = t.detach();
      if (c.dim() >= 2 && c.size(0) == 1) c = c.squeeze(0);
      emb.emplace_back(name, c.to(torch::kCPU).contiguous());
    }
  }
  if (emb.empty()) throw Error(ExitCode::kRuntime, "text encoder returned no tensors");
  if (stats) ++stats->encoded;
  if (options_.to_disk) save_file(disk_path(caption), key(caption), emb, "lora-train text cache");
  if (options_.in_memory) memory_[caption] = emb;
  return emb;
}

CacheStats TextEmbeddingCache::build(const std::vector<std::string>& captions,
                                     const TextEncoder& encoder) {
  CacheStats stats;
  std::set<std::string> seen;
  for (const std::string& c : captions) {
    if (!seen.insert(c).second) continue;
    if (memory_.count(c)) {
      ++stats.in_memory;
      continue;
    }
    TextEmbedding emb;
    bool stale = false;
    if (try_load(c, &emb, &stale)) {
      ++stats.from_disk;
      if (options_.in_memory) memory_[c] = std::move(emb);
      continue;
    }
    if (stale) ++stats.rebuilt;
    encode_and_store(c, encoder, &stats);
  }
  return stats;
}

bool TextEmbeddingCache::contains(const std::string& caption) const {
  if (memory_.count(caption)) return true;
  TextEmbedding emb;
  bool stale = false;
  return try_load(caption, &emb, &stale);
}

TextEmbedding TextEmbeddingCache::get(const std::string& caption) const {
  auto it = memory_.find(caption);
  if (it != memory_.end()) return it->second;
  TextEmbedding emb;
  bool stale = false;
  if (try_load(caption, &emb, &stale)) return emb;
  throw Error(ExitCode::kRuntime, "text-embedding cache: caption not cached: \"" + caption + "\"");
}

TextEmbedding TextEmbeddingCache::get_or_encode(const std::string& caption,
                                                const TextEncoder& encoder) {
  auto it = memory_.find(caption);
  if (it != memory_.end()) return it->second;
  TextEmbedding emb;
  bool stale = false;
  if (try_load(caption, &emb, &stale)) {
    if (options_.in_memory) memory_[caption] = emb;
    return emb;
  }
  return encode_and_store(caption, encoder, nullptr);
}

TextEmbedding TextEmbeddingCache::batch(const std::vector<std::string>& captions,
                                        const TextEncoder& encoder) {
  if (captions.empty()) throw Error(ExitCode::kRuntime, "text-embedding batch: no captions");
  std::vector<TextEmbedding> rows;
  rows.reserve(captions.size());
  for (const std::string& c : captions) rows.push_back(get_or_encode(c, encoder));
  TextEmbedding out;
  for (size_t n = 0; n < rows.front().size(); ++n) {
    const std::string& name = rows.front()[n].first;
    std::vector<at::Tensor> parts;
    for (const TextEmbedding& r : rows) {
      if (r.size() != rows.front().size() || r[n].first != name)
        throw Error(ExitCode::kRuntime, "text-embedding batch: captions have different tensors");
      parts.push_back(r[n].second);
    }
    out.emplace_back(name, torch::stack(parts));  // [B, ...]
  }
  return out;
}

}  // namespace lt::data
