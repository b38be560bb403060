#include "loratrain/data/dataset.h"

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <thread>
#include <map>
#include <set>

#include "loratrain/data/rng.h"
#include "loratrain/io/video.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::data {

namespace fs = std::filesystem;

const std::vector<std::string>& dataset_image_extensions() {
  static const std::vector<std::string> exts = {".jpg", ".jpeg", ".png", ".webp", ".bmp"};
  return exts;
}

// AI Toolkit's video extensions (data_loader.py), plus the animated formats FFmpeg reads (.gif)
// and libwebp reads (animated .webp, listed with the images).
const std::vector<std::string>& dataset_video_extensions() {
  static const std::vector<std::string> exts = {".mp4", ".webm", ".mov", ".mkv", ".avi",
                                                ".m4v", ".wmv", ".flv", ".gif"};
  return exts;
}

namespace {

bool has_ext(const fs::path& p, const std::vector<std::string>& exts) {
  const std::string ext = to_lower(p.extension().string());
  return std::find(exts.begin(), exts.end(), ext) != exts.end();
}
bool is_image_ext(const fs::path& p) { return has_ext(p, dataset_image_extensions()); }
bool is_video_ext(const fs::path& p) { return has_ext(p, dataset_video_extensions()); }

// Python's round(): half to even (the default floating-point rounding mode).
int round_half_even(double x) { return static_cast<int>(std::nearbyint(x)); }

// Folders AI Toolkit keeps beside the images: control images and its caches.
bool is_skipped_dir(const std::string& name) {
  return name == "_controls" || name == "_latent_cache" || name == "_t_e_cache";
}

std::string list_some(const std::vector<std::string>& items, size_t max_items = 10) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < max_items; ++i) {
    if (i) out += ", ";
    out += items[i];
  }
  if (items.size() > max_items) out += ", ... (" + std::to_string(items.size() - max_items) + " more)";
  return out;
}

}  // namespace

Dataset::Dataset(DatasetOptions options) : options_(std::move(options)) {
  if (options_.caption_ext.empty()) options_.caption_ext = ".txt";
  if (options_.caption_ext[0] != '.') options_.caption_ext = "." + options_.caption_ext;
  auto rate_ok = [](double r) { return r >= 0.0 && r <= 1.0; };
  if (!rate_ok(options_.caption_dropout_rate))
    throw InputError("caption_dropout_rate must be between 0 and 1, got " +
                     std::to_string(options_.caption_dropout_rate));
  if (!rate_ok(options_.token_dropout_rate))
    throw InputError("token_dropout_rate must be between 0 and 1, got " +
                     std::to_string(options_.token_dropout_rate));
  if (options_.keep_tokens < 0)
    throw InputError("keep_tokens must not be negative, got " + std::to_string(options_.keep_tokens));
  if (options_.num_repeats < 1)
    throw InputError("num_repeats must be at least 1, got " + std::to_string(options_.num_repeats));
  if (options_.num_frames < 1)
    throw InputError("num_frames must be at least 1, got " + std::to_string(options_.num_frames));
  if (options_.fps < 1) throw InputError("fps must be at least 1, got " + std::to_string(options_.fps));
  scan();
}

void Dataset::warn(const std::string& message) {
  spdlog::warn("{}", message);
  warnings_.push_back(message);
}

