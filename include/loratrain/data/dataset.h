// An image folder with caption sidecars, as AI Toolkit and kohya read one: every .jpg, .jpeg,
// .png, .webp and .bmp under the folder (recursively; hidden files and folders, and AI Toolkit's
// `_controls`, `_latent_cache` and `_t_e_cache` folders, are skipped), each with an optional
// `<stem><caption_ext>` caption. Defined on a plain options struct so it does not depend on the
// config library; the trainer maps its dataset config onto DatasetOptions.
//
// With num_frames > 1 it is a video dataset (AI Toolkit's rule): clips (.mp4, .webm, .mov, .mkv,
// .avi, .m4v, .wmv, .flv, .gif and animated .webp) and images, an image being a clip of one frame.
// Frames are picked as AI Toolkit's load_and_process_video does (sample_frame_indices) and each is
// resized and cropped exactly as an image of the same size would be.
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
  // Decode every image (and every frame of every clip) while scanning, so a corrupt or truncated
  // file is reported and skipped at start rather than failing mid-run. Off: only headers are read
  // (clips: packets are counted).
  bool verify_images = true;
  // Video (AI Toolkit's dataset keys): num_frames > 1 makes a video dataset.
  int num_frames = 1;
  bool shrink_video_to_frames = true;  // num_frames evenly spaced over the whole clip
  int fps = 24;                        // otherwise a window of num_frames frames at this rate
  uint64_t seed = 42;                  // draws each clip's window start (not shrinking)
};

// What a record is: a still image, a clip FFmpeg decodes, or an animated WebP (libwebp).
enum class MediaKind { image, video, animated_webp };

struct ImageRecord {
  std::filesystem::path path;
  int width = 0;  // after EXIF orientation
  int height = 0;
  std::string raw_caption;        // the sidecar's text (trimmed), or the default caption, or ""
  bool has_caption_file = false;
  std::string content_hash;       // 16 hex digits of the file's bytes (cache keys)
  MediaKind kind = MediaKind::image;
  int frame_count = 1;  // frames in the clip (1 for an image)
  double fps = 0.0;     // the clip's frame rate (0: an image, or the file does not say)
  bool is_clip() const { return kind != MediaKind::image; }
};

// The 0-based frames of a clip of `total_frames` frames at `clip_fps` that make `num_frames`
// training frames, as AI Toolkit picks them (dataloader_mixins.py load_and_process_video):
// - shrink_video_to_frames, or a clip shorter than num_frames: round(i * (total - 1) /
//   (num_frames - 1)) for i < num_frames, evenly over the whole clip (a short clip is stretched:
//   frames repeat);
// - otherwise every k-th frame, k = max(1, round(clip_fps / fps)), from a start drawn uniformly
//   in [0, total - 1 - (num_frames - 1) * k] by `draw` (any 64-bit value); when the clip holds
//   fewer than num_frames such frames, the even spread above.
// Rounding is half-to-even, as Python's round(). num_frames 1 gives {0}.
std::vector<int> sample_frame_indices(int total_frames, double clip_fps, int num_frames,
                                      bool shrink_video_to_frames, int fps, uint64_t draw);

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

  // num_frames > 1 (a video dataset: clips are picked up, images are one-frame clips).
  bool is_video() const { return options_.num_frames > 1; }

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
  // On a clip, both give its first frame.
  at::Tensor load_tensor(size_t index, const Placement& placement, bool flip_x) const;

  // The frames of record `index` that train as `num_frames` frames (sample_frame_indices with the
  // dataset's shrink/fps and a window start fixed per clip by the seed and the clip's content, so
  // that a cached latent and a fresh load agree); {0} for an image.
  std::vector<int> clip_frame_indices(size_t index, int num_frames) const;
  // Those frames decoded in one pass, each resized, mirrored and cropped as load_image does.
  std::vector<io::Image> load_clip(size_t index, const Placement& placement, bool flip_x, int num_frames) const;
  // The same as a [3, F, H, W] float32 tensor in [-1, 1]; an image gives [3, 1, H, W]. Throws
  // lt::InputError naming the file when it can no longer be decoded.
  at::Tensor load_clip_tensor(size_t index, const Placement& placement, bool flip_x, int num_frames) const;

 private:
  void scan();
  // Resize to the placement's scale, mirror, crop: one frame of `rec`.
  static io::Image place_frame(io::Image image, const ImageRecord& rec, const Placement& placement, bool flip_x);
  void warn(const std::string& message);

  DatasetOptions options_;
  std::vector<ImageRecord> images_;
  std::vector<std::string> warnings_;
};

// Image file extensions the dataset picks up (lower case, with the dot).
const std::vector<std::string>& dataset_image_extensions();
// Clip extensions a video dataset picks up besides the images (.webp is an image extension; an
// animated one is a clip).
const std::vector<std::string>& dataset_video_extensions();

}  // namespace lt::data
