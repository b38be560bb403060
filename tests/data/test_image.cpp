#include <catch2/catch.hpp>
#include <stb_image_write.h>
#include <torch/torch.h>
#include <webp/encode.h>

#include <cmath>

#include "data_test_util.h"
#include "loratrain/io/image.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

using lt::io::Image;
using lt::io::ResizeFilter;

namespace {

void append(void* ctx, void* data, int size) {
  static_cast<std::string*>(ctx)->append(static_cast<const char*>(data), size);
}

std::string encode_jpeg(const Image& im, int quality = 95) {
  std::string out;
  if (!stbi_write_jpg_to_func(append, &out, im.width, im.height, 3, im.pixels.data(), quality))
    throw std::runtime_error("jpeg encode failed");
  return out;
}

std::string encode_bmp(const Image& im) {
  std::string out;
  if (!stbi_write_bmp_to_func(append, &out, im.width, im.height, 3, im.pixels.data()))
    throw std::runtime_error("bmp encode failed");
  return out;
}

std::string decode_error(const std::string& bytes, const std::string& name) {
  try {
    lt::io::decode_image(bytes, name);
  } catch (const lt::InputError& e) {
    return e.what();
  }
  return "";
}

Image solid(int w, int h, uint8_t r, uint8_t g, uint8_t b) {
  Image im(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      im.at(x, y)[0] = r;
      im.at(x, y)[1] = g;
      im.at(x, y)[2] = b;
    }
  return im;
}

}  // namespace

CATCH_TEST_CASE("PNG encode and decode round trip exactly, also through a file", "[data][image]") {
  Image im = lt::test::pattern_image(37, 21, 3);
  Image back = lt::io::decode_image(lt::io::encode_png(im), "mem.png");
  CATCH_CHECK(back.width == 37);
  CATCH_CHECK(back.height == 21);
  CATCH_CHECK(back.pixels == im.pixels);

  auto dir = lt::test::scratch_dir("data_png");
  lt::io::write_png(dir / "a.png", im);
  CATCH_CHECK(lt::io::read_image(dir / "a.png").pixels == im.pixels);
  // Atomic write: no temporary file is left beside the target.
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  CATCH_CHECK(files == 1);
}

CATCH_TEST_CASE("BMP, JPEG and WebP decode", "[data][image]") {
  Image im = lt::test::pattern_image(24, 16, 1);
  CATCH_CHECK(lt::io::decode_image(encode_bmp(im), "x.bmp").pixels == im.pixels);

  Image flat = solid(32, 16, 200, 60, 30);
  Image jpg = lt::io::decode_image(encode_jpeg(flat), "x.jpg");
  CATCH_REQUIRE(jpg.width == 32);
  CATCH_REQUIRE(jpg.height == 16);
  CATCH_CHECK(std::abs(int(jpg.at(10, 8)[0]) - 200) <= 4);
  CATCH_CHECK(std::abs(int(jpg.at(10, 8)[1]) - 60) <= 4);

  uint8_t* webp = nullptr;
  size_t n = WebPEncodeLosslessRGB(im.pixels.data(), im.width, im.height, im.width * 3, &webp);
  CATCH_REQUIRE(n > 0);
  std::string bytes(reinterpret_cast<char*>(webp), n);
  WebPFree(webp);
  Image back = lt::io::decode_image(bytes, "x.webp");
  CATCH_CHECK(back.pixels == im.pixels);
  auto size = lt::io::probe_image_size(bytes, "x.webp");
  CATCH_CHECK(size.width == 24);
  CATCH_CHECK(size.height == 16);
}

CATCH_TEST_CASE("alpha is dropped, grey images become RGB", "[data][image]") {
  // RGBA with a fully transparent pixel: PIL's convert("RGB") keeps the colour, drops alpha.
  const unsigned char rgba[] = {10, 20, 30, 0, 200, 100, 50, 255};
  std::string png;
  CATCH_REQUIRE(stbi_write_png_to_func(append, &png, 2, 1, 4, rgba, 8));
  Image im = lt::io::decode_image(png, "alpha.png");
  CATCH_REQUIRE(im.width == 2);
  CATCH_CHECK(std::vector<uint8_t>(im.pixels.begin(), im.pixels.end()) ==
              std::vector<uint8_t>{10, 20, 30, 200, 100, 50});
  const unsigned char grey[] = {7, 250};
  std::string gpng;
  CATCH_REQUIRE(stbi_write_png_to_func(append, &gpng, 2, 1, 1, grey, 2));
  Image g = lt::io::decode_image(gpng, "grey.png");
  CATCH_CHECK(std::vector<uint8_t>(g.pixels.begin(), g.pixels.end()) ==
              std::vector<uint8_t>{7, 7, 7, 250, 250, 250});
}