void Dataset::scan() {
  const fs::path& root = options_.folder_path;
  std::error_code ec;
  if (root.empty()) throw InputError("dataset: no folder_path given");
  if (!fs::exists(root, ec)) throw InputError("dataset folder not found: " + root.string());
  if (!fs::is_directory(root, ec))
    throw InputError("dataset folder_path is not a folder: " + root.string());

  std::vector<fs::path> image_files;
  std::vector<fs::path> caption_files;
  const std::string caption_ext = to_lower(options_.caption_ext);
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec);
  if (ec) throw InputError("dataset folder cannot be read: " + root.string() + ": " + ec.message());
  for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) {
      warn("dataset: cannot list part of " + root.string() + ": " + ec.message());
      ec.clear();
      continue;
    }
    const fs::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    std::error_code dec;
    const bool is_dir = entry.is_directory(dec);
    if (!name.empty() && name[0] == '.') {
      if (is_dir) it.disable_recursion_pending();
      continue;
    }
    if (is_dir) {
      if (is_skipped_dir(name)) it.disable_recursion_pending();
      continue;
    }
    // Broken links and special files are kept as candidates so reading them reports why.
    if (is_image_ext(entry.path()) || (is_video() && is_video_ext(entry.path()))) {
      image_files.push_back(entry.path());
    } else if (to_lower(entry.path().extension().string()) == caption_ext) {
      caption_files.push_back(entry.path());
    }
  }
  std::sort(image_files.begin(), image_files.end());
  std::sort(caption_files.begin(), caption_files.end());

  // Reading and verifying is the slow part (a full decode per image), so files are spread over
  // worker threads; results and warnings are then taken in sorted file order (deterministic).
  struct Scanned {
    std::optional<ImageRecord> record;
    std::string error;          // why the image is skipped
    std::string caption_error;  // why its caption is not used
  };
  std::vector<Scanned> scanned(image_files.size());
  auto scan_one = [&](size_t i) {
    const fs::path& path = image_files[i];
    ImageRecord rec;
    rec.path = path;
    try {
      const std::string bytes = io::read_file_bytes(path);
      rec.content_hash = Fnv64().update(bytes).hex();
      const bool clip = is_video() && (is_video_ext(path) || io::is_animated_webp(bytes));
      if (clip) {
        rec.kind = is_video_ext(path) ? MediaKind::video : MediaKind::animated_webp;
        if (bytes.empty()) throw InputError(path.string() + ": empty file (0 bytes)");
        const io::VideoInfo info = io::probe_video(path, options_.verify_images);
        rec.width = info.width;
        rec.height = info.height;
        rec.frame_count = info.frame_count;
        rec.fps = info.fps;
      } else if (options_.verify_images) {
        io::Image image = io::decode_image(bytes, path.string());
        rec.width = image.width;
        rec.height = image.height;
      } else {
        io::ImageSize size = io::probe_image_size(bytes, path.string());
        rec.width = size.width;
        rec.height = size.height;
      }
    } catch (const InputError& e) {
      scanned[i].error = e.what();
      return;
    }
    std::error_code cec;
    fs::path caption_path = fs::path(path).replace_extension(options_.caption_ext);
    if (fs::exists(caption_path, cec) && !fs::is_directory(caption_path, cec)) {
      try {
        rec.raw_caption = trim(io::read_file_bytes(caption_path));
        rec.has_caption_file = true;
      } catch (const InputError& e) {
        scanned[i].caption_error = e.what();
      }
    }
    if (rec.raw_caption.empty() && options_.default_caption) rec.raw_caption = *options_.default_caption;
    scanned[i].record = std::move(rec);
  };
  const size_t workers = std::min<size_t>(
      {std::max(1u, std::thread::hardware_concurrency()), 8, (image_files.size() + 3) / 4});
  if (workers <= 1) {
    for (size_t i = 0; i < image_files.size(); ++i) scan_one(i);
  } else {
    std::atomic<size_t> next{0};
    std::vector<std::thread> pool;
    for (size_t w = 0; w < workers; ++w)
      pool.emplace_back([&] {
        for (size_t i = next++; i < image_files.size(); i = next++) scan_one(i);
      });
    for (auto& t : pool) t.join();
  }

  std::vector<std::string> skipped;
  std::set<fs::path> image_stems;
  for (size_t i = 0; i < image_files.size(); ++i) {
    image_stems.insert(fs::path(image_files[i]).replace_extension());
    Scanned& s = scanned[i];
    if (!s.record) {
      const bool clip = is_video() && is_video_ext(image_files[i]);
      warn(std::string(clip ? "skipping clip " : "skipping image ") + s.error);
      skipped.push_back(s.error);
      continue;
    }
    if (!s.caption_error.empty()) warn("caption not used: " + s.caption_error);
    images_.push_back(std::move(*s.record));
  }

  std::vector<std::string> orphans;
  for (const fs::path& c : caption_files)
    if (!image_stems.count(fs::path(c).replace_extension()))
      orphans.push_back(fs::relative(c, root, ec).string());
  if (!orphans.empty() && !(image_files.empty() && images_.empty())) {
    warn(std::to_string(orphans.size()) + " caption file" + (orphans.size() == 1 ? "" : "s") +
         " in " + root.string() + " ha" + (orphans.size() == 1 ? "s" : "ve") +
         " no matching image and " + (orphans.size() == 1 ? "is" : "are") +
         " ignored: " + list_some(orphans));
  }

  if (images_.empty()) {
    std::string exts;
    for (const auto& e : dataset_image_extensions()) exts += (exts.empty() ? "" : ", ") + e;
    if (is_video())
      for (const auto& e : dataset_video_extensions()) exts += ", " + e;
    if (image_files.empty()) {
      std::string msg = "dataset folder " + root.string() + " contains no " +
                        (is_video() ? "clips or images" : "images") + " (looked for " + exts + ")";
      if (!orphans.empty())
        msg += "; it has " + std::to_string(orphans.size()) + " caption file" +
               (orphans.size() == 1 ? "" : "s") + " without images: " + list_some(orphans, 5);
      throw InputError(msg);
    }
    throw InputError("dataset folder " + root.string() + " has no usable " +
                     (is_video() ? "clips or images" : "images") + ": all " +
                     std::to_string(image_files.size()) + (is_video() ? " file" : " image file") +
                     (image_files.size() == 1 ? " was" : "s were") +
                     " skipped: " + list_some(skipped, 5));
  }
  std::vector<std::string> clamped;
  for (const ImageRecord& r : images_) {
    if (!aspect_clamped(r.width, r.height)) continue;
    const Size kept = clamp_aspect(r.width, r.height);
    clamped.push_back(printable(fs::relative(r.path, root, ec).string()) + " (" + std::to_string(r.width) + "x" +
                      std::to_string(r.height) + ", trained as its centre " + std::to_string(kept.width) + "x" +
                      std::to_string(kept.height) + ")");
  }
  if (!clamped.empty()) {
    warn(std::to_string(clamped.size()) + " image" + (clamped.size() == 1 ? " is" : "s are") +
         " longer than 4:1, the widest bucket aspect ratio: " + list_some(clamped));
  }
  if (is_video()) {
    // AI Toolkit stretches a clip too short for num_frames (its frames repeat) rather than
    // dropping it; so does this, saying which clips it stretches.
    std::vector<std::string> stretched;
    for (const ImageRecord& r : images_) {
      if (!r.is_clip()) continue;
      const std::vector<int> idx = sample_frame_indices(r.frame_count, r.fps, options_.num_frames,
                                                        options_.shrink_video_to_frames, options_.fps, 0);
      if (std::adjacent_find(idx.begin(), idx.end()) == idx.end()) continue;
      stretched.push_back(printable(fs::relative(r.path, root, ec).string()) + " (" +
                          std::to_string(r.frame_count) + " frames)");
    }
    if (!stretched.empty())
      warn(std::to_string(stretched.size()) + " clip" + (stretched.size() == 1 ? " has" : "s have") +
           " fewer frames than num_frames " + std::to_string(options_.num_frames) +
           (options_.shrink_video_to_frames ? "" : " at fps " + std::to_string(options_.fps)) +
           " and " + (stretched.size() == 1 ? "is" : "are") +
           " stretched over them (frames repeat, as AI Toolkit does): " + list_some(stretched));
    const size_t clips = static_cast<size_t>(
        std::count_if(images_.begin(), images_.end(), [](const ImageRecord& r) { return r.is_clip(); }));
    const size_t stills = images_.size() - clips;
    spdlog::info("Dataset {}: {} clip{} and {} image{}, {} frames per clip{}", root.string(), clips,
                 clips == 1 ? "" : "s", stills, stills == 1 ? "" : "s", options_.num_frames,
                 skipped.empty() ? std::string() : fmt::format(" ({} skipped)", skipped.size()));
    return;
  }
  spdlog::info("Dataset {}: {} images{}", root.string(), images_.size(),
               skipped.empty() ? std::string() : fmt::format(" ({} skipped)", skipped.size()));
}

