// Bucket expectations were computed by hand from the reference code (ai-toolkit
// toolkit/buckets.py get_bucket_for_image_size + dataloader_mixins.py setup_buckets; sd-scripts
// model_util.make_bucket_resolutions + train_util.BucketManager.select_bucket) and cross-checked
// by running that arithmetic in Python.
#include <catch2/catch.hpp>

#include <map>
#include <set>

#include "loratrain/data/buckets.h"
#include "loratrain/data/captions.h"
#include "loratrain/util/error.h"

using namespace lt::data;

namespace {

Placement P(int sw, int sh, int cx, int cy, int cw, int ch) { return {sw, sh, cx, cy, cw, ch}; }

Placement aitk(int w, int h, int res, int div = 16) {
  return aitk_cover_and_crop(w, h, aitk_bucket_for_image(w, h, res, div));
}

}  // namespace

CATCH_TEST_CASE("AI Toolkit buckets for several aspect ratios", "[data][buckets]") {
  // 4:3 above 512^2: scaled to 512^2 pixels; (576,448) is the closest capped candidate.
  CATCH_CHECK(aitk(1024, 768, 512) == P(598, 448, 11, 0, 576, 448));
  CATCH_CHECK(aitk(768, 1024, 512) == P(448, 598, 0, 11, 448, 576));
  CATCH_CHECK(aitk(640, 480, 512) == P(598, 448, 11, 0, 576, 448));
  // Smaller than the resolution: never upscaled into it, its own snapped size (288x208).
  CATCH_CHECK(aitk(300, 200, 512) == P(312, 208, 12, 0, 288, 208));
  CATCH_CHECK(aitk(512, 512, 512) == P(512, 512, 0, 0, 512, 512));
  // 4:1 lands exactly on a multiple.
  CATCH_CHECK(aitk(2000, 500, 512) == P(1024, 256, 0, 0, 1024, 256));
  CATCH_CHECK(aitk(1920, 1080, 512) == P(683, 384, 5, 0, 672, 384));
  CATCH_CHECK(aitk(1920, 1080, 1024) == P(1366, 768, 3, 0, 1360, 768));
  CATCH_CHECK(aitk(1000, 1000, 768) == P(768, 768, 0, 0, 768, 768));
  // Tiny images take the divisibility floor (upscaled), as the reference's fallback does.
  CATCH_CHECK(aitk(10, 10, 512) == P(16, 16, 0, 0, 16, 16));
  // Python float quirk mirrored: ceil(1001 * (512/1000)) = 513, one row cropped at the bottom.
  CATCH_CHECK(aitk(1000, 1001, 512) == P(512, 513, 0, 0, 512, 512));
  // Beyond 4:1 the centre 4:1 part is bucketed (400x100 -> 400x96) and the rest cropped away.
  CATCH_CHECK(aitk(4000, 100, 512) == P(3840, 96, 1720, 0, 400, 96));
  // Divisibility is the model's: Flux-style 32.
  CATCH_CHECK(aitk_bucket_for_image(1024, 768, 512, 32) == Size{576, 448});
  // Every bucket stays within resolution^2 and on the grid.
  for (auto [w, h] : {std::pair{3000, 2000}, {1234, 987}, {777, 3333}, {513, 511}}) {
    Size b = aitk_bucket_for_image(w, h, 512, 16);
    CATCH_CHECK(b.width * b.height <= 512 * 512);
    CATCH_CHECK(b.width % 16 == 0);
    CATCH_CHECK(b.height % 16 == 0);
  }
}

