#include "loratrain/io/image.h"

#include <stb_image.h>
#include <stb_image_write.h>
#include <webp/decode.h>

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"

namespace lt::io {

namespace fs = std::filesystem;

Image::Image(int w, int h) : width(w), height(h), pixels(static_cast<size_t>(w) * h * 3, 0) {}

namespace {

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw InputError(name + ": " + what);
}

enum class Format { Jpeg, Png, Webp, Gif, Bmp, Other };

Format sniff(const uint8_t* d, size_t n) {
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return Format::Jpeg;
  if (n >= 8 && std::memcmp(d, "\x89PNG\r\n\x1a\n", 8) == 0) return Format::Png;
  if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0)
    return Format::Webp;
  if (n >= 4 && std::memcmp(d, "GIF8", 4) == 0) return Format::Gif;
  if (n >= 2 && d[0] == 'B' && d[1] == 'M') return Format::Bmp;
  return Format::Other;  // TGA has no magic number; stb_image decides
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

// Walks the JPEG's marker segments. Returns the EXIF orientation (1 when absent) and whether the
// end-of-image marker follows the first scan. Entropy-coded data stuffs 0xFF as FF 00, so FF D9
// after the first SOS can only be the real EOI; thumbnails live in APP1 before it.
struct JpegScan {
  int orientation = 1;
  bool complete = false;
};

int exif_orientation(const uint8_t* p, size_t n) {
  // p points at the TIFF header inside an APP1 "Exif\0\0" segment.
  if (n < 8) return 1;
  bool le;
  if (p[0] == 'I' && p[1] == 'I') {
    le = true;
  } else if (p[0] == 'M' && p[1] == 'M') {
    le = false;
  } else {
    return 1;
  }
  auto u16 = [&](size_t o) -> uint32_t {
    return le ? (p[o] | (p[o + 1] << 8)) : ((p[o] << 8) | p[o + 1]);
  };
  auto u32 = [&](size_t o) -> uint32_t {
    return le ? (uint32_t(p[o]) | (uint32_t(p[o + 1]) << 8) | (uint32_t(p[o + 2]) << 16) |
                 (uint32_t(p[o + 3]) << 24))
              : be32(p + o);
  };
  if (u16(2) != 42) return 1;
  size_t ifd = u32(4);
  if (ifd + 2 > n) return 1;
  size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    size_t e = ifd + 2 + i * 12;
    if (e + 12 > n) break;
    if (u16(e) == 0x0112) {
      uint32_t v = u16(e + 8);
      return (v >= 1 && v <= 8) ? static_cast<int>(v) : 1;
    }
  }
  return 1;
}

JpegScan scan_jpeg(const uint8_t* d, size_t n) {
  JpegScan out;
  size_t pos = 2;
  while (pos + 4 <= n) {
    if (d[pos] != 0xFF) return out;
    uint8_t marker = d[pos + 1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0xD8 || (marker >= 0xD0 && marker <= 0xD7) || marker == 0x01) {
      pos += 2;
      continue;
    }
    size_t len = (size_t(d[pos + 2]) << 8) | d[pos + 3];
    if (len < 2 || pos + 2 + len > n) return out;
    if (marker == 0xE1 && len >= 16 && std::memcmp(d + pos + 4, "Exif\0\0", 6) == 0 &&
        out.orientation == 1) {
      out.orientation = exif_orientation(d + pos + 10, len - 8);
    }
    if (marker == 0xDA) {
      for (size_t i = pos + 2 + len; i + 1 < n; ++i) {
        if (d[i] == 0xFF && d[i + 1] == 0xD9) {
          out.complete = true;
          break;
        }
      }
      return out;
    }
    pos += 2 + len;
  }
  return out;
}

// stb_image decodes a PNG cut inside IDAT without complaint in some cases; require the chunk chain
// to reach IEND inside the file.
bool png_complete(const uint8_t* d, size_t n) {
  size_t pos = 8;
  while (pos + 12 <= n) {
    uint32_t len = be32(d + pos);
    if (std::memcmp(d + pos + 4, "IEND", 4) == 0) return true;
    if (len > n) return false;
    pos += 12 + static_cast<size_t>(len);
  }
  return false;
}

