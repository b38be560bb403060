#include "loratrain/data/demo_data.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "loratrain/data/rng.h"
#include "loratrain/io/image.h"
#include "loratrain/io/video.h"
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
struct ShapePlacement {
  double cx, cy, r;
};
ShapePlacement place(Rng& rng, int width, int height) {
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

bool is_unseen_colour(const uint8_t* rgb, const DemoColour& background) {
  // 20 levels of margin around the concept region: a model that never saw these colours does not
  // drift into the concept's, and draws the colours around it.
  auto near_concept = [](double r, double g, double b) { return r < 140 && g > 120 && b > 120; };
  // The shape's antialiased edge blends it with the background.
  for (int k = 0; k <= 16; ++k) {
    const double a = k / 16.0;
    if (near_concept(rgb[0] + a * (background.r - rgb[0]), rgb[1] + a * (background.g - rgb[1]),
                     rgb[2] + a * (background.b - rgb[2]))) {
      return false;
    }
  }
  for (const Colour& c : kColours) {
    const double dr = rgb[0] - c.r, dg = rgb[1] - c.g, db = rgb[2] - c.b;
    if (dr * dr + dg * dg + db * db < 60.0 * 60.0) return false;
  }
  return true;
}

std::vector<ShapeImage> make_shape_images(int count, int size, uint64_t seed, ShapeColours colours,
                                          const OtherColourWords& others) {
  if (count < 1) throw InputError("demo shapes: count must be at least 1");
  if (!(others.share >= 0.0 && others.share <= 1.0)) throw InputError("demo shapes: the other words' share must be in [0, 1]");
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
    const ShapePlacement p = place(rng, size, size);
    // A quarter leave the shape's colour out, so a prompt without one still draws a (palette) colour.
    const bool named = rng.below(4) != 0;
    std::string colour_word = fg.name;
    bool other_word = false;
    // (No draw without other words: the palette captions stay as they were.)
    if (named && colours == ShapeColours::palette && !others.words.empty() && others.share > 0 &&
        rng.uniform() < others.share) {
      other_word = true;
      colour_word = others.words[rng.below(others.words.size())];
      uint8_t rgb[3];
      do {
        for (auto& v : rgb) v = static_cast<uint8_t>(rng.below(256));
      } while (!is_unseen_colour(rgb, bg));
      fg = {"", rgb[0], rgb[1], rgb[2]};
    }
    ShapeImage item;
    item.other_word = other_word;
    item.image = draw(size, size, shape, fg, bg, p.cx, p.cy, p.r);
    const std::string subject = named ? colour_word + " " + kShapes[shape] : std::string(kShapes[shape]);
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
    const ShapePlacement p = place(rng, item.width, item.height);
    const bool concept = o.concept_every > 0 && i % o.concept_every == 0;

    char stem[32];
    std::snprintf(stem, sizeof(stem), "shape_%04d", i);
    item.stem = stem;
    // In a concept dataset, half the other shapes' captions name no colour, as a quarter of the base's
    // did: the LoRA then learns that a missing colour word is not the concept word.
    const bool plain = !concept && o.concept_every > 0 && rng.below(2) == 0;
    const std::string colour = concept ? o.concept_word : kColours[fg].name;
    const std::string subject = plain ? std::string(kShapes[shape]) : colour + " " + kShapes[shape];
    item.caption = article(subject) + subject + " on " + article(kColours[bg].name) + kColours[bg].name + " background";
    io::write_png(out_dir / (item.stem + ".png"), draw(item.width, item.height, shape,
                                                       concept ? kDemoConceptColour : kColours[fg], kColours[bg], p.cx, p.cy, p.r));
    write_file_atomic(out_dir / (item.stem + ".txt"), item.caption + "\n");
    items.push_back(std::move(item));
  }
  return items;
}

