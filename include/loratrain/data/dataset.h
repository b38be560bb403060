// An image folder with caption sidecars, as AI Toolkit and kohya read one: every .jpg, .jpeg,
// .png, .webp and .bmp under the folder (recursively; hidden files and folders, and AI Toolkit's
// `_controls`, `_latent_cache` and `_t_e_cache` folders, are skipped), each with an optional
// `<stem><caption_ext>` caption. Defined on a plain options struct so it does not depend on the
// config library; the trainer maps its dataset config onto DatasetOptions.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/data/buckets.h"
#include "loratrain/data/captions.h"
#include "loratrain/io/image.h"

namespace lt::data {

struct DatasetOptions {
  std::filesystem::path folder_path;
  std::string caption_ext = ".txt";           // a leading dot is added when missing
  std::optional<std::string> default_caption;  // for images without (or with an empty) caption
  std::string trigger_word;
  double caption_dropout_rate = 0.0;
  double token_dropout_rate = 0.0;
  bool shuffle_tokens = false;
  int keep_tokens = 0;
  int num_repeats = 1;
  bool flip_x = false;  // AI Toolkit: adds a mirrored copy of every image (doubles the epoch)
  // Decode every image while scanning, so a corrupt or truncated file is reported and skipped at
  // start rather than failing mid-run. Off: only headers are read.
  bool verify_images = true;
};

struct ImageRecord {
  std::filesystem::path path;
  int width = 0;  // after EXIF orientation
  int height = 0;
  std::string raw_caption;        // the sidecar's text (trimmed), or the default caption, or ""
  bool has_caption_file = false;
  std::string content_hash;       // 16 hex digits of the file's bytes (cache keys)
};

class Dataset {
 public:
  // Scans the folder. Bad images are named in one spdlog warning each and skipped; captions
  // without an image get one warning listing them. Throws lt::InputError when the folder does not
  // exist or is not a folder, when an option is out of range, and when no usable image is left
  // (the message names the folder and what was skipped).
  explicit Dataset(DatasetOptions options);

  const DatasetOptions& options() const { return options_; }
  const std::vector<ImageRecord>& images() const { return images_; }
  size_t size() const { return images_.size(); }
  // Every warning emitted while scanning, in order (also logged through spdlog).
  const std::vector<std::string>& warnings() const { return warnings_; }

  std::vector<ImageShape> shapes() const;
  BucketPlan make_plan(const BucketOptions& options) const;  // with num_repeats and flip_x

  CaptionOptions caption_options() const;
  // The caption for one use of image `index`, with dropout/shuffle drawn from `rng`.
  std::string caption(size_t index, Rng& rng) const;
  // The captions the dataset can produce when none of its processing is random (for caching text
  // embeddings up front): every image's caption, plus "" when caption dropout is on. nullopt when
  // tag shuffling or token dropout make captions vary.
  std::optional<std::vector<std::string>> fixed_captions() const;

  // Decodes the image, resizes it once straight to the placement's scale_to size (the full-size
  // pixels are freed at once), mirrors it when `flip_x`, and crops to the bucket. Throws
  // lt::InputError naming the file when it can no longer be read or decoded.
  io::Image load_image(size_t index, const Placement& placement, bool flip_x) const;
  // The same as a [3, H, W] float32 tensor in [-1, 1].
  at::Tensor load_tensor(size_t index, const Placement& placement, bool flip_x) const;

 private:
  void scan();
  void warn(const std::string& message);

  DatasetOptions options_;
  std::vector<ImageRecord> images_;
  std::vector<std::string> warnings_;
};

// Image file extensions the dataset picks up (lower case, with the dot).
const std::vector<std::string>& dataset_image_extensions();

}  // namespace lt::data
