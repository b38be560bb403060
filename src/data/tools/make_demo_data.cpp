// lt-make-demo-data OUT_DIR [--count N] [--size S] [--seed K]
// Writes the embedded demo's dataset: procedurally drawn coloured shapes (circle, square,
// triangle) on plain backgrounds, PNG + caption sidecar each ("a red circle on a blue
// background"). Deterministic for a given (count, size, seed). Some images are non-square so the
// demo exercises more than one bucket.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "loratrain/data/rng.h"
#include "loratrain/io/image.h"
#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"

namespace {

struct Colour {
  const char* name;
  uint8_t r, g, b;
};

constexpr Colour kColours[] = {
    {"red", 220, 40, 40},     {"green", 40, 170, 60},   {"blue", 40, 80, 220},
    {"yellow", 235, 210, 40}, {"purple", 140, 60, 180}, {"orange", 240, 140, 30},
    {"white", 245, 245, 245}, {"black", 20, 20, 20},
};
constexpr int kNumColours = sizeof(kColours) / sizeof(kColours[0]);
constexpr const char* kShapes[] = {"circle", "square", "triangle"};

// Coverage of a shape at a point, in the shape's own frame (centre cx, cy; half-size r).
bool inside(int shape, double x, double y, double cx, double cy, double r) {
  const double dx = x - cx, dy = y - cy;
  switch (shape) {
    case 0: return dx * dx + dy * dy <= r * r;
    case 1: return std::fabs(dx) <= r && std::fabs(dy) <= r;
    default: {
      // Upward equilateral-ish triangle: apex (cx, cy - r), base at cy + r.
      if (dy > r || dy < -r) return false;
      const double half_width = r * (dy + r) / (2.0 * r);
      return std::fabs(dx) <= half_width;
    }
  }
}

lt::io::Image draw(int width, int height, int shape, const Colour& fg, const Colour& bg,
                   double cx, double cy, double r) {
  lt::io::Image im(width, height);
  constexpr int kSub = 4;  // 4x4 supersampling for smooth edges
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      int hits = 0;
      for (int sy = 0; sy < kSub; ++sy)
        for (int sx = 0; sx < kSub; ++sx)
          hits += inside(shape, x + (sx + 0.5) / kSub, y + (sy + 0.5) / kSub, cx, cy, r);
      const double a = hits / double(kSub * kSub);
      uint8_t* p = im.at(x, y);
      p[0] = static_cast<uint8_t>(std::lround(bg.r + a * (fg.r - bg.r)));
      p[1] = static_cast<uint8_t>(std::lround(bg.g + a * (fg.g - bg.g)));
      p[2] = static_cast<uint8_t>(std::lround(bg.b + a * (fg.b - bg.b)));
    }
  }
  return im;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Generate the lora-train demo dataset (coloured shapes with captions)"};
  std::string out_dir;
  int count = 24;
  int size = 64;
  uint64_t seed = 1234;
  app.add_option("out_dir", out_dir, "folder to write images and captions into")->required();
  app.add_option("--count", count, "number of images")->check(CLI::Range(1, 100000));
  app.add_option("--size", size, "base image size in pixels (images are size to 1.5*size)")
      ->check(CLI::Range(16, 4096));
  app.add_option("--seed", seed, "random seed");
  CLI11_PARSE(app, argc, argv);

  try {
    namespace fs = std::filesystem;
    fs::create_directories(out_dir);
    lt::data::Rng rng(lt::data::mix_seed({seed, 0x44454d4full}));
    const int step = std::max(8, size / 8);
    for (int i = 0; i < count; ++i) {
      // Every fourth image is landscape or portrait (3:2); the rest square, size..1.5*size.
      int w, h;
      if (i % 4 == 3) {
        const int long_side = size * 3 / 2;
        w = (i % 8 == 3) ? long_side : size;
        h = (i % 8 == 3) ? size : long_side;
      } else {
        w = h = size + step * static_cast<int>(rng.below(static_cast<uint64_t>(size / 2 / step + 1)));
      }
      const int shape = static_cast<int>(rng.below(3));
      const int fg = static_cast<int>(rng.below(kNumColours));
      int bg = static_cast<int>(rng.below(kNumColours - 1));
      if (bg >= fg) ++bg;  // background never matches the shape
      const double m = std::min(w, h);
      const double r = m * (0.22 + 0.12 * rng.uniform());
      const double cx = w / 2.0 + (rng.uniform() - 0.5) * 0.6 * (w - 2.2 * r);
      const double cy = h / 2.0 + (rng.uniform() - 0.5) * 0.6 * (h - 2.2 * r);
      lt::io::Image im = draw(w, h, shape, kColours[fg], kColours[bg], cx, cy, r);

      char stem[32];
      std::snprintf(stem, sizeof(stem), "shape_%04d", i);
      const char* article = kColours[fg].name[0] == 'o' ? "an " : "a ";
      const std::string caption = std::string(article) + kColours[fg].name + " " + kShapes[shape] +
                                  " on a " + kColours[bg].name + " background";
      lt::io::write_png(fs::path(out_dir) / (std::string(stem) + ".png"), im);
      lt::write_file_atomic(fs::path(out_dir) / (std::string(stem) + ".txt"), caption + "\n");
    }
    spdlog::info("wrote {} images with captions to {}", count, out_dir);
  } catch (const lt::Error& e) {
    spdlog::error("{}", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  return 0;
}