Image apply_orientation(Image src, int orientation) {
  if (orientation <= 1 || orientation > 8) return src;
  const int W = src.width, H = src.height;
  const bool swap = orientation >= 5;
  Image dst(swap ? H : W, swap ? W : H);
  for (int y = 0; y < dst.height; ++y) {
    for (int x = 0; x < dst.width; ++x) {
      int sx = x, sy = y;
      switch (orientation) {  // PIL exif_transpose: 2 mirror, 3 rot180, 4 flip, 5 transpose,
        case 2: sx = W - 1 - x; break;  // 6 rot270 (clockwise), 7 transverse, 8 rot90
        case 3: sx = W - 1 - x; sy = H - 1 - y; break;
        case 4: sy = H - 1 - y; break;
        case 5: sx = y; sy = x; break;
        case 6: sx = y; sy = H - 1 - x; break;
        case 7: sx = W - 1 - y; sy = H - 1 - x; break;
        case 8: sx = W - 1 - y; sy = x; break;
        default: break;
      }
      std::memcpy(dst.at(x, y), src.at(sx, sy), 3);
    }
  }
  return dst;
}

void check_size(const std::string& name, size_t size) {
  if (size == 0) fail(name, "empty file, not an image");
  if (size > static_cast<size_t>(std::numeric_limits<int>::max()))
    fail(name, "file too large to decode (over 2 GiB)");
}

}  // namespace

Image decode_image(const uint8_t* data, size_t size, const std::string& name) {
  check_size(name, size);
  Format format = sniff(data, size);
  int orientation = 1;
  if (format == Format::Jpeg) {
    JpegScan scan = scan_jpeg(data, size);
    if (!scan.complete) fail(name, "truncated or corrupt JPEG (no end-of-image marker)");
    orientation = scan.orientation;
  } else if (format == Format::Png && !png_complete(data, size)) {
    fail(name, "truncated or corrupt PNG (no IEND chunk)");
  }

  Image image;
  if (format == Format::Webp) {
    WebPBitstreamFeatures features;
    if (WebPGetFeatures(data, size, &features) != VP8_STATUS_OK)
      fail(name, "corrupt WebP header");
    if (features.has_animation) fail(name, "animated WebP is not supported");
    int w = 0, h = 0;
    uint8_t* rgb = WebPDecodeRGB(data, size, &w, &h);
    if (!rgb) fail(name, "truncated or corrupt WebP");
    image.width = w;
    image.height = h;
    image.pixels.assign(rgb, rgb + static_cast<size_t>(w) * h * 3);
    WebPFree(rgb);
  } else {
    int w = 0, h = 0, c = 0;
    stbi_uc* rgb = stbi_load_from_memory(data, static_cast<int>(size), &w, &h, &c, 3);
    if (!rgb) {
      const char* why = stbi_failure_reason();
      std::string reason = why ? why : "unknown error";
      if (format == Format::Other)
        fail(name, "not a supported image (jpg, png, webp, bmp, gif, tga): " + reason);
      fail(name, "corrupt or unsupported image: " + reason);
    }
    image.width = w;
    image.height = h;
    image.pixels.assign(rgb, rgb + static_cast<size_t>(w) * h * 3);
    stbi_image_free(rgb);
  }
  if (image.empty()) fail(name, "image has zero size");
  return apply_orientation(std::move(image), orientation);
}

Image decode_image(const std::string& bytes, const std::string& name) {
  return decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), name);
}

