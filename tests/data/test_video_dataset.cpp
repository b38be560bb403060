#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>
#include <set>

#include "data_test_util.h"
#include "loratrain/data/batches.h"
#include "loratrain/data/cache.h"
#include "loratrain/data/dataset.h"
#include "loratrain/data/demo_data.h"
#include "loratrain/io/video.h"
#include "loratrain/util/error.h"
#include "test_support.h"

using namespace lt::data;
namespace fs = std::filesystem;

using lt::test::contains;

namespace {

// Frame i of a test clip: flat, its red channel 10 * i + 20, so a decoded frame says which it is.
lt::io::Image numbered_frame(int w, int h, int i) {
  lt::io::Image im(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = im.at(x, y);
      p[0] = static_cast<uint8_t>(20 + 10 * i);
      p[1] = 128;
      p[2] = static_cast<uint8_t>(x < w / 2 ? 40 : 200);  // left/right halves: shows a mirror
    }
  return im;
}

std::vector<lt::io::Image> numbered_clip(int w, int h, int n) {
  std::vector<lt::io::Image> frames;
  for (int i = 0; i < n; ++i) frames.push_back(numbered_frame(w, h, i));
  return frames;
}

// The frame number a decoded [3, F, H, W] tensor's frame f shows (from its mean red value).
int frame_number(const at::Tensor& clip, int64_t f) {
  const double red = (clip[0][f].mean().item<double>() + 1.0) * 127.5;
  return static_cast<int>(std::lround((red - 20.0) / 10.0));
}

std::string clip_ext() { return lt::io::video_encoder_for(".webm").empty() ? ".avi" : ".webm"; }

DatasetOptions video_options(const fs::path& dir, int num_frames) {
  DatasetOptions o;
  o.folder_path = dir;
  o.num_frames = num_frames;
  return o;
}

}  // namespace

CATCH_TEST_CASE("frame sampling follows AI Toolkit", "[data][video]") {
  // shrink_video_to_frames: round(i * (total - 1) / (num_frames - 1)), half to even.
  CATCH_CHECK(sample_frame_indices(100, 30, 10, true, 24, 0) ==
              std::vector<int>({0, 11, 22, 33, 44, 55, 66, 77, 88, 99}));
  CATCH_CHECK(sample_frame_indices(33, 16, 17, true, 24, 0) ==
              std::vector<int>({0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32}));
  // 6 frames over 0..9: 0, 1.8, 3.6, 5.4, 7.2, 9 -> 0, 2, 4, 5, 7, 9.
  CATCH_CHECK(sample_frame_indices(10, 24, 6, true, 24, 0) == std::vector<int>({0, 2, 4, 5, 7, 9}));
  // Half-way values round to even, as Python's round(): 4 frames over 0..3 of 0..7 -> step 2.333..
  // and 5 frames over 0..2 -> 0, 0.5, 1, 1.5, 2 -> 0, 0, 1, 2, 2 (a short clip is stretched).
  CATCH_CHECK(sample_frame_indices(3, 24, 5, true, 24, 0) == std::vector<int>({0, 0, 1, 2, 2}));
  CATCH_CHECK(sample_frame_indices(3, 24, 5, false, 24, 0) == std::vector<int>({0, 0, 1, 2, 2}));
  CATCH_CHECK(sample_frame_indices(7, 0, 1, true, 24, 0) == std::vector<int>({0}));

  // A window at fps: 48 fps clip, 24 fps wanted -> every 2nd frame, start in [0, 99 - 8*2].
  std::set<int> starts;
  for (uint64_t draw = 0; draw < 2000; ++draw) {
    const auto idx = sample_frame_indices(100, 48, 9, false, 24, draw);
    CATCH_REQUIRE(idx.size() == 9);
    for (size_t i = 1; i < idx.size(); ++i) CATCH_REQUIRE(idx[i] - idx[i - 1] == 2);
    CATCH_REQUIRE(idx.front() >= 0);
    CATCH_REQUIRE(idx.back() <= 99);
    starts.insert(idx.front());
  }
  CATCH_CHECK(starts.size() == 84);  // every start 0..83 is drawn
  CATCH_CHECK(*starts.rbegin() == 83);
  CATCH_CHECK(sample_frame_indices(100, 48, 9, false, 24, 7) == sample_frame_indices(100, 48, 9, false, 24, 7));
  // Same rate: consecutive frames; 30 fps to 24: round(1.25) = 1, consecutive too.
  auto same = sample_frame_indices(40, 30, 17, false, 24, 3);
  for (size_t i = 1; i < same.size(); ++i) CATCH_CHECK(same[i] - same[i - 1] == 1);
  // Not enough frames at fps (60 fps clip of 40 frames, every 3rd -> 13 < 17): even spread.
  CATCH_CHECK(sample_frame_indices(40, 60, 17, false, 20, 3) == sample_frame_indices(40, 60, 17, true, 20, 3));
}

