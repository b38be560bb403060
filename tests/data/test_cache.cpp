#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "data_test_util.h"
#include "loratrain/data/cache.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

using namespace lt::data;
namespace fs = std::filesystem;

namespace {

fs::path make_folder(const std::string& name, int n) {
  fs::path dir = lt::test::scratch_dir(name);
  for (int i = 0; i < n; ++i) {
    lt::io::write_png(dir / ("img" + std::to_string(i) + ".png"),
                      lt::test::pattern_image(i % 2 ? 96 : 64, 64, i));
    lt::test::write_text(dir / ("img" + std::to_string(i) + ".txt"), "caption " + std::to_string(i));
  }
  return dir;
}

// Stands in for the VAE: 8x average pooling, [1, 3, H, W] -> [1, 3, H/8, W/8]; counts calls.
struct FakeVae {
  int calls = 0;
  LatentEncoder fn() {
    return [this](const at::Tensor& px) {
      ++calls;
      return torch::avg_pool2d(px, 8);
    };
  }
};

size_t files_in(const fs::path& dir) {
  size_t n = 0;
  if (!fs::exists(dir)) return 0;
  for (auto& e : fs::directory_iterator(dir)) n += e.is_regular_file();
  return n;
}

}  // namespace

CATCH_TEST_CASE("latent cache in memory encodes each distinct sample once", "[data][cache]") {
  fs::path dir = make_folder("data_cache_mem", 3);
  DatasetOptions o;
  o.folder_path = dir;
  o.num_repeats = 4;
  o.flip_x = true;
  Dataset ds(o);
  BucketOptions b;
  b.resolutions = {64};
  BucketPlan plan = ds.make_plan(b);
  FakeVae vae;
  LatentCache cache(ds, {true, false, "fake-vae"});
  CacheStats s = cache.build(plan, vae.fn());
  CATCH_CHECK(s.encoded == 6);  // 3 images x (plain, flipped); repeats share
  CATCH_CHECK(vae.calls == 6);
  CATCH_CHECK(cache.memory_entries() == 6);
  CATCH_CHECK(!fs::exists(dir / "_latent_cache"));

  const BucketEntry& e = plan.entries()[0];
  at::Tensor expect = torch::avg_pool2d(ds.load_tensor(e.image, e.placement, false).unsqueeze(0), 8)[0];
  CATCH_CHECK(torch::equal(cache.get(e.image, e.placement, false), expect));
  CATCH_CHECK(!torch::equal(cache.get(e.image, e.placement, true), expect));  // the flip differs

  BatchOptions bo;
  bo.batch_size = 2;
  BatchIterator it(ds, plan, bo);
  Batch batch = it.current();
  at::Tensor lat = cache.batch(batch);
  CATCH_CHECK(lat.sizes() == torch::IntArrayRef({2, 3, batch.size.height / 8, batch.size.width / 8}));

  // A second build reuses memory.
  CacheStats again = cache.build(plan, vae.fn());
  CATCH_CHECK(again.encoded == 0);
  CATCH_CHECK(again.in_memory == 6);

  Placement other = e.placement;
  other.crop_x += 1;
  CATCH_CHECK_THROWS_AS(cache.get(e.image, other, false), lt::Error);
  CATCH_CHECK_THROWS_AS(LatentCache(ds, {false, false, "x"}), lt::InputError);
}

