#include <catch2/catch.hpp>
#include <unistd.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "data_test_util.h"
#include "loratrain/data/batches.h"
#include "loratrain/data/dataset.h"
#include "loratrain/data/demo_data.h"
#include "loratrain/util/error.h"
#include "test_support.h"

using namespace lt::data;
namespace fs = std::filesystem;

using lt::test::contains;

namespace {

std::string error_of(const DatasetOptions& o) {
  try {
    Dataset d(o);
  } catch (const lt::InputError& e) {
    return e.what();
  }
  return "";
}

// Six images of three shapes (two non-square), captions for five of them.
fs::path make_folder(const std::string& name) {
  fs::path dir = lt::test::scratch_dir(name);
  const std::pair<int, int> sizes[] = {{64, 64}, {96, 64}, {64, 96}, {80, 80}, {64, 64}, {96, 64}};
  for (int i = 0; i < 6; ++i) {
    std::string stem = "img" + std::to_string(i);
    lt::io::write_png(dir / (stem + ".png"), lt::test::pattern_image(sizes[i].first, sizes[i].second, i));
    if (i != 5) lt::test::write_text(dir / (stem + ".txt"), "tag" + std::to_string(i) + ", red, circle\n");
  }
  return dir;
}

}  // namespace

CATCH_TEST_CASE("a dataset folder with captions, default caption and trigger", "[data][dataset]") {
  fs::path dir = make_folder("data_ds_basic");
  fs::create_directories(dir / "sub");
  lt::io::write_png(dir / "sub" / "deep.PNG", lt::test::pattern_image(32, 48, 9));  // recursive, any case
  fs::create_directories(dir / "_latent_cache");
  lt::io::write_png(dir / "_latent_cache" / "ignored.png", lt::test::pattern_image(8, 8));
  lt::io::write_png(dir / ".hidden.png", lt::test::pattern_image(8, 8));
  lt::test::write_text(dir / "img4.txt", "   \n");  // empty caption -> default caption

  DatasetOptions o;
  o.folder_path = dir;
  o.default_caption = "a shape";
  o.trigger_word = "sks";
  Dataset ds(o);
  CATCH_REQUIRE(ds.size() == 7);
  CATCH_CHECK(ds.warnings().empty());
  CATCH_CHECK(ds.images()[0].path.filename() == "img0.png");
  CATCH_CHECK(ds.images()[1].width == 96);
  CATCH_CHECK(ds.images()[1].height == 64);
  CATCH_CHECK(ds.images()[0].raw_caption == "tag0, red, circle");  // trimmed
  CATCH_CHECK(ds.images()[4].raw_caption == "a shape");
  CATCH_CHECK(ds.images()[5].raw_caption == "a shape");
  CATCH_CHECK(!ds.images()[5].has_caption_file);
  CATCH_CHECK(ds.images()[6].path.filename() == "deep.PNG");
  CATCH_CHECK(ds.images()[0].content_hash != ds.images()[4].content_hash);
  Rng rng(0);
  CATCH_CHECK(ds.caption(0, rng) == "sks tag0, red, circle");
  auto fixed = ds.fixed_captions();
  CATCH_REQUIRE(fixed);
  CATCH_CHECK(fixed->size() == 5);  // 4 distinct sidecars + "a shape" shared by three images

  // caption_ext without the dot, and dropout adds the empty caption to the fixed set.
  o.caption_ext = "txt";
  o.caption_dropout_rate = 0.1;
  Dataset ds2(o);
  auto fixed2 = ds2.fixed_captions();
  CATCH_REQUIRE(fixed2);
  CATCH_CHECK(std::count(fixed2->begin(), fixed2->end(), std::string()) == 1);
  o.shuffle_tokens = true;
  CATCH_CHECK(!Dataset(o).fixed_captions());
}