CATCH_TEST_CASE("a video dataset reads clips and images as one-frame clips", "[data][video]") {
  const fs::path dir = lt::test::scratch_dir("video_dataset_mixed");
  const std::string ext = clip_ext();
  lt::io::write_video(dir / ("long" + ext), numbered_clip(64, 48, 21), 16);
  lt::io::write_video(dir / ("short" + ext), numbered_clip(64, 48, 5), 16);
  lt::io::write_animated_webp(dir / "anim.webp", numbered_clip(48, 48, 9), 8.0, 101);
  lt::io::write_png(dir / "still.png", numbered_frame(64, 48, 3));
  lt::test::write_text(dir / ("long.txt"), "a long clip\n");
  lt::test::write_text(dir / "still.txt", "a still\n");

  Dataset d(video_options(dir, 9));
  CATCH_REQUIRE(d.is_video());
  CATCH_REQUIRE(d.size() == 4);
  std::map<std::string, const ImageRecord*> by_name;
  for (const auto& r : d.images()) by_name[r.path.filename().string()] = &r;
  const ImageRecord& longc = *by_name.at("long" + ext);
  CATCH_CHECK(longc.kind == MediaKind::video);
  CATCH_CHECK(longc.frame_count == 21);
  CATCH_CHECK(longc.fps == Approx(16.0));
  CATCH_CHECK(longc.width == 64);
  CATCH_CHECK(longc.height == 48);
  CATCH_CHECK(longc.raw_caption == "a long clip");
  CATCH_CHECK(by_name.at("anim.webp")->kind == MediaKind::animated_webp);
  CATCH_CHECK(by_name.at("anim.webp")->frame_count == 9);
  CATCH_CHECK(by_name.at("still.png")->kind == MediaKind::image);
  CATCH_CHECK(!by_name.at("still.png")->is_clip());
  // The 5-frame clip is stretched to 9, named in one warning.
  CATCH_REQUIRE(d.warnings().size() == 1);
  CATCH_CHECK(contains(d.warnings()[0], "short" + ext + " (5 frames)"));
  CATCH_CHECK(contains(d.warnings()[0], "num_frames 9"));

  BucketOptions b;
  b.resolutions = {48};
  b.divisibility = 16;
  const BucketPlan plan = d.make_plan(b);
  // Clips and the image never share a bucket (their tensors have different frame counts).
  for (const Bucket& bucket : plan.buckets())
    for (size_t e : bucket.entries) CATCH_CHECK(d.images()[plan.entries()[e].image].is_clip() == bucket.is_clip);
  CATCH_CHECK(contains(plan.histogram_text(), "clips"));

  for (const BucketEntry& e : plan.entries()) {
    const ImageRecord& r = d.images()[e.image];
    const std::string name = r.path.filename().string();
    CATCH_DYNAMIC_SECTION(name) {
      at::Tensor clip = d.load_clip_tensor(e.image, e.placement, false, 9);
      const int64_t frames = r.is_clip() ? 9 : 1;
      CATCH_REQUIRE(clip.sizes() ==
                    torch::IntArrayRef({3, frames, e.placement.crop_height, e.placement.crop_width}));
      CATCH_CHECK(clip.dtype() == torch::kFloat32);
      CATCH_CHECK(clip.min().item<float>() >= -1.0f);
      CATCH_CHECK(clip.max().item<float>() <= 1.0f);
      // Every frame is placed exactly as load_tensor places an image: frame 0 of the clip equals
      // the placed first frame.
      CATCH_CHECK(torch::allclose(clip.select(1, 0), d.load_tensor(e.image, e.placement, false), 0, 1e-6));
      const auto idx = d.clip_frame_indices(e.image, 9);
      if (name == "long" + ext) {
        CATCH_CHECK(idx == std::vector<int>({0, 2, 5, 8, 10, 12, 15, 18, 20}));
        for (int f = 0; f < 9; ++f) CATCH_CHECK(frame_number(clip, f) == idx[f]);
      } else if (name == "short" + ext) {
        CATCH_CHECK(idx == std::vector<int>({0, 0, 1, 2, 2, 2, 3, 4, 4}));
        for (int f = 0; f < 9; ++f) CATCH_CHECK(frame_number(clip, f) == idx[f]);
      } else if (name == "anim.webp") {
        for (int f = 0; f < 9; ++f) CATCH_CHECK(frame_number(clip, f) == f);
      } else {
        CATCH_CHECK(idx == std::vector<int>({0}));
        CATCH_CHECK(frame_number(clip, 0) == 3);
      }
      // Mirroring swaps the halves of every frame.
      at::Tensor flipped = d.load_clip_tensor(e.image, e.placement, true, 9);
      const int64_t w = clip.size(3);
      CATCH_CHECK(torch::allclose(flipped.select(3, 0), clip.select(3, w - 1), 0, 0.1));
      CATCH_CHECK(torch::allclose(flipped.select(3, w - 1), clip.select(3, 0), 0, 0.1));
      CATCH_CHECK(!torch::allclose(flipped.select(3, 0), clip.select(3, 0), 0, 0.5));
      // A smaller num_frames (the OOM guard's first video rung) gives fewer frames.
      CATCH_CHECK(d.load_clip_tensor(e.image, e.placement, false, 5).size(1) == (r.is_clip() ? 5 : 1));
    }
  }

  // Batches stack [B, 3, F, H, W] within a bucket.
  BatchOptions bo;
  bo.batch_size = 2;
  BatchIterator it(d, plan, bo);
  for (int64_t i = 0; i < it.batches_per_epoch(); ++i) {
    Batch batch = it.next();
    at::Tensor pixels = it.load_clip_pixels(batch, 9);
    CATCH_CHECK(pixels.dim() == 5);
    CATCH_CHECK(pixels.size(0) == 2);
    CATCH_CHECK(pixels.size(1) == 3);
  }
}