CATCH_TEST_CASE("latent cache on disk is reused, and rebuilt when image, resolution or model change",
                "[data][cache]") {
  fs::path dir = make_folder("data_cache_disk", 3);
  DatasetOptions o;
  o.folder_path = dir;
  BucketOptions b;
  b.resolutions = {64};
  const CacheOptions disk_only{false, true, "sd15-vae-fp32"};

  FakeVae vae;
  {
    Dataset ds(o);
    LatentCache cache(ds, disk_only);
    CacheStats s = cache.build(ds.make_plan(b), vae.fn());
    CATCH_CHECK(s.encoded == 3);
    CATCH_CHECK(files_in(dir / "_latent_cache") == 3);
    fs::path p = cache.disk_path(0, ds.make_plan(b).entries()[0].placement, false);
    CATCH_CHECK(p.parent_path() == dir / "_latent_cache");
    CATCH_CHECK(p.filename().string().rfind("img0_", 0) == 0);
    CATCH_CHECK(cache.memory_entries() == 0);
    // Disk-only reads the file back on get().
    const BucketPlan plan = ds.make_plan(b);
    const BucketEntry& e = plan.entries()[0];
    CATCH_CHECK(cache.get(e.image, e.placement, false).size(0) == 3);
  }
  {
    // Unchanged: everything comes from disk, the encoder is not called.
    Dataset ds(o);
    LatentCache cache(ds, {true, true, "sd15-vae-fp32"});
    vae.calls = 0;
    CacheStats s = cache.build(ds.make_plan(b), vae.fn());
    CATCH_CHECK(s.from_disk == 3);
    CATCH_CHECK(s.encoded == 0);
    CATCH_CHECK(vae.calls == 0);
    CATCH_CHECK(cache.memory_entries() == 3);
  }
  // Edit one image's pixels (same name, same size): only that one is re-encoded.
  lt::io::write_png(dir / "img1.png", lt::test::pattern_image(96, 64, 42));
  {
    Dataset ds(o);
    LatentCache cache(ds, disk_only);
    vae.calls = 0;
    CacheStats s = cache.build(ds.make_plan(b), vae.fn());
    CATCH_CHECK(s.encoded == 1);
    CATCH_CHECK(s.from_disk == 2);
    CATCH_CHECK(vae.calls == 1);
  }
  // Another resolution and another model: new keys, re-encoded.
  {
    Dataset ds(o);
    BucketOptions b2;
    b2.resolutions = {32};
    LatentCache cache(ds, disk_only);
    CATCH_CHECK(cache.build(ds.make_plan(b2), vae.fn()).encoded == 3);
    LatentCache cache2(ds, {false, true, "sdxl-vae-fp16"});
    CATCH_CHECK(cache2.build(ds.make_plan(b), vae.fn()).encoded == 3);
    CATCH_CHECK(cache2.build(ds.make_plan(b), vae.fn()).from_disk == 3);
  }
  // A damaged cache file is rebuilt, with the rebuild counted.
  {
    Dataset ds(o);
    LatentCache cache(ds, disk_only);
    const BucketPlan plan = ds.make_plan(b);
    const BucketEntry& e = plan.entries()[2];
    fs::path p = cache.disk_path(e.image, e.placement, false);
    CATCH_REQUIRE(fs::exists(p));
    lt::test::write_text(p, "garbage");
    CacheStats s = cache.build(ds.make_plan(b), vae.fn());
    CATCH_CHECK(s.rebuilt == 1);
    CATCH_CHECK(s.encoded == 1);
    CATCH_CHECK(s.from_disk == 2);
  }
}

CATCH_TEST_CASE("text-embedding cache: memory, disk, model change and batching", "[data][cache]") {
  int calls = 0;
  TextEncoder enc = [&](const std::string& caption) {
    ++calls;
    const float v = static_cast<float>(caption.size());
    return TextEmbedding{{"hidden_states", torch::full({1, 4, 8}, v)}, {"pooled", torch::full({1, 8}, -v)}};
  };
  fs::path dir = lt::test::scratch_dir("data_cache_te") / "_t_e_cache";
  const std::vector<std::string> captions = {"a red circle", "", "a red circle", "sks a blue square"};
  {
    TextEmbeddingCache cache(dir, {true, true, "clip-l"});
    CacheStats s = cache.build(captions, enc);
    CATCH_CHECK(s.encoded == 3);
    CATCH_CHECK(calls == 3);
    CATCH_CHECK(files_in(dir) == 3);
    TextEmbedding e = cache.get("a red circle");
    CATCH_REQUIRE(e.size() == 2);
    CATCH_CHECK(e[0].first == "hidden_states");
    CATCH_CHECK(e[0].second.sizes() == torch::IntArrayRef({4, 8}));  // batch dim removed
    CATCH_CHECK(e[1].second[0].item<float>() == -12.0f);
    TextEmbedding batch = cache.batch({"a red circle", "", "new caption"}, enc);
    CATCH_CHECK(calls == 4);  // "new caption" encoded on the fly
    CATCH_CHECK(batch[0].second.sizes() == torch::IntArrayRef({3, 4, 8}));
    CATCH_CHECK(batch[1].second.sizes() == torch::IntArrayRef({3, 8}));
    CATCH_CHECK(batch[0].second[1].sum().item<float>() == 0.0f);
  }
  {
    calls = 0;
    TextEmbeddingCache cache(dir, {false, true, "clip-l"});
    CacheStats s = cache.build(captions, enc);
    CATCH_CHECK(s.from_disk == 3);
    CATCH_CHECK(calls == 0);
    CATCH_CHECK(cache.contains("new caption"));
    CATCH_CHECK(!cache.contains("never seen"));
    CATCH_CHECK_THROWS_AS(cache.get("never seen"), lt::Error);
  }
  {
    calls = 0;
    TextEmbeddingCache cache(dir, {true, true, "clip-l-other-weights"});
    CATCH_CHECK(cache.build(captions, enc).encoded == 3);
    CATCH_CHECK(calls == 3);
  }
}