CATCH_TEST_CASE("JPEG EXIF orientation is applied like exif_transpose", "[data][image]") {
  // Left half red, right half blue, 32x16; orientation 6 = rotate 90 degrees clockwise.
  Image im(32, 16);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 32; ++x) {
      im.at(x, y)[0] = x < 16 ? 230 : 20;
      im.at(x, y)[2] = x < 16 ? 20 : 230;
    }
  std::string jpg = encode_jpeg(im);
  const unsigned char app1[] = {0xFF, 0xE1, 0x00, 0x22, 'E', 'x', 'i', 'f', 0, 0,
                                'I', 'I', 0x2A, 0x00, 0x08, 0x00, 0x00, 0x00,  // TIFF header
                                0x01, 0x00,                                      // 1 entry
                                0x12, 0x01, 0x03, 0x00, 0x01, 0x00, 0x00, 0x00,  // 0x0112 SHORT
                                0x06, 0x00, 0x00, 0x00,                          // value 6
                                0x00, 0x00, 0x00, 0x00};                         // no next IFD
  jpg.insert(2, reinterpret_cast<const char*>(app1), sizeof(app1));
  Image rotated = lt::io::decode_image(jpg, "rot.jpg");
  CATCH_REQUIRE(rotated.width == 16);
  CATCH_REQUIRE(rotated.height == 32);
  CATCH_CHECK(rotated.at(8, 4)[0] > 180);   // the left half went to the top
  CATCH_CHECK(rotated.at(8, 28)[2] > 180);  // the right half to the bottom
  auto size = lt::io::probe_image_size(jpg, "rot.jpg");
  CATCH_CHECK(size.width == 16);
  CATCH_CHECK(size.height == 32);
}

CATCH_TEST_CASE("corrupt, truncated and unsupported images name the file", "[data][image]") {
  Image im = lt::test::pattern_image(40, 30, 2);
  std::string png = lt::io::encode_png(im);
  std::string jpg = encode_jpeg(im);

  std::string e = decode_error(png.substr(0, png.size() / 2), "cut.png");
  CATCH_CHECK(e.find("cut.png") != std::string::npos);
  CATCH_CHECK(e.find("truncated") != std::string::npos);

  e = decode_error(jpg.substr(0, jpg.size() * 2 / 3), "cut.jpg");
  CATCH_CHECK(e.find("cut.jpg") != std::string::npos);
  CATCH_CHECK(e.find("truncated") != std::string::npos);

  e = decode_error("this is not an image at all", "notes.png");
  CATCH_CHECK(e.find("notes.png") != std::string::npos);
  CATCH_CHECK(e.find("not a supported image") != std::string::npos);

  CATCH_CHECK(decode_error("", "empty.jpg").find("empty.jpg: empty file") != std::string::npos);

  std::string garbage = png;  // valid chunk chain, scrambled compressed data
  for (size_t i = 60; i + 20 < garbage.size(); i += 3) garbage[i] = static_cast<char>(garbage[i] ^ 0x5A);
  CATCH_CHECK(decode_error(garbage, "bad.png").find("bad.png") == 0);

  auto dir = lt::test::scratch_dir("data_image_errors");
  try {
    lt::io::read_image(dir / "missing.png");
    CATCH_FAIL("no error for a missing file");
  } catch (const lt::InputError& err) {
    CATCH_CHECK(std::string(err.what()).find("missing.png: cannot read") != std::string::npos);
  }
}

CATCH_TEST_CASE("downscaling is antialiased: a checkerboard becomes mid grey", "[data][image]") {
  Image board(64, 64);
  for (int y = 0; y < 64; ++y)
    for (int x = 0; x < 64; ++x)
      std::fill_n(board.at(x, y), 3, ((x + y) % 2) ? 255 : 0);
  for (ResizeFilter f : {ResizeFilter::Box, ResizeFilter::Bilinear, ResizeFilter::Bicubic,
                         ResizeFilter::Lanczos}) {
    Image small = lt::io::resize(board, 16, 12, f);
    CATCH_REQUIRE(small.width == 16);
    CATCH_REQUIRE(small.height == 12);
    int worst = 0;
    for (uint8_t v : small.pixels) worst = std::max(worst, std::abs(int(v) - 128));
    CATCH_CHECK(worst <= 4);
  }
}