std::vector<ImageShape> Dataset::shapes() const {
  std::vector<ImageShape> out;
  out.reserve(images_.size());
  for (const ImageRecord& r : images_) out.push_back({r.width, r.height, r.path.string(), r.is_clip()});
  return out;
}

BucketPlan Dataset::make_plan(const BucketOptions& options) const {
  return BucketPlan::build(shapes(), options, options_.num_repeats, options_.flip_x);
}

CaptionOptions Dataset::caption_options() const {
  CaptionOptions c;
  c.trigger_word = options_.trigger_word;
  c.caption_dropout_rate = options_.caption_dropout_rate;
  c.token_dropout_rate = options_.token_dropout_rate;
  c.shuffle_tokens = options_.shuffle_tokens;
  c.keep_tokens = options_.keep_tokens;
  return c;
}

std::string Dataset::caption(size_t index, Rng& rng) const {
  return process_caption(images_.at(index).raw_caption, caption_options(), rng);
}

std::optional<std::vector<std::string>> Dataset::fixed_captions() const {
  CaptionOptions c = caption_options();
  if (c.shuffle_tokens || c.token_dropout_rate > 0.0) return std::nullopt;
  const double dropout = c.caption_dropout_rate;
  c.caption_dropout_rate = 0.0;
  std::vector<std::string> out;
  std::set<std::string> seen;
  Rng unused(0);
  for (const ImageRecord& r : images_) {
    std::string cap = process_caption(r.raw_caption, c, unused);
    if (seen.insert(cap).second) out.push_back(std::move(cap));
  }
  if (dropout > 0.0 && seen.insert("").second) out.emplace_back();
  return out;
}