CATCH_TEST_CASE("shrink_video_to_frames false takes a fixed window at fps", "[data][video]") {
  const fs::path dir = lt::test::scratch_dir("video_dataset_window");
  const std::string ext = clip_ext();
  lt::io::write_video(dir / ("a" + ext), numbered_clip(32, 32, 21), 16);
  DatasetOptions o = video_options(dir, 5);
  o.shrink_video_to_frames = false;
  o.fps = 8;  // every 2nd frame of the 16 fps clip
  Dataset d(o);
  CATCH_REQUIRE(d.warnings().empty());
  const auto idx = d.clip_frame_indices(0, 5);
  CATCH_REQUIRE(idx.size() == 5);
  for (size_t i = 1; i < idx.size(); ++i) CATCH_CHECK(idx[i] - idx[i - 1] == 2);
  CATCH_CHECK(idx == d.clip_frame_indices(0, 5));  // fixed per clip: cache and fresh loads agree
  BucketOptions b;
  b.resolutions = {32};
  const BucketPlan plan = d.make_plan(b);
  at::Tensor clip = d.load_clip_tensor(0, plan.entries()[0].placement, false, 5);
  for (int f = 0; f < 5; ++f) CATCH_CHECK(frame_number(clip, f) == idx[f]);
  // Another seed may move the window, never its spacing.
  bool moved = false;
  for (uint64_t seed = 1; seed < 20 && !moved; ++seed) {
    o.seed = seed;
    moved = Dataset(o).clip_frame_indices(0, 5) != idx;
  }
  CATCH_CHECK(moved);
}

