// Resolution buckets: which training size each image gets, and how it is scaled and cropped.
//
// AI Toolkit style (default; toolkit/buckets.py get_bucket_for_image_size and
// dataloader_mixins.py BucketsMixin.setup_buckets):
//   - every entry of `resolution: [512, 768, 1024]` is its own bucket set (the dataset is copied
//     once per resolution, data_loader.py preprocess_dataset_raw_config);
//   - target pixels = min(image pixels, resolution^2): never upscaled into a resolution;
//   - width and height scaled by sqrt(target / pixels), then the four floor/ceil multiples of the
//     divisibility that stay within resolution^2 are candidates; the one whose area is closest to
//     the target wins (first in floor/floor, floor/ceil, ceil/floor, ceil/ceil order on ties);
//   - the image is scaled (ceil) to cover the bucket and centre-cropped to it.
//   One deviation: an image beyond 4:1 is bucketed as its centre 4:1 part (clamp_aspect), so an
//   8x4000 strip gets a narrow bucket of at most resolution^2 pixels, not a 16x1424 one that the
//   reference's fallback makes (and the bucket area never exceeds resolution^2).
//   Divisibility is the model's (SD/SDXL 16 = VAE 8 x 2, Flux 32), not a user setting.
//   `buckets: false`: scale the short side to the resolution and centre-crop a square.
//
// kohya style (sd-scripts model_util.make_bucket_resolutions, train_util.BucketManager):
//   predefined buckets from max area resolution^2, min_bucket_reso, max_bucket_reso and
//   bucket_reso_steps, chosen by nearest aspect ratio (images are scaled to cover, upscaling
//   allowed), or with bucket_no_upscale an image-specific bucket at most the image's size.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lt::data {

struct Size {
  int width = 0;
  int height = 0;
  bool operator==(const Size& o) const { return width == o.width && height == o.height; }
  bool operator!=(const Size& o) const { return !(*this == o); }
  bool operator<(const Size& o) const {
    return width != o.width ? width < o.width : height < o.height;
  }
};

// How a source image becomes a bucket-sized training image: resize to scale_to, then crop.
struct Placement {
  int scale_to_width = 0;
  int scale_to_height = 0;
  int crop_x = 0;
  int crop_y = 0;
  int crop_width = 0;
  int crop_height = 0;
  Size bucket() const { return {crop_width, crop_height}; }
  bool operator==(const Placement& o) const;
};

// ---- AI Toolkit ---------------------------------------------------------------------------------

// The longest side of a bucket is at most 4x its shortest: kohya's default buckets (256..1024 at
// 512) and AI Toolkit's SDXL table (2048x512 .. 512x2048) stop there too. A longer image trains on
// its centre crop of this ratio.
inline constexpr double kMaxBucketAspect = 4.0;
// The centre part of a width x height image that buckets use: the image itself up to 4:1.
Size clamp_aspect(int width, int height);
bool aspect_clamped(int width, int height);

// The bucket for a width x height image at `resolution` (see above).
Size aitk_bucket_for_image(int width, int height, int resolution, int divisibility);
// Scale to cover `bucket` (ceil of each side), centre crop (floor of half the excess).
Placement aitk_cover_and_crop(int width, int height, Size bucket);
// `buckets: false` / square_crop: the short side scaled to `resolution`, square centre crop.
Placement aitk_square_crop(int width, int height, int resolution);

// ---- kohya sd-scripts ---------------------------------------------------------------------------

// model_util.make_bucket_resolutions: sorted, unique (w, h) pairs.
std::vector<Size> make_bucket_resolutions(Size max_reso, int min_size = 256, int max_size = 1024,
                                          int divisible = 64);

struct KohyaBucketChoice {
  Size bucket;
  Size resized;     // the size the image is resized to before cropping to `bucket`
  double ar_error;  // bucket aspect ratio - image aspect ratio
};
// BucketManager.select_bucket. `predefined` is make_bucket_resolutions' output (unused when
// no_upscale); max_area = resolution^2.
KohyaBucketChoice kohya_select_bucket(int width, int height, const std::vector<Size>& predefined,
                                      bool no_upscale, int64_t max_area, int reso_steps);