CATCH_TEST_CASE("extreme aspect ratios are clamped to 4:1 and never exceed the target area", "[data][buckets]") {
  CATCH_CHECK(clamp_aspect(8, 4000) == Size{8, 32});
  CATCH_CHECK(clamp_aspect(4000, 100) == Size{400, 100});
  CATCH_CHECK(clamp_aspect(2000, 500) == Size{2000, 500});  // exactly 4:1 is kept whole
  CATCH_CHECK(clamp_aspect(1920, 1080) == Size{1920, 1080});
  CATCH_CHECK(aspect_clamped(8, 4000));
  CATCH_CHECK_FALSE(aspect_clamped(2000, 500));
  // The reference's fallback gave this strip a 16x1424 bucket at resolution 64 (5.6x the area).
  CATCH_CHECK(aitk(8, 4000, 64) == P(16, 8000, 0, 3984, 16, 32));
  CATCH_CHECK(aitk(4000, 8, 64) == P(8000, 16, 3984, 0, 32, 16));
  // A resolution of one grid step: the fallback shrinks to fit instead of overflowing.
  CATCH_CHECK(aitk_bucket_for_image(64, 16, 16, 16) == Size{16, 16});
  for (int res : {16, 64, 512}) {
    for (int w : {1, 7, 8, 16, 63, 100, 513, 1000, 4000, 20000}) {
      for (int h : {1, 5, 8, 33, 64, 300, 999, 4000, 20000}) {
        const Size b = aitk_bucket_for_image(w, h, res, 16);
        CATCH_CHECK(int64_t(b.width) * b.height <= int64_t(res) * res);
        CATCH_CHECK(b.width % 16 == 0);
        CATCH_CHECK(b.height % 16 == 0);
        CATCH_CHECK(b.width >= 16);
        CATCH_CHECK(b.height >= 16);
        // 4:1 at most, give or take the grid step the short side is rounded to.
        CATCH_CHECK(std::max(b.width, b.height) <= 4 * (std::min(b.width, b.height) + 16));
        const Placement p = aitk_cover_and_crop(w, h, b);
        CATCH_CHECK(p.crop_x + p.crop_width <= p.scale_to_width);
        CATCH_CHECK(p.crop_y + p.crop_height <= p.scale_to_height);
      }
    }
  }
  // A resolution below the model's grid is refused.
  BucketOptions tiny;
  tiny.resolutions = {8};
  CATCH_CHECK_THROWS_WITH(BucketPlan::build({{64, 64, "a.png"}}, tiny), Catch::Contains("smaller than the model's bucket grid"));
}

CATCH_TEST_CASE("AI Toolkit square crop when buckets are off", "[data][buckets]") {
  CATCH_CHECK(aitk_square_crop(1024, 768, 512) == P(683, 512, 85, 0, 512, 512));
  CATCH_CHECK(aitk_square_crop(300, 600, 512) == P(512, 1024, 0, 256, 512, 512));
}

CATCH_TEST_CASE("kohya make_bucket_resolutions", "[data][buckets]") {
  auto r512 = make_bucket_resolutions({512, 512});
  CATCH_REQUIRE(r512.size() == 17);
  CATCH_CHECK(r512.front() == Size{256, 832});
  CATCH_CHECK(r512[8] == Size{512, 512});
  CATCH_CHECK(r512.back() == Size{1024, 256});
  CATCH_CHECK(make_bucket_resolutions({1024, 1024}).size() == 25);
  CATCH_CHECK(make_bucket_resolutions({1024, 1024}, 256, 2048, 64).size() == 41);
  CATCH_CHECK(make_bucket_resolutions({1024, 1024}, 256, 2048, 32).size() == 81);
}

CATCH_TEST_CASE("kohya select_bucket with and without bucket_no_upscale", "[data][buckets]") {
  auto pre = make_bucket_resolutions({512, 512});
  auto pick = [&](int w, int h, bool no_up) {
    return kohya_placement(kohya_select_bucket(w, h, pre, no_up, 512 * 512, 64));
  };
  CATCH_CHECK(pick(1024, 768, false) == P(597, 448, 10, 0, 576, 448));
  CATCH_CHECK(pick(768, 1024, false) == P(448, 597, 0, 10, 448, 576));
  CATCH_CHECK(pick(300, 200, false) == P(640, 427, 0, 21, 640, 384));  // upscaled
  CATCH_CHECK(pick(1920, 1080, false) == P(683, 384, 21, 0, 640, 384));
  CATCH_CHECK(pick(100, 400, false) == P(256, 1024, 0, 0, 256, 1024));
  CATCH_CHECK(pick(1024, 768, true) == P(512, 384, 0, 0, 512, 384));
  CATCH_CHECK(pick(300, 200, true) == P(300, 200, 22, 4, 256, 192));  // never upscaled
  CATCH_CHECK(pick(100, 400, true) == P(100, 400, 18, 8, 64, 384));
  CATCH_CHECK(pick(1920, 1080, true) == P(683, 384, 21, 0, 640, 384));
  auto c = kohya_select_bucket(1024, 768, pre, false, 512 * 512, 64);
  CATCH_CHECK(c.ar_error == Approx(576.0 / 448 - 1024.0 / 768));
}

