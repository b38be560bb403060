#include "loratrain/data/buckets.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "loratrain/data/rng.h"
#include "loratrain/util/error.h"

namespace lt::data {

bool Placement::operator==(const Placement& o) const {
  return scale_to_width == o.scale_to_width && scale_to_height == o.scale_to_height &&
         crop_x == o.crop_x && crop_y == o.crop_y && crop_width == o.crop_width &&
         crop_height == o.crop_height;
}

// The arithmetic below is done in doubles in the reference's order, so results match Python's
// exactly (including its float quirks, e.g. a ceil() landing one pixel above the bucket).

Size clamp_aspect(int width, int height) {
  const double longest = kMaxBucketAspect;
  if (width > longest * height) return {static_cast<int>(std::floor(longest * height)), height};
  if (height > longest * width) return {width, static_cast<int>(std::floor(longest * width))};
  return {width, height};
}

bool aspect_clamped(int width, int height) { return clamp_aspect(width, height) != Size{width, height}; }

Size aitk_bucket_for_image(int image_width, int image_height, int resolution, int divisibility) {
  // The bucket follows the part of the image that is kept: at most 4:1 (see kMaxBucketAspect).
  const auto [width, height] = clamp_aspect(image_width, image_height);
  const double total_pixels = static_cast<double>(width) * height;
  const double max_pixels = static_cast<double>(resolution) * resolution;
  const double target_pixels = std::min(total_pixels, max_pixels);
  const double scaler = std::pow(target_pixels / total_pixels, 0.5);
  const double w_raw = (width * scaler) / divisibility;
  const double h_raw = (height * scaler) / divisibility;
  const int64_t wf = static_cast<int64_t>(std::floor(w_raw)) * divisibility;
  const int64_t wc = static_cast<int64_t>(std::ceil(w_raw)) * divisibility;
  const int64_t hf = static_cast<int64_t>(std::floor(h_raw)) * divisibility;
  const int64_t hc = static_cast<int64_t>(std::ceil(h_raw)) * divisibility;
  const std::pair<int64_t, int64_t> candidates[4] = {{wf, hf}, {wf, hc}, {wc, hf}, {wc, hc}};
  std::vector<std::pair<int64_t, int64_t>> capped;
  for (const auto& [w, h] : candidates)
    if (w > 0 && h > 0 && static_cast<double>(w * h) <= max_pixels) capped.emplace_back(w, h);
  if (capped.empty()) {
    // Every candidate is over resolution^2 (an image narrower than the grid, or a resolution
    // close to the divisibility): the floors, at least one grid step each, with the longer side
    // shortened until the bucket fits.
    int64_t w = std::max<int64_t>(divisibility, wf), h = std::max<int64_t>(divisibility, hf);
    while (static_cast<double>(w * h) > max_pixels && std::max(w, h) > divisibility) {
      (w >= h ? w : h) -= divisibility;
    }
    capped.emplace_back(w, h);
  }
  auto best = capped.front();
  double best_err = std::fabs(static_cast<double>(best.first * best.second) - target_pixels);
  for (size_t i = 1; i < capped.size(); ++i) {
    double err = std::fabs(static_cast<double>(capped[i].first * capped[i].second) - target_pixels);
    if (err < best_err) {
      best = capped[i];
      best_err = err;
    }
  }
  return {static_cast<int>(best.first), static_cast<int>(best.second)};
}

Placement aitk_cover_and_crop(int width, int height, Size bucket) {
  const double sw = static_cast<double>(bucket.width) / width;
  const double sh = static_cast<double>(bucket.height) / height;
  const double s = std::max(sw, sh);
  Placement p;
  p.scale_to_width = static_cast<int>(std::ceil(width * s));
  p.scale_to_height = static_cast<int>(std::ceil(height * s));
  p.crop_width = bucket.width;
  p.crop_height = bucket.height;
  p.crop_x = static_cast<int>((p.scale_to_width - bucket.width) / 2.0);
  p.crop_y = static_cast<int>((p.scale_to_height - bucket.height) / 2.0);
  return p;
}

Placement aitk_square_crop(int width, int height, int resolution) {
  const double s = std::max(static_cast<double>(resolution) / width,
                            static_cast<double>(resolution) / height);
  Placement p;
  p.scale_to_width = static_cast<int>(std::ceil(width * s));
  p.scale_to_height = static_cast<int>(std::ceil(height * s));
  p.crop_width = resolution;
  p.crop_height = resolution;
  if (width > height) {
    p.crop_x = static_cast<int>(p.scale_to_width / 2.0 - resolution / 2.0);
  } else {
    p.crop_y = static_cast<int>(p.scale_to_height / 2.0 - resolution / 2.0);
  }
  return p;
}

std::vector<Size> make_bucket_resolutions(Size max_reso, int min_size, int max_size,
                                          int divisible) {
  const int64_t max_area = static_cast<int64_t>(max_reso.width) * max_reso.height;
  std::set<Size> resos;
  const int square =
      static_cast<int>(std::floor(std::sqrt(static_cast<double>(max_area)) / divisible)) *
      divisible;
  resos.insert({square, square});
  for (int width = min_size; width <= max_size; width += divisible) {
    const int height =
        std::min<int64_t>(max_size, ((max_area / width) / divisible) * divisible);
    if (height >= min_size) {
      resos.insert({width, height});
      resos.insert({height, width});
    }
  }
  return {resos.begin(), resos.end()};
}

namespace {

int round_to_steps(double x, int steps) {
  const int r = static_cast<int>(x + 0.5);
  return r - r % steps;
}

}  // namespace

KohyaBucketChoice kohya_select_bucket(int width, int height, const std::vector<Size>& predefined,
                                      bool no_upscale, int64_t max_area, int reso_steps) {
  const double ar = static_cast<double>(width) / height;
  KohyaBucketChoice out;
  if (!no_upscale) {
    if (predefined.empty()) throw InputError("kohya buckets: no predefined bucket resolutions");
    Size reso{width, height};
    if (std::find(predefined.begin(), predefined.end(), reso) == predefined.end()) {
      double best = std::numeric_limits<double>::infinity();
      for (const Size& s : predefined) {
        const double err = std::fabs(static_cast<double>(s.width) / s.height - ar);
        if (err < best) {  // first minimum, like numpy argmin
          best = err;
          reso = s;
        }
      }
    }
    const double ar_reso = static_cast<double>(reso.width) / reso.height;
    // Wider than the bucket: match heights; otherwise match widths (scale to cover).
    const double scale =
        ar > ar_reso ? static_cast<double>(reso.height) / height : static_cast<double>(reso.width) / width;
    out.bucket = reso;
    out.resized = {static_cast<int>(width * scale + 0.5), static_cast<int>(height * scale + 0.5)};
  } else {
    Size resized{width, height};
    if (static_cast<int64_t>(width) * height > max_area) {
      const double rw = std::sqrt(static_cast<double>(max_area) * ar);
      const double rh = static_cast<double>(max_area) / rw;
      const int bw = round_to_steps(rw, reso_steps);
      const int bh_in_wr = round_to_steps(bw / ar, reso_steps);
      const int bh = round_to_steps(rh, reso_steps);
      const int bw_in_hr = round_to_steps(bh * ar, reso_steps);
      if (bw <= 0 || bh <= 0 || bh_in_wr <= 0) {
        throw InputError("kohya buckets: a " + std::to_string(width) + "x" +
                         std::to_string(height) + " image cannot be bucketed with bucket_reso_steps " +
                         std::to_string(reso_steps));
      }
      const double ar_wr = static_cast<double>(bw) / bh_in_wr;
      const double ar_hr = static_cast<double>(bw_in_hr) / bh;
      if (std::fabs(ar_wr - ar) < std::fabs(ar_hr - ar)) {
        resized = {bw, static_cast<int>(bw / ar + 0.5)};
      } else {
        resized = {static_cast<int>(bh * ar + 0.5), bh};
      }
    }
    // Crop, never pad: the bucket is the resized size floored to the step.
    out.resized = resized;
    out.bucket = {resized.width - resized.width % reso_steps,
                  resized.height - resized.height % reso_steps};
  }
  out.ar_error = static_cast<double>(out.bucket.width) / out.bucket.height - ar;
  return out;
}

Placement kohya_placement(const KohyaBucketChoice& c) {
  Placement p;
  p.scale_to_width = c.resized.width;
  p.scale_to_height = c.resized.height;
  p.crop_width = c.bucket.width;
  p.crop_height = c.bucket.height;
  p.crop_x = std::max(0, (c.resized.width - c.bucket.width) / 2);
  p.crop_y = std::max(0, (c.resized.height - c.bucket.height) / 2);
  return p;
}

// ---- BucketPlan ---------------------------------------------------------------------------------

std::string Bucket::key() const {
  return std::to_string(resolution) + ":" + std::to_string(size.width) + "x" +
         std::to_string(size.height) + (is_clip ? ":clips" : "");
}

namespace {

void validate(BucketOptions& o) {
  if (o.resolutions.empty()) throw InputError("buckets: no resolution given");
  std::sort(o.resolutions.begin(), o.resolutions.end());
  o.resolutions.erase(std::unique(o.resolutions.begin(), o.resolutions.end()),
                      o.resolutions.end());
  for (int r : o.resolutions)
    if (r <= 0) throw InputError("buckets: resolution must be positive, got " + std::to_string(r));
  if (o.divisibility <= 0)
    throw InputError("buckets: divisibility must be positive, got " +
                     std::to_string(o.divisibility));
  if (o.resolutions.front() < o.divisibility)
    throw InputError("buckets: resolution " + std::to_string(o.resolutions.front()) +
                     " is smaller than the model's bucket grid (" + std::to_string(o.divisibility) +
                     " pixels)");
  if (o.style == BucketStyle::Kohya) {
    if (o.bucket_reso_steps <= 0)
      throw InputError("bucket_reso_steps must be positive, got " +
                       std::to_string(o.bucket_reso_steps));
    if (o.min_bucket_reso <= 0 || o.max_bucket_reso < o.min_bucket_reso)
      throw InputError("min_bucket_reso (" + std::to_string(o.min_bucket_reso) +
                       ") must be positive and at most max_bucket_reso (" +
                       std::to_string(o.max_bucket_reso) + ")");
    if (!o.bucket_no_upscale && o.max_bucket_reso < o.resolutions.back())
      throw InputError("max_bucket_reso (" + std::to_string(o.max_bucket_reso) +
                       ") must be at least the resolution (" +
                       std::to_string(o.resolutions.back()) + ")");
  }
}

}  // namespace

Placement BucketPlan::place(const ImageShape& shape, int resolution) const {
  if (shape.width <= 0 || shape.height <= 0)
    throw InputError(shape.name + ": image has no pixels");
  if (options_.style == BucketStyle::Kohya) {
    if (!options_.enabled) return aitk_square_crop(shape.width, shape.height, resolution);
    std::vector<Size> predefined;
    if (!options_.bucket_no_upscale)
      predefined = make_bucket_resolutions({resolution, resolution}, options_.min_bucket_reso,
                                           options_.max_bucket_reso, options_.bucket_reso_steps);
    KohyaBucketChoice c;
    try {
      c = kohya_select_bucket(shape.width, shape.height, predefined, options_.bucket_no_upscale,
                              static_cast<int64_t>(resolution) * resolution,
                              options_.bucket_reso_steps);
    } catch (const InputError& e) {
      throw InputError(shape.name + ": " + e.what());
    }
    if (c.bucket.width <= 0 || c.bucket.height <= 0)
      throw InputError(shape.name + ": a " + std::to_string(shape.width) + "x" +
                       std::to_string(shape.height) +
                       " image is smaller than bucket_reso_steps (" +
                       std::to_string(options_.bucket_reso_steps) +
                       ") and bucket_no_upscale forbids enlarging it");
    return kohya_placement(c);
  }
  if (!options_.enabled) return aitk_square_crop(shape.width, shape.height, resolution);
  Size bucket = aitk_bucket_for_image(shape.width, shape.height, resolution, options_.divisibility);
  return aitk_cover_and_crop(shape.width, shape.height, bucket);
}

BucketPlan BucketPlan::build(const std::vector<ImageShape>& images, const BucketOptions& options,
                             int num_repeats, bool flip_x) {
  BucketPlan plan;
  plan.options_ = options;
  validate(plan.options_);
  if (num_repeats < 1) throw InputError("num_repeats must be at least 1, got " +
                                        std::to_string(num_repeats));
  plan.shapes_ = images;
  plan.image_count_ = images.size();
  for (int r : plan.options_.resolutions) {
    std::vector<Placement> placements;
    placements.reserve(images.size());
    for (const ImageShape& s : images) placements.push_back(plan.place(s, r));
    // AI Toolkit order: the file list repeated num_repeats times, then a flipped copy of all.
    for (int flip = 0; flip <= (flip_x ? 1 : 0); ++flip)
      for (int rep = 0; rep < num_repeats; ++rep)
        for (size_t i = 0; i < images.size(); ++i)
          plan.entries_.push_back({i, flip == 1, r, placements[i]});
  }
  plan.rebuild_buckets();
  return plan;
}

void BucketPlan::rebuild_buckets() {
  std::map<std::tuple<int, int, int, bool>, Bucket> by_key;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const BucketEntry& e = entries_[i];
    Size s = e.placement.bucket();
    const bool clip = shapes_[e.image].is_clip;
    Bucket& b = by_key[{e.resolution, s.width, s.height, clip}];
    b.resolution = e.resolution;
    b.size = s;
    b.is_clip = clip;
    b.entries.push_back(i);
  }
  buckets_.clear();
  for (auto& [k, b] : by_key) buckets_.push_back(std::move(b));
}