CATCH_TEST_CASE("bad datasets give clear messages", "[data][dataset]") {
  DatasetOptions o;
  o.folder_path = lt::test::scratch_dir("data_ds_missing") / "nope";
  CATCH_CHECK(contains(error_of(o), "dataset folder not found: "));
  CATCH_CHECK(contains(error_of(o), "nope"));

  fs::path empty = lt::test::scratch_dir("data_ds_empty");
  o.folder_path = empty;
  std::string e = error_of(o);
  CATCH_CHECK(contains(e, "contains no images"));
  CATCH_CHECK(contains(e, empty.string()));
  CATCH_CHECK(contains(e, ".webp"));

  // Captions without images: named in the error when nothing else is there.
  lt::test::write_text(empty / "lonely.txt", "a caption");
  e = error_of(o);
  CATCH_CHECK(contains(e, "contains no images"));
  CATCH_CHECK(contains(e, "1 caption file without images: lonely.txt"));

  // A file, not a folder.
  o.folder_path = empty / "lonely.txt";
  CATCH_CHECK(contains(error_of(o), "not a folder"));

  // Only corrupt / unreadable images: every one named, no usable image is an error.
  fs::path bad = lt::test::scratch_dir("data_ds_bad");
  lt::test::write_text(bad / "text.png", "not an image");
  std::string png = lt::io::encode_png(lt::test::pattern_image(50, 40));
  lt::test::write_text(bad / "cut.png", png.substr(0, png.size() / 2));
  fs::create_symlink(bad / "gone.jpg", bad / "dangling.jpg");
  o.folder_path = bad;
  e = error_of(o);
  CATCH_CHECK(contains(e, "has no usable images: all 3 image files were skipped"));
  CATCH_CHECK(contains(e, "text.png"));
  CATCH_CHECK(contains(e, "cut.png"));
  CATCH_CHECK(contains(e, "dangling.jpg: cannot read"));

  // Bad option values.
  DatasetOptions r;
  r.folder_path = bad;
  r.caption_dropout_rate = 1.5;
  CATCH_CHECK(contains(error_of(r), "caption_dropout_rate must be between 0 and 1"));
  r.caption_dropout_rate = 0;
  r.num_repeats = 0;
  CATCH_CHECK(contains(error_of(r), "num_repeats must be at least 1"));
}

CATCH_TEST_CASE("corrupt images and orphan captions are skipped with one warning each",
                "[data][dataset]") {
  fs::path dir = make_folder("data_ds_mixed");
  std::string png = lt::io::encode_png(lt::test::pattern_image(50, 40));
  lt::test::write_text(dir / "broken.png", png.substr(0, png.size() - 30));
  lt::test::write_text(dir / "broken.txt", "caption of a broken image");  // not an orphan
  lt::test::write_text(dir / "zz_notes.webp", "RIFF1234WEBPjunk");
  lt::test::write_text(dir / "orphan1.txt", "no image");
  lt::test::write_text(dir / "orphan2.txt", "no image either");
  fs::create_directories(dir / "dir.png");  // a folder with an image name is not an image
  if (geteuid() != 0) {  // root reads anything; elsewhere an unreadable file is also skipped
    lt::test::write_text(dir / "locked.png", png);
    fs::permissions(dir / "locked.png", fs::perms::none);
  }
  DatasetOptions o;
  o.folder_path = dir;
  Dataset ds(o);
  CATCH_CHECK(ds.size() == 6);
  const auto& w = ds.warnings();
  CATCH_REQUIRE(w.size() >= 3);
  auto count_with = [&](const std::string& s) {
    return std::count_if(w.begin(), w.end(), [&](const std::string& m) { return contains(m, s); });
  };
  CATCH_CHECK(count_with("broken.png") == 1);
  CATCH_CHECK(count_with("zz_notes.webp") == 1);
  CATCH_CHECK(count_with("2 caption files") == 1);
  CATCH_CHECK(count_with("orphan1.txt") == 1);
  CATCH_CHECK(count_with("broken.txt") == 0);
  if (geteuid() != 0) CATCH_CHECK(count_with("locked.png") == 1);
}

CATCH_TEST_CASE("with verify_images off only headers are read; loading still names the file",
                "[data][dataset]") {
  fs::path dir = lt::test::scratch_dir("data_ds_noverify");
  lt::io::write_png(dir / "good.png", lt::test::pattern_image(40, 30));
  std::string png = lt::io::encode_png(lt::test::pattern_image(50, 40, 1));
  lt::test::write_text(dir / "late.png", png.substr(0, png.size() - 20));  // header intact
  DatasetOptions o;
  o.folder_path = dir;
  o.verify_images = false;
  Dataset ds(o);
  CATCH_REQUIRE(ds.size() == 2);
  CATCH_CHECK(ds.images()[0].width == 40);
  CATCH_CHECK(ds.images()[1].width == 50);
  Placement p{50, 40, 0, 0, 48, 32};
  try {
    ds.load_image(1, p, false);
    CATCH_FAIL("no error for a truncated image at load");
  } catch (const lt::InputError& e) {
    CATCH_CHECK(contains(e.what(), "late.png"));
  }
  o.verify_images = true;
  CATCH_CHECK(Dataset(o).size() == 1);
}

