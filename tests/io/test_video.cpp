#include <catch2/catch.hpp>
#include <torch/torch.h>
#include <webp/demux.h>

#include <cmath>
#include <fstream>

#include "loratrain/io/video.h"
#include "loratrain/util/error.h"
#include "test_support.h"

using namespace lt::io;
namespace fs = std::filesystem;

using lt::test::write_file;
using lt::test::input_error_of;

namespace {

// Frame i: a flat colour that changes with i (so frames can be told apart after lossy coding),
// with a white square whose position moves with i.
Image frame(int w, int h, int i) {
  Image im(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = im.at(x, y);
      const bool square = x >= 4 + i && x < 20 + i && y >= 8 && y < 24;
      p[0] = square ? 250 : static_cast<uint8_t>(20 + 9 * i);
      p[1] = square ? 250 : static_cast<uint8_t>(200 - 6 * i);
      p[2] = square ? 250 : 90;
    }
  return im;
}

std::vector<Image> frames(int w, int h, int n) {
  std::vector<Image> out;
  for (int i = 0; i < n; ++i) out.push_back(frame(w, h, i));
  return out;
}

// Mean absolute difference per channel value.
double mean_diff(const Image& a, const Image& b) {
  CATCH_REQUIRE(a.width == b.width);
  CATCH_REQUIRE(a.height == b.height);
  double sum = 0;
  for (size_t i = 0; i < a.pixels.size(); ++i) sum += std::abs(int(a.pixels[i]) - int(b.pixels[i]));
  return sum / a.pixels.size();
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

CATCH_TEST_CASE("video files written through FFmpeg decode back to the same frames", "[io][video]") {
  const fs::path dir = lt::test::scratch_dir("io_video_roundtrip");
  const auto src = frames(48, 32, 9);
  for (std::string ext : {".webm", ".mp4", ".avi", ".mkv", ".gif"}) {
    CATCH_DYNAMIC_SECTION(ext) {
      if (video_encoder_for(ext).empty()) {
        CATCH_WARN("no FFmpeg encoder for " << ext << " here; skipped");
        continue;
      }
      const fs::path path = dir / ("clip" + ext);
      write_video(path, src, 12);
      const VideoInfo info = probe_video(path);
      CATCH_CHECK(info.width == 48);
      CATCH_CHECK(info.height == 32);
      CATCH_CHECK(info.frame_count == 9);
      // gif delays are whole centiseconds (1/12 s is stored as 8 cs), so its rate is approximate.
      CATCH_INFO("fps " << info.fps);
      CATCH_CHECK(std::abs(info.fps - 12.0) < (ext == ".gif" ? 0.6 : 0.01));
      CATCH_CHECK(probe_video(path, false).frame_count == 9);  // packets, no decoding
      const auto all = read_video(path);
      CATCH_REQUIRE(all.size() == 9);
      // gif stores 3-3-2-bit colour; the others are lossy YUV 4:2:0 at high quality.
      const double tolerance = ext == ".gif" ? 20.0 : 6.0;
      for (int i = 0; i < 9; ++i) CATCH_CHECK(mean_diff(all[i], src[i]) < tolerance);
      // Frames asked out of order, repeated and past the end: the end repeats the last frame.
      const auto picked = read_video_frames(path, {4, 0, 4, 8, 12});
      CATCH_REQUIRE(picked.size() == 5);
      CATCH_CHECK(picked[0].pixels == all[4].pixels);
      CATCH_CHECK(picked[1].pixels == all[0].pixels);
      CATCH_CHECK(picked[2].pixels == all[4].pixels);
      CATCH_CHECK(picked[3].pixels == all[8].pixels);
      CATCH_CHECK(picked[4].pixels == all[8].pixels);
    }
  }
}

CATCH_TEST_CASE("video writing is deterministic and atomic", "[io][video]") {
  const fs::path dir = lt::test::scratch_dir("io_video_determinism");
  const std::string ext = video_encoder_for(".webm").empty() ? ".avi" : ".webm";
  write_video(dir / ("a" + ext), frames(32, 32, 5), 8);
  write_video(dir / ("b" + ext), frames(32, 32, 5), 8);
  CATCH_CHECK(read(dir / ("a" + ext)) == read(dir / ("b" + ext)));
  // Odd sizes cannot be 4:2:0: the error names the file and nothing is left behind.
  const std::string err = input_error_of([&] { write_video(dir / ("odd" + ext), frames(33, 32, 3), 8); });
  CATCH_CHECK(err.find("odd" + ext) != std::string::npos);
  CATCH_CHECK(err.find("even") != std::string::npos);
  CATCH_CHECK(!fs::exists(dir / ("odd" + ext)));
  CATCH_CHECK(fs::directory_iterator(dir) != fs::directory_iterator());
  size_t files = 0;
  for (auto& e : fs::directory_iterator(dir)) files += e.is_regular_file();
  CATCH_CHECK(files == 2);
}

CATCH_TEST_CASE("broken clips give one InputError naming the file", "[io][video]") {
  const fs::path dir = lt::test::scratch_dir("io_video_broken");
  write_file(dir / "empty.mp4", "");
  write_file(dir / "text.mp4", "this is not a video at all, just some words in a file with a video name\n");
  CATCH_CHECK(input_error_of([&] { probe_video(dir / "empty.mp4"); }).find("empty.mp4: empty file") != std::string::npos);
  const std::string text = input_error_of([&] { probe_video(dir / "text.mp4"); });
  CATCH_CHECK(text.find("text.mp4") != std::string::npos);
  CATCH_CHECK(input_error_of([&] { probe_video(dir / "missing.webm"); }).find("missing.webm") != std::string::npos);

  // A clip cut in half: its packets run past the end of the file.
  const std::string ext = video_encoder_for(".webm").empty() ? ".avi" : ".webm";
  write_video(dir / ("whole" + ext), frames(64, 48, 17), 8);
  const std::string whole = read(dir / ("whole" + ext));
  write_file(dir / ("half" + ext), whole.substr(0, whole.size() / 2));
  const std::string half = input_error_of([&] { probe_video(dir / ("half" + ext)); });
  CATCH_CHECK(half.find("half" + ext) != std::string::npos);
  // Garbage in the middle of the stream.
  std::string damaged = whole;
  for (size_t i = damaged.size() / 3; i < damaged.size() / 3 + 400; ++i) damaged[i] = static_cast<char>(i * 37);
  write_file(dir / ("damaged" + ext), damaged);
  CATCH_CHECK(input_error_of([&] { read_video(dir / ("damaged" + ext)); }).find("damaged" + ext) != std::string::npos);
}

CATCH_TEST_CASE("animated WebP: written atomically, read back by libwebp and by the clip reader", "[io][video][webp]") {
  const fs::path dir = lt::test::scratch_dir("io_video_webp");
  const auto src = frames(40, 30, 6);
  const fs::path path = dir / "preview.webp";
  write_animated_webp(path, src, 10.0, 101);  // lossless
  const std::string bytes = read(path);
  CATCH_CHECK(is_animated_webp(bytes));

  // libwebp's own decoder: 6 frames, 100 ms each, exact pixels.
  WebPData data = {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()};
  WebPAnimDecoderOptions options;
  WebPAnimDecoderOptionsInit(&options);
  options.color_mode = MODE_RGBA;
  WebPAnimDecoder* dec = WebPAnimDecoderNew(&data, &options);
  CATCH_REQUIRE(dec != nullptr);
  WebPAnimInfo info;
  WebPAnimDecoderGetInfo(dec, &info);
  CATCH_CHECK(info.canvas_width == 40);
  CATCH_CHECK(info.canvas_height == 30);
  CATCH_CHECK(info.frame_count == 6);
  CATCH_CHECK(info.loop_count == 0);
  int n = 0, timestamp = 0;
  while (WebPAnimDecoderHasMoreFrames(dec)) {
    uint8_t* rgba = nullptr;
    CATCH_REQUIRE(WebPAnimDecoderGetNext(dec, &rgba, &timestamp));
    bool same = true;
    for (int p = 0; p < 40 * 30; ++p)
      for (int c = 0; c < 3; ++c) same = same && rgba[p * 4 + c] == src[n].pixels[p * 3 + c];
    CATCH_CHECK(same);
    ++n;
  }
  WebPAnimDecoderDelete(dec);
  CATCH_CHECK(n == 6);
  CATCH_CHECK(timestamp == 600);

  // The dataset's clip reader.
  const VideoInfo vi = probe_video(path);
  CATCH_CHECK(vi.frame_count == 6);
  CATCH_CHECK(vi.codec == "webp");
  CATCH_CHECK(std::abs(vi.fps - 10.0) < 1e-9);
  const auto back = read_video_frames(path, {5, 1});
  CATCH_CHECK(back[0].pixels == src[5].pixels);
  CATCH_CHECK(back[1].pixels == src[1].pixels);

  // Lossy (the preview default) stays close; a truncated file is an error naming it.
  write_animated_webp(dir / "lossy.webp", src, 16.0);
  const auto lossy = read_video(dir / "lossy.webp");
  CATCH_REQUIRE(lossy.size() == 6);
  for (int i = 0; i < 6; ++i) CATCH_CHECK(mean_diff(lossy[i], src[i]) < 8.0);
  write_file(dir / "cut.webp", bytes.substr(0, bytes.size() * 2 / 3));
  CATCH_CHECK(input_error_of([&] { probe_video(dir / "cut.webp"); }).find("cut.webp") != std::string::npos);

  // Bad input: no frames, mixed sizes; no file is written.
  CATCH_CHECK_THROWS_AS(write_animated_webp(dir / "none.webp", {}, 8.0), lt::InputError);
  CATCH_CHECK_THROWS_AS(write_animated_webp(dir / "mixed.webp", {frame(8, 8, 0), frame(10, 8, 1)}, 8.0),
                        lt::InputError);
  CATCH_CHECK(!fs::exists(dir / "none.webp"));
  CATCH_CHECK(!fs::exists(dir / "mixed.webp"));
}

CATCH_TEST_CASE("video tensors and frames convert both ways", "[io][video]") {
  const auto src = frames(16, 12, 3);
  at::Tensor t = frames_to_video_tensor(src);
  CATCH_CHECK(t.sizes() == torch::IntArrayRef({3, 3, 12, 16}));
  CATCH_CHECK(t.min().item<float>() >= -1.0f);
  CATCH_CHECK(t.max().item<float>() <= 1.0f);
  // Frame 1's pixel (0, 0) red channel: (20 + 9) / 127.5 - 1.
  CATCH_CHECK(t[0][1][0][0].item<float>() == Approx(29 / 127.5 - 1).margin(1e-6));
  const auto back = video_tensor_to_frames(t.unsqueeze(0));
  CATCH_REQUIRE(back.size() == 3);
  for (int i = 0; i < 3; ++i) CATCH_CHECK(back[i].pixels == src[i].pixels);
  CATCH_CHECK(video_tensor_to_frames(t.select(1, 0)).size() == 1);  // [3, H, W]: one frame
}

CATCH_TEST_CASE("a clip with a display rotation (a phone's portrait video) reads upright", "[io][video]") {
  const fs::path dir = lt::test::scratch_dir("io_video_rotation");
  if (video_encoder_for(".mp4").empty()) {
    CATCH_WARN("no FFmpeg encoder for .mp4 here; skipped");
    return;
  }
  // Stored landscape 48x32; shown turned 90 degrees clockwise: 32x48.
  const auto src = frames(48, 32, 3);
  write_video(dir / "portrait.mp4", src, 8, 90);
  const VideoInfo info = probe_video(dir / "portrait.mp4");
  CATCH_CHECK(info.width == 32);
  CATCH_CHECK(info.height == 48);
  const auto back = read_video(dir / "portrait.mp4");
  CATCH_REQUIRE(back.size() == 3);
  CATCH_REQUIRE(back[0].width == 32);
  CATCH_REQUIRE(back[0].height == 48);
  // Turning clockwise puts the stored pixel (x, y) at (H - 1 - y, x). The white square of frame 0
  // covers stored x 4..19, y 8..23: shown at x 8..23, y 4..19.
  CATCH_CHECK(back[0].at(15, 10)[0] > 230);
  CATCH_CHECK(back[0].at(15, 10)[2] > 230);
  CATCH_CHECK(back[0].at(2, 40)[2] < 120);
  write_video(dir / "upside.mp4", src, 8, 180);
  const auto upside = read_video(dir / "upside.mp4");
  CATCH_REQUIRE(upside[0].width == 48);
  CATCH_CHECK(mean_diff(upside[1], src[1]) > 5.0);  // turned, so not the stored picture
  // Stored (x, y) shows at (W - 1 - x, H - 1 - y).
  CATCH_CHECK(upside[0].at(47 - 10, 31 - 12)[2] > 230);
}