std::string read_file_bytes(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail(path.string(), "cannot read: file does not exist");
  if (fs::is_directory(path, ec)) fail(path.string(), "cannot read: is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path.string(), std::string("cannot read: ") + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail(path.string(), "cannot read: I/O error");
  return ss.str();
}

Image read_image(const fs::path& path) {
  return decode_image(read_file_bytes(path), path.string());
}

ImageSize probe_image_size(const std::string& bytes, const std::string& name) {
  const auto* d = reinterpret_cast<const uint8_t*>(bytes.data());
  check_size(name, bytes.size());
  Format format = sniff(d, bytes.size());
  ImageSize out;
  if (format == Format::Webp) {
    if (!WebPGetInfo(d, bytes.size(), &out.width, &out.height)) fail(name, "corrupt WebP header");
    return out;
  }
  int c = 0;
  if (!stbi_info_from_memory(d, static_cast<int>(bytes.size()), &out.width, &out.height, &c))
    fail(name, std::string("not a supported image: ") + stbi_failure_reason());
  if (format == Format::Jpeg && scan_jpeg(d, bytes.size()).orientation >= 5)
    std::swap(out.width, out.height);
  return out;
}

// ---------------------------------------------------------------------------------------------
// Resampling. Mirrors PIL's ImagingResample: for output sample i the source centre is
// (i + 0.5) * scale; when downscaling the kernel is stretched by the scale (antialiasing).

namespace {

struct Kernel {
  double support;
  double (*fn)(double);
};

double box_fn(double x) { return (x >= -0.5 && x < 0.5) ? 1.0 : 0.0; }
double triangle_fn(double x) {
  x = std::fabs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}
double bicubic_fn(double x) {
  constexpr double a = -0.5;
  x = std::fabs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
  return 0.0;
}
double sinc(double x) {
  if (x == 0.0) return 1.0;
  x *= M_PI;
  return std::sin(x) / x;
}
double lanczos_fn(double x) { return (x > -3.0 && x < 3.0) ? sinc(x) * sinc(x / 3.0) : 0.0; }

Kernel kernel_for(ResizeFilter f) {
  switch (f) {
    case ResizeFilter::Box: return {0.5, box_fn};
    case ResizeFilter::Bilinear: return {1.0, triangle_fn};
    case ResizeFilter::Bicubic: return {2.0, bicubic_fn};
    case ResizeFilter::Lanczos: return {3.0, lanczos_fn};
  }
  return {2.0, bicubic_fn};
}

struct Taps {
  std::vector<int> first;      // per output sample: first source index
  std::vector<int> count;      // number of taps
  std::vector<float> weights;  // count[i] weights at offset i * max_taps
  int max_taps = 0;
};

Taps compute_taps(int in_size, int out_size, ResizeFilter filter) {
  Kernel k = kernel_for(filter);
  double scale = static_cast<double>(in_size) / out_size;
  double filterscale = std::max(scale, 1.0);
  double support = k.support * filterscale;
  Taps t;
  t.max_taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  t.first.resize(out_size);
  t.count.resize(out_size);
  t.weights.assign(static_cast<size_t>(out_size) * t.max_taps, 0.0f);
  std::vector<double> w(t.max_taps);
  for (int i = 0; i < out_size; ++i) {
    double center = (i + 0.5) * scale;
    int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    int xmax = std::min(static_cast<int>(center + support + 0.5), in_size);
    int n = std::min(xmax - xmin, t.max_taps);
    double total = 0.0;
    for (int j = 0; j < n; ++j) {
      w[j] = k.fn((j + xmin - center + 0.5) / filterscale);
      total += w[j];
    }
    if (total == 0.0) {  // cannot happen for these kernels; keep nearest sample as a guard
      n = 1;
      xmin = std::min(std::max(static_cast<int>(center), 0), in_size - 1);
      w[0] = total = 1.0;
    }
    t.first[i] = xmin;
    t.count[i] = n;
    for (int j = 0; j < n; ++j) t.weights[static_cast<size_t>(i) * t.max_taps + j] =
        static_cast<float>(w[j] / total);
  }
  return t;
}

// Resamples an interleaved HWC float buffer along x, then y.
std::vector<float> resample_hwc(const std::vector<float>& src, int channels, int w, int h,
                                int ow, int oh, ResizeFilter filter) {
  std::vector<float> cur = src;
  int cw = w;
  if (ow != w) {
    Taps t = compute_taps(w, ow, filter);
    std::vector<float> out(static_cast<size_t>(ow) * h * channels);
    for (int y = 0; y < h; ++y) {
      const float* row = cur.data() + static_cast<size_t>(y) * w * channels;
      float* orow = out.data() + static_cast<size_t>(y) * ow * channels;
      for (int x = 0; x < ow; ++x) {
        const float* wt = t.weights.data() + static_cast<size_t>(x) * t.max_taps;
        for (int c = 0; c < channels; ++c) {
          float acc = 0.0f;
          for (int j = 0; j < t.count[x]; ++j) acc += wt[j] * row[(t.first[x] + j) * channels + c];
          orow[x * channels + c] = acc;
        }
      }
    }
    cur.swap(out);
    cw = ow;
  }
  if (oh != h) {
    Taps t = compute_taps(h, oh, filter);
    const size_t stride = static_cast<size_t>(cw) * channels;
    std::vector<float> out(static_cast<size_t>(oh) * stride, 0.0f);
    for (int y = 0; y < oh; ++y) {
      float* orow = out.data() + static_cast<size_t>(y) * stride;
      const float* wt = t.weights.data() + static_cast<size_t>(y) * t.max_taps;
      for (int j = 0; j < t.count[y]; ++j) {
        const float* row = cur.data() + static_cast<size_t>(t.first[y] + j) * stride;
        const float wj = wt[j];
        for (size_t i = 0; i < stride; ++i) orow[i] += wj * row[i];
      }
    }
    cur.swap(out);
  }
  return cur;
}

void check_resize_args(int w, int h, int ow, int oh) {
  if (w <= 0 || h <= 0 || ow <= 0 || oh <= 0)
    throw Error(ExitCode::kRuntime, "resize: sizes must be positive (" + std::to_string(w) + "x" +
                                        std::to_string(h) + " -> " + std::to_string(ow) + "x" +
                                        std::to_string(oh) + ")");
}

}  // namespace

Image resize(const Image& image, int width, int height, ResizeFilter filter) {
  check_resize_args(image.width, image.height, width, height);
  if (width == image.width && height == image.height) return image;
  std::vector<float> src(image.pixels.begin(), image.pixels.end());
  std::vector<float> out = resample_hwc(src, 3, image.width, image.height, width, height, filter);
  Image result(width, height);
  for (size_t i = 0; i < out.size(); ++i)
    result.pixels[i] = static_cast<uint8_t>(std::clamp(std::lround(out[i]), 0L, 255L));
  return result;
}

std::vector<float> resize_planar(const std::vector<float>& data, int channels, int width,
                                 int height, int out_width, int out_height, ResizeFilter filter) {
  check_resize_args(width, height, out_width, out_height);
  const size_t plane = static_cast<size_t>(width) * height;
  if (data.size() != plane * channels)
    throw Error(ExitCode::kRuntime, "resize_planar: buffer size does not match channels*h*w");
  const size_t oplane = static_cast<size_t>(out_width) * out_height;
  std::vector<float> out(oplane * channels);
  for (int c = 0; c < channels; ++c) {
    std::vector<float> p(data.begin() + c * plane, data.begin() + (c + 1) * plane);
    std::vector<float> r = resample_hwc(p, 1, width, height, out_width, out_height, filter);
    std::copy(r.begin(), r.end(), out.begin() + c * oplane);
  }
  return out;
}

Image crop(const Image& image, int x, int y, int width, int height) {
  if (x < 0 || y < 0 || width <= 0 || height <= 0 || x + width > image.width ||
      y + height > image.height)
    throw Error(ExitCode::kRuntime, "crop: rectangle " + std::to_string(width) + "x" +
                                        std::to_string(height) + "+" + std::to_string(x) + "+" +
                                        std::to_string(y) + " outside a " +
                                        std::to_string(image.width) + "x" +
                                        std::to_string(image.height) + " image");
  Image out(width, height);
  for (int r = 0; r < height; ++r)
    std::memcpy(out.at(0, r), image.at(x, y + r), static_cast<size_t>(width) * 3);
  return out;
}

Image center_crop(const Image& image, int width, int height) {
  return crop(image, (image.width - width) / 2, (image.height - height) / 2, width, height);
}

Image flip_horizontal(const Image& image) {
  Image out(image.width, image.height);
  for (int y = 0; y < image.height; ++y)
    for (int x = 0; x < image.width; ++x)
      std::memcpy(out.at(image.width - 1 - x, y), image.at(x, y), 3);
  return out;
}

at::Tensor image_to_tensor(const Image& image) {
  auto hwc = torch::from_blob(const_cast<uint8_t*>(image.pixels.data()),
                              {image.height, image.width, 3}, torch::kUInt8);
  // [H, W, 3] uint8 -> [3, H, W] float in [-1, 1]
  return hwc.permute({2, 0, 1}).to(torch::kFloat32).div(127.5).sub(1.0).contiguous();
}

Image tensor_to_image(const at::Tensor& tensor) {
  at::Tensor t = tensor.detach();
  if (t.dim() == 4 && t.size(0) == 1) t = t.squeeze(0);
  if (t.dim() != 3 || t.size(0) != 3)
    throw Error(ExitCode::kRuntime, "tensor_to_image: expected [3, H, W], got " +
                                        std::string(c10::str(t.sizes())));
  // [3, H, W] in [-1, 1] -> [H, W, 3] uint8
  at::Tensor u8 = t.to(torch::kCPU, torch::kFloat32)
                      .add(1.0)
                      .mul(127.5)
                      .round()
                      .clamp(0, 255)
                      .to(torch::kUInt8)
                      .permute({1, 2, 0})
                      .contiguous();
  Image out(static_cast<int>(t.size(2)), static_cast<int>(t.size(1)));
  std::memcpy(out.pixels.data(), u8.data_ptr<uint8_t>(), out.pixels.size());
  return out;
}

namespace {
void append_to_string(void* context, void* data, int size) {
  static_cast<std::string*>(context)->append(static_cast<const char*>(data), size);
}
}  // namespace

namespace {
// PNG's chunk CRC (ISO 3309 / zlib crc32) over the chunk type and data.
uint32_t png_crc(const std::string& data) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t n = 0; n < 256; ++n) {
      uint32_t c = n;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[n] = c;
    }
    return t;
  }();
  uint32_t c = 0xffffffffu;
  for (unsigned char b : data) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}
}  // namespace