CATCH_TEST_CASE("loading an image resizes once, flips and crops to the bucket", "[data][dataset]") {
  fs::path dir = lt::test::scratch_dir("data_ds_load");
  // Left half black, right half white, 200x100: downscaled into a 64 bucket set.
  lt::io::Image im(200, 100);
  for (int y = 0; y < 100; ++y)
    for (int x = 100; x < 200; ++x) std::fill_n(im.at(x, y), 3, 255);
  lt::io::write_png(dir / "half.png", im);
  DatasetOptions o;
  o.folder_path = dir;
  o.flip_x = true;
  Dataset ds(o);
  BucketOptions b;
  b.resolutions = {64};
  b.divisibility = 16;
  BucketPlan plan = ds.make_plan(b);
  CATCH_REQUIRE(plan.entries().size() == 2);  // original + flipped copy
  const Placement& p = plan.entries()[0].placement;
  // 4096 target pixels: (80, 48) is the closest capped candidate; cover-scale to 96x48, crop 8.
  CATCH_CHECK(p == Placement{96, 48, 8, 0, 80, 48});
  lt::io::Image a = ds.load_image(0, p, false);
  CATCH_CHECK(a.width == 80);
  CATCH_CHECK(a.height == 48);
  CATCH_CHECK(a.at(5, 20)[0] < 10);
  CATCH_CHECK(a.at(75, 20)[0] > 245);
  lt::io::Image f = ds.load_image(0, p, true);
  CATCH_CHECK(f.at(5, 20)[0] > 245);
  CATCH_CHECK(f.at(75, 20)[0] < 10);
  at::Tensor t = ds.load_tensor(0, p, false);
  CATCH_CHECK(t.sizes() == torch::IntArrayRef({3, 48, 80}));
  CATCH_CHECK(t.min().item<float>() >= -1.0f);
}

CATCH_TEST_CASE("batches come from one bucket, in a seeded, resumable order", "[data][batches]") {
  fs::path dir = make_folder("data_ds_batches");
  DatasetOptions o;
  o.folder_path = dir;
  o.num_repeats = 3;
  o.flip_x = true;
  o.caption_dropout_rate = 0.3;
  o.shuffle_tokens = true;
  Dataset ds(o);
  BucketOptions b;
  b.resolutions = {64};
  BucketPlan plan = ds.make_plan(b);

  BatchOptions bo;
  bo.batch_size = 4;
  bo.seed = 11;
  BatchIterator it(ds, plan, bo);
  const int64_t per_epoch = it.batches_per_epoch();
  size_t expected = 0;
  for (const Bucket& bk : plan.buckets()) expected += (bk.entries.size() + 3) / 4;
  CATCH_CHECK(per_epoch == static_cast<int64_t>(expected));

  // One epoch covers every entry at least once; each batch is one bucket, padded to 4.
  std::map<size_t, int> seen;
  std::vector<Batch> first_run;
  for (int64_t i = 0; i < per_epoch * 2 + 3; ++i) {
    Batch batch = it.next();
    CATCH_CHECK(batch.items.size() == 4);
    for (const BatchItem& item : batch.items) {
      CATCH_CHECK(item.placement.bucket() == batch.size);
      if (batch.position.epoch == 0) ++seen[item.entry];
    }
    first_run.push_back(batch);
  }
  CATCH_CHECK(seen.size() == plan.entries().size());
  CATCH_CHECK(it.position() == BatchPosition{2, 3});

  auto same = [](const Batch& a, const Batch& c) {
    if (a.items.size() != c.items.size() || !(a.position == c.position)) return false;
    for (size_t i = 0; i < a.items.size(); ++i)
      if (a.items[i].entry != c.items[i].entry || a.items[i].caption != c.items[i].caption) return false;
    return true;
  };
  // Epochs differ in order.
  bool epochs_differ = false;
  for (int64_t i = 0; i < per_epoch; ++i)
    epochs_differ |= first_run[i].items[0].entry != first_run[per_epoch + i].items[0].entry;
  CATCH_CHECK(epochs_differ);

  // A fresh iterator with the same seed replays everything, captions included.
  BatchIterator again(ds, plan, bo);
  for (const Batch& expected_batch : first_run) CATCH_CHECK(same(again.next(), expected_batch));

  // Resume from a saved position mid-epoch-1.
  BatchIterator a(ds, plan, bo);
  for (int i = 0; i < per_epoch + 2; ++i) a.advance();
  const std::string state = a.state_json();
  BatchIterator resumed(ds, plan, bo);
  resumed.restore_state(state);
  CATCH_CHECK(resumed.position() == BatchPosition{1, 2});
  for (int64_t i = per_epoch + 2; i < static_cast<int64_t>(first_run.size()); ++i)
    CATCH_CHECK(same(resumed.next(), first_run[i]));

  // current() is stable: the OOM guard retries the identical batch.
  CATCH_CHECK(same(a.current(), a.current()));
  CATCH_CHECK(same(a.current(), first_run[per_epoch + 2]));

  // Another seed gives another order.
  bo.seed = 12;
  BatchIterator other(ds, plan, bo);
  bool differs = false;
  for (int64_t i = 0; i < per_epoch; ++i) differs |= !same(other.next(), first_run[i]);
  CATCH_CHECK(differs);

  CATCH_CHECK_THROWS_AS(resumed.restore_state("{broken"), lt::InputError);
  CATCH_CHECK_THROWS_AS(resumed.seek({0, per_epoch}), lt::Error);
}

