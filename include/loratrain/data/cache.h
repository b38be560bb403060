// Latent and text-embedding caches, in memory and/or on disk (`cache_latents`,
// `cache_latents_to_disk`, `cache_text_embeddings`). The encoders come in as std::function, so
// this library does not depend on the models.
//
// Disk layout follows AI Toolkit (dataloader_mixins.py LatentCachingFileItemDTOMixin):
//   <image folder>/_latent_cache/<image stem>_<key hash>.safetensors   tensor "latent" [C, h, w]
//   <dataset folder>/_t_e_cache/<key hash>.safetensors                  the named embeddings
// Unlike AI Toolkit, whose key is the file name and crop, the key here covers the image's bytes,
// the resize/crop, the flip and the model identity, so an edited image, a new resolution or a
// different VAE/text encoder gets a new file instead of a stale latent. Each file stores its full
// key in the metadata; a file whose key does not match, or that cannot be read, is rebuilt.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/data/batches.h"
#include "loratrain/data/buckets.h"
#include "loratrain/data/dataset.h"

namespace lt::data {

struct CacheOptions {
  bool in_memory = true;  // keep tensors in RAM (cache_latents / cache_text_embeddings)
  bool to_disk = false;   // write/read safetensors files (cache_latents_to_disk)
  // Identifies the encoder: model family, VAE/text-encoder file and dtype, e.g.
  // "sd15|vae=<sha or path+size>|fp32". A different string invalidates every cached tensor.
  std::string model_id;
  // Frames per clip the latents are made of, for a video dataset (0 = the dataset's num_frames);
  // part of every clip's key together with the frame sampling, so a changed num_frames, fps or
  // shrink_video_to_frames misses the cache. Ignored for image datasets (their keys are unchanged).
  int num_frames = 0;
};

struct CacheStats {
  size_t encoded = 0;    // computed by the encoder this time
  size_t from_disk = 0;  // valid files reused
  size_t in_memory = 0;  // already in memory
  size_t rebuilt = 0;    // disk files that existed but were stale or unreadable (also in encoded)
};

// pixels [1, 3, H, W] float32 in [-1, 1] -> latent [1, C, H/f, W/f] (or [C, h, w]); any device
// and dtype (stored on CPU as returned). For a video dataset the pixels are [1, 3, F, H, W]
// (Dataset::load_clip_tensor; F = 1 for an image) and the latent [1, C, f, h, w] or [C, f, h, w].
using LatentEncoder = std::function<at::Tensor(const at::Tensor& pixels)>;

class LatentCache {
 public:
  // `dataset` must outlive the cache. Throws lt::InputError when neither in_memory nor to_disk.
  LatentCache(const Dataset& dataset, CacheOptions options);

  // The cache key of one sample (human-readable; the file name uses its hash).
  std::string key(size_t image, const Placement& placement, bool flip_x) const;
  std::filesystem::path disk_path(size_t image, const Placement& placement, bool flip_x) const;

  // Makes sure every distinct (image, placement, flip) of the plan is cached: reuses memory, then
  // valid disk files, and encodes the rest one image at a time. `progress(done, total)` is called
  // after each sample.
  CacheStats build(const BucketPlan& plan, const LatentEncoder& encoder,
                   const std::function<void(size_t, size_t)>& progress = {});

  bool contains(size_t image, const Placement& placement, bool flip_x) const;
  // [C, h, w] on CPU. Throws lt::Error when the sample was never built.
  at::Tensor get(size_t image, const Placement& placement, bool flip_x) const;
  at::Tensor get(const BatchItem& item) const { return get(item.image, item.placement, item.flip_x); }
  // [B, C, h, w] for a batch.
  at::Tensor batch(const Batch& batch) const;

  size_t memory_entries() const { return memory_.size(); }
  void clear_memory() { memory_.clear(); }

  // Frames per clip from now on (the OOM guard lowering num_frames); build() again afterwards.
  void set_num_frames(int num_frames);
  int num_frames() const;  // the effective value (the dataset's when options say 0)

 private:
  at::Tensor load_pixels(size_t image, const Placement& placement, bool flip_x) const;

  const Dataset* dataset_;
  CacheOptions options_;
  std::map<std::string, at::Tensor> memory_;  // by key
};

// Named embedding tensors of one caption, e.g. {"hidden_states": [77, 768]} for CLIP-L, plus
// {"pooled": [1280]} for SDXL's second encoder. Stored on CPU without a batch dimension.
using TextEmbedding = std::vector<std::pair<std::string, at::Tensor>>;
// caption -> embeddings; a leading batch dimension of 1 is removed when present.
using TextEncoder = std::function<TextEmbedding(const std::string& caption)>;

class TextEmbeddingCache {
 public:
  // `disk_dir` is the folder for `_t_e_cache` files (normally <dataset folder>/_t_e_cache); only
  // used with to_disk. Throws lt::InputError when neither in_memory nor to_disk.
  TextEmbeddingCache(std::filesystem::path disk_dir, CacheOptions options);

  std::string key(const std::string& caption) const;
  std::filesystem::path disk_path(const std::string& caption) const;

  CacheStats build(const std::vector<std::string>& captions, const TextEncoder& encoder);
  bool contains(const std::string& caption) const;
  // Throws lt::Error when the caption was never built.
  TextEmbedding get(const std::string& caption) const;
  // get(), or encode now and store (captions made on the fly by shuffling or dropout).
  TextEmbedding get_or_encode(const std::string& caption, const TextEncoder& encoder);
  // One caption's embeddings per row, stacked to [B, ...] by name (all captions must have the
  // same names and shapes).
  TextEmbedding batch(const std::vector<std::string>& captions, const TextEncoder& encoder);

  size_t memory_entries() const { return memory_.size(); }
  void clear_memory() { memory_.clear(); }

 private:
  TextEmbedding encode_and_store(const std::string& caption, const TextEncoder& encoder,
                                 CacheStats* stats);
  bool try_load(const std::string& caption, TextEmbedding* out, bool* stale) const;

  std::filesystem::path dir_;
  CacheOptions options_;
  std::map<std::string, TextEmbedding> memory_;  // by caption
};

}  // namespace lt::data