std::string encode_png(const Image& image, const PngText& text) {
  if (image.empty()) throw Error(ExitCode::kRuntime, "encode_png: empty image");
  std::string out;
  if (!stbi_write_png_to_func(append_to_string, &out, image.width, image.height, 3,
                              image.pixels.data(), image.width * 3))
    throw Error(ExitCode::kRuntime, "encode_png: stb_image_write failed");
  if (text.empty()) return out;
  // The chunks go right after IHDR (8-byte signature + 25-byte IHDR chunk).
  std::string chunks;
  for (const auto& [keyword, value] : text) {
    if (keyword.empty() || keyword.size() > 79) throw Error(ExitCode::kRuntime, "encode_png: bad tEXt keyword");
    const std::string body = "tEXt" + keyword + '\0' + value;
    const uint32_t length = static_cast<uint32_t>(body.size() - 4);
    const uint32_t crc = png_crc(body);
    for (int shift = 24; shift >= 0; shift -= 8) chunks += static_cast<char>((length >> shift) & 0xff);
    chunks += body;
    for (int shift = 24; shift >= 0; shift -= 8) chunks += static_cast<char>((crc >> shift) & 0xff);
  }
  out.insert(33, chunks);
  return out;
}

PngText read_png_text(const std::string& bytes) {
  PngText text;
  size_t at = 8;
  while (at + 12 <= bytes.size()) {
    uint32_t length = 0;
    for (int k = 0; k < 4; ++k) length = (length << 8) | static_cast<uint8_t>(bytes[at + k]);
    if (at + 12 + length > bytes.size()) break;
    const std::string type = bytes.substr(at + 4, 4);
    if (type == "tEXt") {
      const std::string body = bytes.substr(at + 8, length);
      const size_t nul = body.find('\0');
      if (nul != std::string::npos) text.emplace_back(body.substr(0, nul), body.substr(nul + 1));
    }
    if (type == "IEND") break;
    at += 12 + length;
  }
  return text;
}