CATCH_TEST_CASE("corrupt, empty and truncated clips are warned about and skipped", "[data][video]") {
  const fs::path dir = lt::test::scratch_dir("video_dataset_broken");
  const std::string ext = clip_ext();
  lt::io::write_video(dir / ("good" + ext), numbered_clip(32, 32, 9), 16);
  const std::string whole = lt::test::read_bytes(dir / ("good" + ext));
  lt::test::write_text(dir / ("cut" + ext), whole.substr(0, whole.size() / 2));
  lt::test::write_text(dir / "empty.mp4", "");
  lt::test::write_text(dir / "words.mov", "not a video\n");
  lt::test::write_text(dir / "words.gif", "GIF89a but nothing else");

  Dataset d(video_options(dir, 5));
  CATCH_REQUIRE(d.size() == 1);
  CATCH_CHECK(d.images()[0].path.filename() == "good" + ext);
  CATCH_REQUIRE(d.warnings().size() == 4);
  for (const std::string& name : {"cut" + ext, std::string("empty.mp4"), std::string("words.mov"), std::string("words.gif")}) {
    size_t hits = 0;
    for (const auto& w : d.warnings()) hits += contains(w, "skipping clip") && contains(w, name);
    CATCH_CHECK(hits == 1);
  }

  // Nothing usable left: one InputError naming the folder.
  fs::remove(dir / ("good" + ext));
  try {
    Dataset bad(video_options(dir, 5));
    CATCH_FAIL("expected an InputError");
  } catch (const lt::InputError& e) {
    CATCH_CHECK(contains(e.what(), dir.string()));
    CATCH_CHECK(contains(e.what(), "no usable clips or images"));
  }
  // An image dataset (num_frames 1) does not pick clips up at all.
  lt::io::write_png(dir / "still.png", numbered_frame(32, 32, 0));
  Dataset images(video_options(dir, 1));
  CATCH_CHECK(images.size() == 1);
  CATCH_CHECK(images.warnings().empty());
}