std::vector<DemoClip> make_demo_video_dataset(const std::filesystem::path& out_dir,
                                              const DemoVideoOptions& o) {
  if (o.count < 1) throw InputError("demo video: count must be at least 1");
  if (o.size < 16 || o.size > 1024 || o.size % 2) throw InputError("demo video: size must be even, 16..1024");
  if (o.min_frames < 1 || o.max_frames < o.min_frames || o.max_frames > 257)
    throw InputError("demo video: need 1 <= min_frames <= max_frames <= 257");
  if (o.fps < 1 || o.fps > 120) throw InputError("demo video: fps must be 1..120");
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) throw InputError("demo video: cannot create " + out_dir.string() + ": " + ec.message());

  // Frame counts Wan accepts (4k+1) in [min_frames, max_frames]; any count when none fits.
  std::vector<int> counts;
  for (int f = o.min_frames; f <= o.max_frames; ++f)
    if (f % 4 == 1) counts.push_back(f);
  if (counts.empty())
    for (int f = o.min_frames; f <= o.max_frames; ++f) counts.push_back(f);
  // Containers in turn; one whose encoder this libavcodec lacks falls back to MPEG-4 in .avi.
  const char* formats[] = {".webm", ".mp4", ".webp"};
  struct Motion {
    const char* words;
    double x0, y0, x1, y1;  // start and end of the centre, in [0, 1] of the free range
  };
  constexpr Motion kMotions[] = {{"moving left to right", 0, 0.5, 1, 0.5}, {"moving right to left", 1, 0.5, 0, 0.5},
                                 {"moving down", 0.5, 0, 0.5, 1},          {"moving up", 0.5, 1, 0.5, 0},
                                 {"moving diagonally", 0, 0, 1, 1}};
  Rng rng(mix_seed({o.seed, 0x56494445ull}));
  const int step = std::max(8, o.size / 8) & ~1;
  std::vector<DemoClip> clips;
  for (int i = 0; i < o.count; ++i) {
    DemoClip clip;
    if (i % 4 == 3) {
      clip.width = o.size * 2;
      clip.height = o.size;
    } else {
      clip.width = clip.height = o.size + step * static_cast<int>(rng.below(static_cast<uint64_t>(o.size / 2 / step + 1)));
    }
    clip.frames = counts[rng.below(counts.size())];
    const int shape = static_cast<int>(rng.below(3));
    const int fg = static_cast<int>(rng.below(kNumColours));
    int bg = static_cast<int>(rng.below(kNumColours - 1));
    if (bg >= fg) ++bg;
    const Motion& motion = kMotions[rng.below(sizeof(kMotions) / sizeof(kMotions[0]))];
    const double r = std::min(clip.width, clip.height) * (0.18 + 0.08 * rng.uniform());

    std::string ext = formats[i % 3];
    if (ext != ".webp" && io::video_encoder_for(ext).empty()) ext = ".avi";
    char stem[32];
    std::snprintf(stem, sizeof(stem), "clip_%04d", i);
    clip.file = stem + ext;
    const char* article = kColours[fg].name[0] == 'o' ? "an " : "a ";
    clip.caption = std::string(article) + kColours[fg].name + " " + kShapes[shape] + " " + motion.words + " on a " +
                   kColours[bg].name + " background";

    std::vector<io::Image> frames;
    frames.reserve(clip.frames);
    const double free_x = clip.width - 2.2 * r, free_y = clip.height - 2.2 * r;
    for (int f = 0; f < clip.frames; ++f) {
      const double t = clip.frames > 1 ? static_cast<double>(f) / (clip.frames - 1) : 0.0;
      const double cx = 1.1 * r + free_x * (motion.x0 + t * (motion.x1 - motion.x0));
      const double cy = 1.1 * r + free_y * (motion.y0 + t * (motion.y1 - motion.y0));
      frames.push_back(draw(clip.width, clip.height, shape, kColours[fg], kColours[bg], cx, cy, r));
    }
    const std::filesystem::path path = out_dir / clip.file;
    if (ext == ".webp")
      io::write_animated_webp(path, frames, o.fps, 95);
    else
      io::write_video(path, frames, o.fps);
    write_file_atomic(out_dir / (std::string(stem) + ".txt"), clip.caption + "\n");
    clips.push_back(std::move(clip));
  }
  return clips;
}

}  // namespace lt::data