CATCH_TEST_CASE("short batches: padded like AI Toolkit or kept like kohya", "[data][batches]") {
  fs::path dir = make_folder("data_ds_short");
  DatasetOptions o;
  o.folder_path = dir;
  Dataset ds(o);
  BucketOptions b;
  b.resolutions = {64};
  BucketPlan plan = ds.make_plan(b);
  BatchOptions bo;
  bo.batch_size = 5;
  bo.pad_short_batches = false;
  BatchIterator kohya(ds, plan, bo);
  size_t items = 0;
  for (int64_t i = 0; i < kohya.batches_per_epoch(); ++i) items += kohya.next().items.size();
  CATCH_CHECK(items == plan.entries().size());
  bo.pad_short_batches = true;
  BatchIterator aitk(ds, plan, bo);
  for (int64_t i = 0; i < aitk.batches_per_epoch(); ++i) CATCH_CHECK(aitk.next().items.size() == 5);

  // Pixels for a batch stack to [B, 3, H, W].
  Batch batch = aitk.current();
  at::Tensor px = aitk.load_pixels(batch);
  CATCH_CHECK(px.size(0) == 5);
  CATCH_CHECK(px.size(2) == batch.size.height);
  CATCH_CHECK(px.size(3) == batch.size.width);
}

CATCH_TEST_CASE("dropping the largest resolution mid-run keeps the iterator valid",
                "[data][batches]") {
  fs::path dir = make_folder("data_ds_drop");
  DatasetOptions o;
  o.folder_path = dir;
  Dataset ds(o);
  BucketOptions b;
  b.resolutions = {32, 64};
  BatchOptions bo;
  bo.batch_size = 2;
  BatchIterator it(ds, ds.make_plan(b), bo);
  const int64_t before = it.batches_per_epoch();
  for (int i = 0; i < 3; ++i) it.advance();
  auto drop = it.drop_largest_resolution();
  CATCH_REQUIRE(drop);
  CATCH_CHECK(drop->from == 64);
  CATCH_CHECK(it.plan().resolutions() == std::vector<int>{32});
  CATCH_CHECK(it.plan().entries().size() == 12);
  CATCH_CHECK(it.batches_per_epoch() <= before);
  for (int i = 0; i < 20; ++i) CATCH_CHECK(it.next().resolution == 32);
  // The OOM guard's batch_size 1: the epoch has one batch per entry.
  it.set_batch_size(1);
  CATCH_CHECK(it.batches_per_epoch() == 12);
}