std::vector<int> BucketPlan::resolutions() const {
  std::set<int> r;
  for (const Bucket& b : buckets_) r.insert(b.resolution);
  return {r.begin(), r.end()};
}

std::vector<HistogramRow> BucketPlan::histogram() const {
  std::vector<HistogramRow> rows;
  for (const Bucket& b : buckets_) rows.push_back({b.resolution, b.size, b.entries.size(), b.is_clip});
  return rows;
}

std::string BucketPlan::histogram_text() const {
  std::ostringstream out;
  for (int r : resolutions()) {
    out << "Bucket sizes for resolution " << r << ":\n";
    size_t n = 0;
    for (const Bucket& b : buckets_) {
      if (b.resolution != r) continue;
      out << "  " << b.size.width << "x" << b.size.height << (b.is_clip ? " clips" : "") << ": "
          << b.entries.size() << (b.entries.size() == 1 ? " file\n" : " files\n");
      ++n;
    }
    out << "  " << n << (n == 1 ? " bucket made\n" : " buckets made\n");
  }
  return out.str();
}

std::optional<ResolutionDrop> BucketPlan::drop_largest_resolution(int fallback_resolution) {
  std::vector<int> in_use = resolutions();
  if (in_use.empty()) return std::nullopt;
  ResolutionDrop drop;
  drop.from = in_use.back();
  if (in_use.size() >= 2) {
    drop.to = in_use[in_use.size() - 2];
  } else if (fallback_resolution > 0 && fallback_resolution < drop.from) {
    drop.to = fallback_resolution;
  } else {
    return std::nullopt;
  }
  for (BucketEntry& e : entries_) {
    if (e.resolution != drop.from) continue;
    e.resolution = drop.to;
    e.placement = place(shapes_[e.image], drop.to);
    ++drop.moved_entries;
  }
  auto& rs = options_.resolutions;
  rs.erase(std::remove(rs.begin(), rs.end(), drop.from), rs.end());
  if (std::find(rs.begin(), rs.end(), drop.to) == rs.end()) {
    rs.push_back(drop.to);
    std::sort(rs.begin(), rs.end());
  }
  rebuild_buckets();
  return drop;
}

uint64_t BucketPlan::fingerprint() const {
  Fnv64 h;
  for (const BucketEntry& e : entries_) {
    const int64_t v[9] = {static_cast<int64_t>(e.image), e.flip_x ? 1 : 0, e.resolution,
                          e.placement.scale_to_width, e.placement.scale_to_height,
                          e.placement.crop_x, e.placement.crop_y, e.placement.crop_width,
                          e.placement.crop_height};
    h.update(v, sizeof(v));
  }
  return h.digest();
}

}  // namespace lt::data