CATCH_TEST_CASE("a plan has one bucket set per resolution", "[data][buckets]") {
  std::vector<ImageShape> shapes = {{1024, 768, "a"}, {300, 200, "b"}, {512, 512, "c"},
                                    {2000, 2000, "d"}};
  BucketOptions o;
  o.resolutions = {1024, 512, 768, 512};  // order and duplicates do not matter
  BucketPlan plan = BucketPlan::build(shapes, o, 2, true);
  CATCH_CHECK(plan.resolutions() == std::vector<int>{512, 768, 1024});
  // 4 images x 2 repeats x 2 (flip) per set, 3 sets.
  CATCH_REQUIRE(plan.entries().size() == 4 * 2 * 2 * 3);
  size_t total = 0;
  std::set<std::string> keys;
  for (const Bucket& b : plan.buckets()) {
    total += b.entries.size();
    keys.insert(b.key());
    for (size_t e : b.entries) {
      CATCH_CHECK(plan.entries()[e].resolution == b.resolution);
      CATCH_CHECK(plan.entries()[e].placement.bucket() == b.size);
    }
  }
  CATCH_CHECK(total == plan.entries().size());
  // The 300x200 image keeps its own 288x208 size in every set: no upscaling into 768 or 1024.
  CATCH_CHECK(keys.count("512:288x208"));
  CATCH_CHECK(keys.count("768:288x208"));
  CATCH_CHECK(keys.count("1024:288x208"));
  CATCH_CHECK(keys.count("1024:1024x1024"));
  CATCH_CHECK(keys.count("768:768x768"));
  CATCH_CHECK(keys.count("1024:1024x768"));  // under 1024^2 pixels: its own size
  std::string text = plan.histogram_text();
  CATCH_CHECK(text.find("Bucket sizes for resolution 768:") != std::string::npos);
  CATCH_CHECK(text.find("288x208: 4 files") != std::string::npos);
  size_t hist_total = 0;
  for (const HistogramRow& r : plan.histogram()) hist_total += r.entries;
  CATCH_CHECK(hist_total == plan.entries().size());
  // Repeats first, then the flipped copy of the whole list (AI Toolkit's order).
  CATCH_CHECK(plan.entries()[0].image == 0);
  CATCH_CHECK(plan.entries()[4].image == 0);
  CATCH_CHECK(!plan.entries()[4].flip_x);
  CATCH_CHECK(plan.entries()[8].flip_x);
}

CATCH_TEST_CASE("dropping the largest resolution keeps every image", "[data][buckets]") {
  std::vector<ImageShape> shapes = {{1024, 768, "a"}, {300, 200, "b"}, {2000, 2000, "c"}};
  BucketOptions o;
  o.resolutions = {512, 1024};
  BucketPlan plan = BucketPlan::build(shapes, o, 1, false);
  const uint64_t before = plan.fingerprint();
  auto count_images = [&](const BucketPlan& p) {
    std::map<size_t, size_t> n;
    for (const Bucket& b : p.buckets())
      for (size_t e : b.entries) ++n[p.entries()[e].image];
    return n;
  };
  auto counts_before = count_images(plan);
  auto drop = plan.drop_largest_resolution();
  CATCH_REQUIRE(drop);
  CATCH_CHECK(drop->from == 1024);
  CATCH_CHECK(drop->to == 512);
  CATCH_CHECK(drop->moved_entries == 3);
  CATCH_CHECK(plan.resolutions() == std::vector<int>{512});
  CATCH_CHECK(count_images(plan) == counts_before);  // same samples per epoch
  CATCH_CHECK(plan.entries().size() == 6);
  for (const BucketEntry& e : plan.entries()) {
    CATCH_CHECK(e.resolution == 512);
    CATCH_CHECK(e.placement.crop_width * e.placement.crop_height <= 512 * 512);
  }
  CATCH_CHECK(plan.fingerprint() != before);
  // One set left: nothing to drop unless a smaller fallback resolution is given.
  CATCH_CHECK(!plan.drop_largest_resolution());
  CATCH_CHECK(!plan.drop_largest_resolution(768));
  auto fallback = plan.drop_largest_resolution(256);
  CATCH_REQUIRE(fallback);
  CATCH_CHECK(fallback->to == 256);
  CATCH_CHECK(plan.resolutions() == std::vector<int>{256});
  CATCH_CHECK(count_images(plan) == counts_before);
}

