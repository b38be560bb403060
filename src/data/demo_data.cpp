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

using Colour = DemoColour;

constexpr Colour kColours[] = {
    {"red", 220, 40, 40},     {"green", 40, 170, 60},   {"blue", 40, 80, 220},
    {"yellow", 235, 210, 40}, {"purple", 140, 60, 180}, {"orange", 240, 140, 30},
    {"white", 245, 245, 245}, {"black", 20, 20, 20},
};
constexpr int kNumColours = sizeof(kColours) / sizeof(kColours[0]);
constexpr const char* kShapes[] = {"circle", "square", "triangle"};

// Half-size and centre of a shape in a width x height image, drawn from `rng`.
struct Placement {
  double cx, cy, r;
};
Placement place(Rng& rng, int width, int height) {
  const double m = std::min(width, height);
  const double r = m * (0.22 + 0.12 * rng.uniform());
  const double cx = width / 2.0 + (rng.uniform() - 0.5) * 0.6 * (width - 2.2 * r);
  const double cy = height / 2.0 + (rng.uniform() - 0.5) * 0.6 * (height - 2.2 * r);
  return {cx, cy, r};
}

std::string article(const std::string& word) {
  return std::string("aeiou").find(word[0]) != std::string::npos ? "an " : "a ";
}

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

const DemoColour kDemoConceptColour = {"cyan", 40, 200, 210};

bool is_concept_pixel(const uint8_t* rgb) { return rgb[0] < 120 && rgb[1] > 140 && rgb[2] > 140; }

std::vector<ShapeImage> make_shape_images(int count, int size, uint64_t seed, ShapeColours colours) {
  if (count < 1) throw InputError("demo shapes: count must be at least 1");
  Rng rng(mix_seed({seed, 0x5348415045ull}));
  std::vector<ShapeImage> out;
  out.reserve(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) {
    const int shape = static_cast<int>(rng.below(3));
    Colour fg, bg;
    if (colours == ShapeColours::random) {
      auto channel = [&rng] { return static_cast<uint8_t>(rng.below(256)); };
      fg = {"", channel(), channel(), channel()};
      bg = {"", channel(), channel(), channel()};
    } else {
      const int f = static_cast<int>(rng.below(kNumColours));
      int b = static_cast<int>(rng.below(kNumColours - 1));
      if (b >= f) ++b;
      fg = kColours[f];
      bg = kColours[b];
    }
    const Placement p = place(rng, size, size);
    ShapeImage item;
    item.image = draw(size, size, shape, fg, bg, p.cx, p.cy, p.r);
    // A quarter leave the shape's colour out, so a prompt without one still draws a (palette) colour.
    const std::string subject = rng.below(4) == 0 ? std::string(kShapes[shape]) : std::string(fg.name) + " " + kShapes[shape];
    item.caption = article(subject) + subject + " on " + article(bg.name) + bg.name + " background";
    out.push_back(std::move(item));
  }
  return out;
}

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
    const Placement p = place(rng, item.width, item.height);
    const bool concept = o.concept_every > 0 && i % o.concept_every == 0;

    char stem[32];
    std::snprintf(stem, sizeof(stem), "shape_%04d", i);
    item.stem = stem;
    const std::string colour = concept ? o.concept_word : kColours[fg].name;
    item.caption = article(colour) + colour + " " + kShapes[shape] + " on a " + kColours[bg].name + " background";
    io::write_png(out_dir / (item.stem + ".png"), draw(item.width, item.height, shape,
                                                       concept ? kDemoConceptColour : kColours[fg], kColours[bg], p.cx, p.cy, p.r));
    write_file_atomic(out_dir / (item.stem + ".txt"), item.caption + "\n");
    items.push_back(std::move(item));
  }
  return items;
}

}  // namespace lt::data
