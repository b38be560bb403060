#include "loratrain/data/demo_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loratrain/data/rng.h"
#include "loratrain/io/image.h"
#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"

namespace lt::data {

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

// Whether (x, y) lies in the shape centred at (cx, cy) with half-size r.
bool inside(int shape, double x, double y, double cx, double cy, double r) {
  const double dx = x - cx, dy = y - cy;
  switch (shape) {
    case 0: return dx * dx + dy * dy <= r * r;
    case 1: return std::fabs(dx) <= r && std::fabs(dy) <= r;
    default: {
      // Apex at (cx, cy - r), base of width 2r at cy + r.
      if (dy > r || dy < -r) return false;
      return std::fabs(dx) <= (dy + r) / 2.0;
    }
  }
}

io::Image draw(int width, int height, int shape, const Colour& fg, const Colour& bg, double cx,
               double cy, double r) {
  io::Image im(width, height);
  constexpr int kSub = 4;  // 4x4 supersampling: smooth edges, like a real photo's
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

std::vector<DemoItem> make_demo_dataset(const std::filesystem::path& out_dir,
                                        const DemoDataOptions& o) {
  if (o.count < 1) throw InputError("demo data: count must be at least 1");
  if (o.size < 16 || o.size > 4096) throw InputError("demo data: size must be 16..4096");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw InputError("demo data: cannot create " + out_dir.string() + ": " + ec.message());

  Rng rng(mix_seed({o.seed, 0x44454d4full}));
  const int step = std::max(8, o.size / 8);
  std::vector<DemoItem> items;
  for (int i = 0; i < o.count; ++i) {
    DemoItem item;
    if (i % 4 == 3) {
      // 2:1, so that at resolution == size it lands in its own bucket (80x48 for 64, div 16);
      // 3:2 would snap back to the square bucket.
      const int long_side = o.size * 2;
      const bool landscape = i % 8 == 3;
      item.width = landscape ? long_side : o.size;
      item.height = landscape ? o.size : long_side;
    } else {
      item.width = item.height =
          o.size + step * static_cast<int>(rng.below(static_cast<uint64_t>(o.size / 2 / step + 1)));
    }
    const int shape = static_cast<int>(rng.below(3));
    const int fg = static_cast<int>(rng.below(kNumColours));
    int bg = static_cast<int>(rng.below(kNumColours - 1));
    if (bg >= fg) ++bg;  // the background never matches the shape
    const double m = std::min(item.width, item.height);
    const double r = m * (0.22 + 0.12 * rng.uniform());
    const double cx = item.width / 2.0 + (rng.uniform() - 0.5) * 0.6 * (item.width - 2.2 * r);
    const double cy = item.height / 2.0 + (rng.uniform() - 0.5) * 0.6 * (item.height - 2.2 * r);

    char stem[32];
    std::snprintf(stem, sizeof(stem), "shape_%04d", i);
    item.stem = stem;
    const char* article = kColours[fg].name[0] == 'o' ? "an " : "a ";
    item.caption = std::string(article) + kColours[fg].name + " " + kShapes[shape] + " on a " +
                   kColours[bg].name + " background";
    io::write_png(out_dir / (item.stem + ".png"),
                  draw(item.width, item.height, shape, kColours[fg], kColours[bg], cx, cy, r));
    write_file_atomic(out_dir / (item.stem + ".txt"), item.caption + "\n");
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace lt::data