CATCH_TEST_CASE("resize matches area means and preserves flat colour", "[data][image]") {
  // Horizontal ramp 0..255: a 4x box downscale gives the exact mean of each group of 4.
  Image ramp(256, 8);
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 256; ++x) std::fill_n(ramp.at(x, y), 3, static_cast<uint8_t>(x));
  Image box = lt::io::resize(ramp, 64, 8, ResizeFilter::Box);
  for (int x = 0; x < 64; ++x) CATCH_CHECK(int(box.at(x, 3)[0]) == std::lround(4 * x + 1.5));
  // Bicubic and Lanczos agree with the mean away from the borders (linear data, symmetric kernel).
  for (ResizeFilter f : {ResizeFilter::Bicubic, ResizeFilter::Lanczos}) {
    Image r = lt::io::resize(ramp, 64, 8, f);
    for (int x = 2; x < 62; ++x) CATCH_CHECK(std::abs(int(r.at(x, 3)[1]) - (4 * x + 2)) <= 1);
  }
  // Non-integer factors, both directions: a flat image stays flat (weights are normalised).
  Image flat = solid(50, 30, 10, 128, 250);
  for (auto [w, h] : {std::pair{17, 11}, std::pair{131, 77}}) {
    Image r = lt::io::resize(flat, w, h, ResizeFilter::Lanczos);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x) {
        CATCH_CHECK(r.at(x, y)[0] == 10);
        CATCH_CHECK(r.at(x, y)[2] == 250);
      }
  }
  // Mean brightness is preserved by a 3.3x bicubic downscale of a busy image.
  Image busy = lt::test::pattern_image(330, 200, 5);
  Image down = lt::io::resize(busy, 100, 61, ResizeFilter::Bicubic);
  auto mean = [](const Image& im) {
    double s = 0;
    for (uint8_t v : im.pixels) s += v;
    return s / im.pixels.size();
  };
  CATCH_CHECK(std::fabs(mean(down) - mean(busy)) < 1.5);
  // Planar float variant agrees with the uint8 path before rounding.
  std::vector<float> planar(3 * 256 * 8);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 256; ++x) planar[(c * 8 + y) * 256 + x] = static_cast<float>(x);
  auto pr = lt::io::resize_planar(planar, 3, 256, 8, 64, 8, ResizeFilter::Box);
  CATCH_CHECK(pr[(2 * 8 + 3) * 64 + 10] == Approx(41.5f));
}

CATCH_TEST_CASE("crop, centre crop, flip and tensor conversion", "[data][image]") {
  Image im = lt::test::pattern_image(10, 6, 0);
  Image c = lt::io::crop(im, 2, 1, 5, 3);
  CATCH_CHECK(std::equal(c.at(0, 0), c.at(0, 0) + 3, im.at(2, 1)));
  CATCH_CHECK(std::equal(c.at(4, 2), c.at(4, 2) + 3, im.at(6, 3)));
  Image cc = lt::io::center_crop(im, 7, 4);  // offsets (10-7)/2 = 1, (6-4)/2 = 1
  CATCH_CHECK(std::equal(cc.at(0, 0), cc.at(0, 0) + 3, im.at(1, 1)));
  CATCH_CHECK_THROWS_AS(lt::io::crop(im, 6, 0, 5, 3), lt::Error);
  Image f = lt::io::flip_horizontal(im);
  CATCH_CHECK(std::equal(f.at(0, 2), f.at(0, 2) + 3, im.at(9, 2)));
  CATCH_CHECK(lt::io::flip_horizontal(f).pixels == im.pixels);

  at::Tensor t = lt::io::image_to_tensor(im);
  CATCH_REQUIRE(t.sizes() == torch::IntArrayRef({3, 6, 10}));
  CATCH_CHECK(t.min().item<float>() >= -1.0f);
  CATCH_CHECK(t.max().item<float>() <= 1.0f);
  CATCH_CHECK(t[1][2][3].item<float>() == Approx(im.at(3, 2)[1] / 127.5 - 1.0));
  CATCH_CHECK(lt::io::tensor_to_image(t).pixels == im.pixels);
  // Out-of-range values clamp; a batch of one and other dtypes are accepted.
  CATCH_CHECK(lt::io::tensor_to_image(torch::full({1, 3, 2, 2}, 5.0, torch::kFloat64)).at(1, 1)[0] == 255);
  CATCH_CHECK(lt::io::tensor_to_image(torch::full({3, 2, 2}, -5.0)).at(1, 1)[2] == 0);
}

CATCH_TEST_CASE("image grids place cells with padding", "[data][image]") {
  std::vector<Image> cells = {solid(8, 8, 255, 0, 0), solid(8, 8, 0, 255, 0), solid(6, 6, 0, 0, 255)};
  Image g = lt::io::make_grid(cells, 2, 1, 7);
  CATCH_REQUIRE(g.width == 2 * 8 + 3);
  CATCH_REQUIRE(g.height == 2 * 8 + 3);
  CATCH_CHECK(g.at(0, 0)[0] == 7);          // border
  CATCH_CHECK(g.at(1, 1)[0] == 255);        // first cell
  CATCH_CHECK(g.at(10, 1)[1] == 255);       // second cell, after 1 px padding
  CATCH_CHECK(g.at(1 + 1, 10 + 1)[2] == 255);  // third, centred in its 8x8 cell
  CATCH_CHECK(g.at(1, 10)[2] == 7);         // outside the smaller image: background
  CATCH_CHECK(lt::io::make_grid(cells).width == 2 * 8 + 3 * 2);  // auto columns = ceil(sqrt(3))
}