CATCH_TEST_CASE("kohya-style plans and bad bucket options", "[data][buckets]") {
  std::vector<ImageShape> shapes = {{1024, 768, "a"}, {100, 400, "b"}};
  BucketOptions o;
  o.style = BucketStyle::Kohya;
  o.resolutions = {512};
  BucketPlan plan = BucketPlan::build(shapes, o);
  CATCH_CHECK(plan.entries()[0].placement == P(597, 448, 10, 0, 576, 448));
  CATCH_CHECK(plan.entries()[1].placement == P(256, 1024, 0, 0, 256, 1024));

  o.bucket_no_upscale = true;
  std::vector<ImageShape> tiny = {{40, 300, "tiny.png"}};
  try {
    BucketPlan::build(tiny, o);
    CATCH_FAIL("no error for an image below the bucket step");
  } catch (const lt::InputError& e) {
    CATCH_CHECK(std::string(e.what()).find("tiny.png") != std::string::npos);
  }
  BucketOptions bad;
  bad.resolutions = {};
  CATCH_CHECK_THROWS_AS(BucketPlan::build(shapes, bad), lt::InputError);
  bad.resolutions = {512};
  bad.divisibility = 0;
  CATCH_CHECK_THROWS_AS(BucketPlan::build(shapes, bad), lt::InputError);
  BucketOptions k;
  k.style = BucketStyle::Kohya;
  k.resolutions = {2048};  // above max_bucket_reso 1024
  CATCH_CHECK_THROWS_AS(BucketPlan::build(shapes, k), lt::InputError);
}

CATCH_TEST_CASE("trigger words", "[data][captions]") {
  CATCH_CHECK(inject_trigger("a photo of [trigger] at the beach", "ohwx") ==
              "a photo of ohwx at the beach");
  CATCH_CHECK(inject_trigger("[name], smiling", "ohwx") == "ohwx, smiling");
  CATCH_CHECK(inject_trigger("a dog", "ohwx") == "ohwx a dog");  // added when missing
  CATCH_CHECK(inject_trigger("ohwx dog", "ohwx") == "ohwx dog");
  CATCH_CHECK(inject_trigger("", "ohwx") == "ohwx");
  CATCH_CHECK(inject_trigger("a [trigger] dog", "") == "a  dog");  // no trigger: placeholder removed
  Rng rng(1);
  CaptionOptions o;
  o.trigger_word = "sks";
  CATCH_CHECK(process_caption("red, circle", o, rng) == "sks red, circle");
}

CATCH_TEST_CASE("caption dropout is seeded and drops the trigger too", "[data][captions]") {
  CaptionOptions o;
  o.trigger_word = "sks";
  o.caption_dropout_rate = 0.3;
  auto run = [&](uint64_t seed) {
    Rng rng(seed);
    std::vector<std::string> out;
    for (int i = 0; i < 2000; ++i) out.push_back(process_caption("a cat", o, rng));
    return out;
  };
  auto a = run(7);
  CATCH_CHECK(a == run(7));
  CATCH_CHECK(a != run(8));
  size_t dropped = std::count(a.begin(), a.end(), std::string());
  CATCH_CHECK(dropped > 2000 * 0.25);
  CATCH_CHECK(dropped < 2000 * 0.35);
  for (const auto& c : a) CATCH_CHECK((c.empty() || c == "sks a cat"));
}

CATCH_TEST_CASE("shuffle_tokens keeps the first keep_tokens tags in place", "[data][captions]") {
  CaptionOptions o;
  o.shuffle_tokens = true;
  o.keep_tokens = 2;
  const std::string raw = "[trigger], woman, red hair, smiling, outdoors, blue sky,  ";
  o.trigger_word = "ohwx";
  std::set<std::string> seen;
  Rng rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string c = process_caption(raw, o, rng);
    CATCH_CHECK(c.rfind("ohwx, woman, ", 0) == 0);
    for (const char* tag : {"red hair", "smiling", "outdoors", "blue sky"})
      CATCH_CHECK(c.find(tag) != std::string::npos);
    CATCH_CHECK(c.find(",,") == std::string::npos);  // empty tags removed
    seen.insert(c);
  }
  CATCH_CHECK(seen.size() == 24);  // all 4! orders of the unkept tags occur
  CATCH_CHECK(caption_is_random(o));

  // Token dropout never touches kept tags; the trigger is re-added if dropped with a tag.
  CaptionOptions d;
  d.token_dropout_rate = 1.0;
  d.keep_tokens = 1;
  d.trigger_word = "ohwx";
  Rng r2(1);
  CATCH_CHECK(process_caption("woman, ohwx, red hair", d, r2) == "ohwx woman");
}