// Resize to choice.resized, centre crop (floor of half the excess) to choice.bucket.
Placement kohya_placement(const KohyaBucketChoice& choice);

// ---- A bucket plan over a dataset ---------------------------------------------------------------

enum class BucketStyle { AiToolkit, Kohya };

struct BucketOptions {
  BucketStyle style = BucketStyle::AiToolkit;
  std::vector<int> resolutions{512};  // each its own bucket set; duplicates are removed
  int divisibility = 16;              // AI Toolkit: the model's bucket divisibility
  bool enabled = true;                // AI Toolkit `buckets`; false = square crops
  // kohya
  int min_bucket_reso = 256;
  int max_bucket_reso = 1024;
  int bucket_reso_steps = 64;
  bool bucket_no_upscale = false;
};

// The source images' sizes (after EXIF orientation); `name` is used in messages.
struct ImageShape {
  int width = 0;
  int height = 0;
  std::string name;
  // A video dataset's clip: clips and images (one frame) get separate buckets, so a batch stacks
  // into one [B, 3, F, H, W] (AI Toolkit appends the frame count to the bucket key).
  bool is_clip = false;
};

// One training sample: an image (index into the shapes), at one resolution set, maybe mirrored.
// num_repeats and flip_x make several entries per image, as AI Toolkit's file-list copies do.
struct BucketEntry {
  size_t image = 0;
  bool flip_x = false;
  int resolution = 0;  // the resolution set it belongs to
  Placement placement;
};

struct Bucket {
  int resolution = 0;
  Size size;
  bool is_clip = false;  // holds clips (video dataset) rather than images
  std::vector<size_t> entries;  // indices into BucketPlan::entries(), in dataset order
  std::string key() const;      // "512:512x384" ("512:512x384:clips" for clips)
};

struct HistogramRow {
  int resolution;
  Size size;
  size_t entries;
  bool is_clip = false;
};

// What drop_largest_resolution did.
struct ResolutionDrop {
  int from = 0;              // the resolution set removed
  int to = 0;                // the set its entries joined
  size_t moved_entries = 0;  // every one of them is kept
};

class BucketPlan {
 public:
  BucketPlan() = default;
  // Places every image in every resolution set. Throws lt::InputError when an option is invalid
  // (no resolution, a resolution or divisibility not positive, kohya max_bucket_reso below a
  // resolution) or an image cannot be bucketed (kohya no_upscale with a side under the step).
  static BucketPlan build(const std::vector<ImageShape>& images, const BucketOptions& options,
                          int num_repeats = 1, bool flip_x = false);

  const BucketOptions& options() const { return options_; }
  const std::vector<BucketEntry>& entries() const { return entries_; }
  const std::vector<Bucket>& buckets() const { return buckets_; }  // by resolution, then size
  std::vector<int> resolutions() const;                            // ascending, sets in use
  size_t image_count() const { return image_count_; }

  std::vector<HistogramRow> histogram() const;
  // "Bucket sizes: ...\n  512x512: 10 files\n ... N buckets made", one block per resolution set.
  std::string histogram_text() const;

  // The OOM guard's "remove the largest resolution bucket": every entry of the largest resolution
  // set is placed again at the next smaller set's resolution and joins that set; no image is
  // dropped and the epoch keeps its length. With a single set left, `fallback_resolution` (when
  // positive and smaller) becomes that set's resolution. Returns nullopt when nothing changed.
  std::optional<ResolutionDrop> drop_largest_resolution(int fallback_resolution = 0);

  // Changes whenever the bucket assignment changes (saved with the data position on resume).
  uint64_t fingerprint() const;

 private:
  Placement place(const ImageShape& shape, int resolution) const;
  void rebuild_buckets();

  BucketOptions options_;
  std::vector<ImageShape> shapes_;
  std::vector<BucketEntry> entries_;
  std::vector<Bucket> buckets_;
  size_t image_count_ = 0;
};

}  // namespace lt::data