CATCH_TEST_CASE("latent cache keys change with num_frames and frame sampling; clips encode once", "[data][video][cache]") {
  const fs::path dir = lt::test::scratch_dir("video_dataset_cache");
  const std::string ext = clip_ext();
  lt::io::write_video(dir / ("a" + ext), numbered_clip(32, 32, 17), 16);
  lt::io::write_png(dir / "b.png", numbered_frame(32, 32, 1));
  Dataset d(video_options(dir, 9));
  BucketOptions b;
  b.resolutions = {32};
  const BucketPlan plan = d.make_plan(b);
  size_t clip = d.images()[0].is_clip() ? 0 : 1;
  const Placement& p = plan.entries()[clip].placement;

  CacheOptions co;
  co.model_id = "test";
  co.to_disk = true;
  LatentCache cache(d, co);
  CATCH_CHECK(cache.num_frames() == 9);
  const std::string k9 = cache.key(clip, p, false);
  CATCH_CHECK(contains(k9, "num_frames=9"));
  cache.set_num_frames(5);
  const std::string k5 = cache.key(clip, p, false);
  CATCH_CHECK(k5 != k9);
  CATCH_CHECK(cache.disk_path(clip, p, false) != fs::path());
  // An image in a video dataset is one frame whatever num_frames is.
  const size_t image = 1 - clip;
  const Placement& pi = plan.entries()[image].placement;
  CATCH_CHECK(contains(cache.key(image, pi, false), "num_frames=1"));
  // Another sampling mode is another key.
  DatasetOptions window = video_options(dir, 9);
  window.shrink_video_to_frames = false;
  Dataset dw(window);
  LatentCache cw(dw, co);
  CATCH_CHECK(cw.key(clip, p, false) != k9);
  // An image dataset's keys carry no frame fields (its existing cache files stay valid).
  Dataset di(video_options(dir, 1));
  LatentCache ci(di, co);
  CATCH_CHECK(!contains(ci.key(0, di.make_plan(b).entries()[0].placement, false), "num_frames"));

  // Encoding: [1, 3, F, H, W] in, each distinct sample once; a second build reads the disk files.
  int calls = 0;
  std::vector<int64_t> frames_seen;
  auto encoder = [&](const at::Tensor& pixels) {
    ++calls;
    CATCH_REQUIRE(pixels.dim() == 5);
    frames_seen.push_back(pixels.size(2));
    return pixels.mean(1, true);  // [1, 1, F, H, W]: a stand-in latent
  };
  cache.set_num_frames(9);
  CacheStats s1 = cache.build(plan, encoder);
  CATCH_CHECK(s1.encoded == 2);
  CATCH_CHECK(calls == 2);
  std::sort(frames_seen.begin(), frames_seen.end());
  CATCH_CHECK(frames_seen == std::vector<int64_t>({1, 9}));
  CATCH_CHECK(cache.get(clip, p, false).sizes() == torch::IntArrayRef({1, 9, 32, 32}));
  LatentCache again(d, co);
  CacheStats s2 = again.build(plan, encoder);
  CATCH_CHECK(s2.from_disk == 2);
  CATCH_CHECK(calls == 2);
  // A new num_frames misses for the clip only.
  again.set_num_frames(5);
  CacheStats s3 = again.build(plan, encoder);
  CATCH_CHECK(s3.encoded == 1);
  CATCH_CHECK(s3.in_memory == 1);  // the image: the same key as before
  CATCH_CHECK(again.get(clip, p, false).size(1) == 5);
}

CATCH_TEST_CASE("lt-make-demo-data --video writes decodable clips with captions, deterministically", "[data][video][demo]") {
  const fs::path a = lt::test::scratch_dir("video_demo_a");
  const fs::path b = lt::test::scratch_dir("video_demo_b");
  DemoVideoOptions o;
  o.count = 4;
  o.size = 32;
  o.min_frames = 9;
  o.max_frames = 17;
  const auto clips = make_demo_video_dataset(a, o);
  make_demo_video_dataset(b, o);
  CATCH_REQUIRE(clips.size() == 4);
  std::set<std::string> exts;
  for (const auto& c : clips) {
    CATCH_CHECK(c.frames % 4 == 1);
    CATCH_CHECK(c.frames >= 9);
    CATCH_CHECK(c.frames <= 17);
    CATCH_CHECK(lt::test::read_bytes(a / c.file) == lt::test::read_bytes(b / c.file));
    const auto info = lt::io::probe_video(a / c.file);
    CATCH_CHECK(info.frame_count == c.frames);
    CATCH_CHECK(info.width == c.width);
    CATCH_CHECK(info.height == c.height);
    CATCH_CHECK(contains(c.caption, " moving "));
    exts.insert(fs::path(c.file).extension().string());
  }
  CATCH_CHECK(exts.size() == 3);  // .webm (or .avi), .mp4 (or .avi), .webp
  CATCH_CHECK(clips[3].width == 2 * clips[3].height);
  Dataset d(video_options(a, 9));
  CATCH_CHECK(d.size() == 4);
  CATCH_CHECK(d.warnings().empty());
  CATCH_CHECK(contains(d.images()[0].raw_caption, "moving"));
}