void write_png(const fs::path& path, const Image& image, const PngText& text) {
  write_file_atomic(path, encode_png(image, text));
}

Image make_grid(const std::vector<Image>& images, int columns, int padding, uint8_t background) {
  if (images.empty()) throw Error(ExitCode::kRuntime, "make_grid: no images");
  const int n = static_cast<int>(images.size());
  if (columns <= 0) columns = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(n))));
  columns = std::min(columns, n);
  const int rows = (n + columns - 1) / columns;
  int cw = 0, ch = 0;
  for (const auto& im : images) {
    cw = std::max(cw, im.width);
    ch = std::max(ch, im.height);
  }
  padding = std::max(padding, 0);
  Image grid(columns * cw + (columns + 1) * padding, rows * ch + (rows + 1) * padding);
  std::fill(grid.pixels.begin(), grid.pixels.end(), background);
  for (int i = 0; i < n; ++i) {
    const Image& im = images[i];
    // Smaller images sit centred in their cell.
    int x0 = padding + (i % columns) * (cw + padding) + (cw - im.width) / 2;
    int y0 = padding + (i / columns) * (ch + padding) + (ch - im.height) / 2;
    for (int y = 0; y < im.height; ++y)
      std::memcpy(grid.at(x0, y0 + y), im.at(0, y), static_cast<size_t>(im.width) * 3);
  }
  return grid;
}

}  // namespace lt::io