io::Image Dataset::load_image(size_t index, const Placement& p, bool flip_x) const {
  const ImageRecord& rec = images_.at(index);
  io::Image image = rec.is_clip() ? std::move(io::read_video_frames(rec.path, {0}).front()) : io::read_image(rec.path);
  return place_frame(std::move(image), rec, p, flip_x);
}

io::Image Dataset::place_frame(io::Image image, const ImageRecord& rec, const Placement& p, bool flip_x) {
  if (image.width != p.scale_to_width || image.height != p.scale_to_height)
    image = io::resize(image, p.scale_to_width, p.scale_to_height, io::ResizeFilter::Bicubic);
  // AI Toolkit mirrors before cropping, so an odd excess is cut on the same side of the content.
  if (flip_x) image = io::flip_horizontal(image);
  if (p.crop_x + p.crop_width > image.width || p.crop_y + p.crop_height > image.height)
    throw Error(ExitCode::kRuntime, rec.path.string() + ": crop rectangle outside the resized image");
  if (p.crop_x != 0 || p.crop_y != 0 || p.crop_width != image.width || p.crop_height != image.height)
    image = io::crop(image, p.crop_x, p.crop_y, p.crop_width, p.crop_height);
  return image;
}

at::Tensor Dataset::load_tensor(size_t index, const Placement& p, bool flip_x) const {
  return io::image_to_tensor(load_image(index, p, flip_x));
}

std::vector<int> sample_frame_indices(int total_frames, double clip_fps, int num_frames,
                                      bool shrink_video_to_frames, int fps, uint64_t draw) {
  if (total_frames < 1 || num_frames < 1)
    throw Error(ExitCode::kRuntime, "sample_frame_indices: " + std::to_string(total_frames) + " frames, num_frames " +
                                        std::to_string(num_frames));
  const int max_index = total_frames - 1;
  auto spread = [&] {
    std::vector<int> out(num_frames, 0);
    const double interval = num_frames > 1 ? static_cast<double>(max_index) / (num_frames - 1) : 0.0;
    for (int i = 0; i < num_frames; ++i) out[i] = std::min(round_half_even(i * interval), max_index);
    return out;
  };
  if (shrink_video_to_frames || total_frames < num_frames) return spread();
  // A file without a frame rate is taken to be at the requested one (every frame).
  const double ratio = clip_fps > 0 && fps > 0 ? clip_fps / fps : 1.0;
  const int step = std::max(1, round_half_even(ratio));
  if (total_frames / step < num_frames) return spread();
  const int max_start = max_index - (num_frames - 1) * step;
  const int start = max_start > 0 ? static_cast<int>(splitmix64(draw) % static_cast<uint64_t>(max_start + 1)) : 0;
  std::vector<int> out(num_frames);
  for (int i = 0; i < num_frames; ++i) out[i] = std::min(start + i * step, max_index);
  return out;
}

std::vector<int> Dataset::clip_frame_indices(size_t index, int num_frames) const {
  const ImageRecord& rec = images_.at(index);
  if (!rec.is_clip()) return {0};
  uint64_t content = 0;
  for (char c : rec.content_hash) content = content * 31 + static_cast<unsigned char>(c);
  return sample_frame_indices(rec.frame_count, rec.fps, num_frames, options_.shrink_video_to_frames, options_.fps,
                              mix_seed({options_.seed, content}));
}

std::vector<io::Image> Dataset::load_clip(size_t index, const Placement& p, bool flip_x, int num_frames) const {
  if (num_frames < 1) throw Error(ExitCode::kRuntime, "load_clip: num_frames must be at least 1");
  const ImageRecord& rec = images_.at(index);
  if (!rec.is_clip()) return {load_image(index, p, flip_x)};
  const std::vector<int> indices = clip_frame_indices(index, num_frames);
  // A stretched clip repeats frames: each distinct one is decoded and placed once.
  std::vector<int> distinct = indices;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::vector<io::Image> decoded = io::read_video_frames(rec.path, distinct);
  std::map<int, io::Image> placed;
  for (size_t i = 0; i < distinct.size(); ++i) placed[distinct[i]] = place_frame(std::move(decoded[i]), rec, p, flip_x);
  std::vector<io::Image> frames;
  frames.reserve(indices.size());
  for (int i : indices) frames.push_back(placed.at(i));
  return frames;
}

at::Tensor Dataset::load_clip_tensor(size_t index, const Placement& p, bool flip_x, int num_frames) const {
  return io::frames_to_video_tensor(load_clip(index, p, flip_x, num_frames));  // [3, F, H, W]
}

}  // namespace lt::data