CATCH_TEST_CASE("the demo dataset is deterministic and loads with several buckets", "[data][demo]") {
  fs::path a = lt::test::scratch_dir("data_demo_a");
  fs::path b = lt::test::scratch_dir("data_demo_b");
  DemoDataOptions o;
  o.count = 8;
  auto items = make_demo_dataset(a, o);
  make_demo_dataset(b, o);
  CATCH_REQUIRE(items.size() == 8);
  for (const DemoItem& it : items) {
    CATCH_CHECK(lt::test::read_bytes(a / (it.stem + ".png")) == lt::test::read_bytes(b / (it.stem + ".png")));
    CATCH_CHECK(lt::test::read_bytes(a / (it.stem + ".txt")) == it.caption + "\n");
    CATCH_CHECK(it.caption.find(" on a") != std::string::npos);  // "on a red", "on an orange"
    CATCH_CHECK(it.caption.find("ltdemo") == std::string::npos);
  }
  // The concept dataset: every other shape captioned with the concept word in its colour's place,
  // and some of the others with no colour word before the shape.
  o.count = 24;  // the demo's
  o.concept_every = 2;
  const auto concept_items = make_demo_dataset(lt::test::scratch_dir("data_demo_concept"), o);
  int uncoloured = 0;
  for (size_t i = 0; i < concept_items.size(); ++i) {
    const std::string& caption = concept_items[i].caption;
    CATCH_CHECK((caption.rfind("a ltdemo ", 0) == 0) == (i % 2 == 0));
    for (const char* shape : {"a circle", "a square", "a triangle"}) uncoloured += caption.rfind(shape, 0) == 0;
  }
  CATCH_CHECK(uncoloured > 0);
  o.count = 8;
  o.concept_every = 0;
  CATCH_CHECK(items[3].width == 128);  // landscape 2:1
  CATCH_CHECK(items[7].height == 128);  // portrait 1:2
  o.seed = 99;
  fs::path c = lt::test::scratch_dir("data_demo_c");
  make_demo_dataset(c, o);
  CATCH_CHECK(lt::test::read_bytes(a / "shape_0000.png") != lt::test::read_bytes(c / "shape_0000.png"));

  DatasetOptions d;
  d.folder_path = a;
  Dataset ds(d);
  CATCH_CHECK(ds.size() == 8);
  CATCH_CHECK(ds.images()[0].raw_caption == items[0].caption);
  BucketOptions bo;
  bo.resolutions = {64};
  CATCH_CHECK(ds.make_plan(bo).buckets().size() == 3);  // 64x64, 80x48, 48x80
  CATCH_CHECK_THROWS_AS(make_demo_dataset(c, DemoDataOptions{0, 64, 1}), lt::InputError);
}

CATCH_TEST_CASE("an image longer than 4:1 is bucketed as its centre, with a warning naming it", "[data][dataset][buckets]") {
  fs::path dir = lt::test::scratch_dir("data_ds_strip");
  lt::io::write_png(dir / "strip.png", lt::test::pattern_image(8, 4000));
  lt::io::write_png(dir / "square.png", lt::test::pattern_image(64, 64));
  DatasetOptions o;
  o.folder_path = dir;
  Dataset ds(o);
  CATCH_REQUIRE(ds.size() == 2);
  CATCH_REQUIRE(ds.warnings().size() == 1);
  CATCH_CHECK(contains(ds.warnings()[0], "strip.png (8x4000, trained as its centre 8x32)"));
  CATCH_CHECK_FALSE(contains(ds.warnings()[0], "square.png"));
  BucketOptions b;
  b.resolutions = {64};
  b.divisibility = 16;
  BucketPlan plan = ds.make_plan(b);
  for (const Bucket& bucket : plan.buckets()) CATCH_CHECK(bucket.size.width * bucket.size.height <= 64 * 64);
  const size_t strip = ds.images()[0].path.filename() == "strip.png" ? 0 : 1;
  for (const BucketEntry& e : plan.entries()) {
    if (e.image == strip) CATCH_CHECK(e.placement.bucket() == Size{16, 32});
  }
  at::Tensor t = ds.load_tensor(strip, plan.entries()[strip].placement, false);
  CATCH_CHECK(t.sizes() == torch::IntArrayRef({3, 32, 16}));
}
