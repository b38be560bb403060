// Images: decoding (jpg, png, bmp, tga, gif via stb_image; webp via libwebp), antialiased
// resampling, crops and flips, conversion to and from [-1, 1] tensors, PNG writing and preview grids.
// Pixels are 8-bit RGB, row-major, interleaved (HWC), as PIL's `convert("RGB")` gives them: an
// alpha channel is dropped, not composited, and JPEG EXIF orientation is applied like
// `ImageOps.exif_transpose`, which is what AI Toolkit does before bucketing.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace lt::io {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // width * height * 3, RGB, row-major

  Image() = default;
  Image(int w, int h);  // black
  bool empty() const { return width == 0 || height == 0; }
  uint8_t* at(int x, int y) { return pixels.data() + (static_cast<size_t>(y) * width + x) * 3; }
  const uint8_t* at(int x, int y) const {
    return pixels.data() + (static_cast<size_t>(y) * width + x) * 3;
  }
};

struct ImageSize {
  int width = 0;
  int height = 0;
};

// Decodes an encoded image held in memory. `name` is only used in error messages (the file path).
// Throws lt::InputError "<name>: ..." for a corrupt, truncated or unsupported image. A JPEG whose
// end-of-image marker is missing counts as truncated (stb_image would silently grey-fill it).
Image decode_image(const uint8_t* data, size_t size, const std::string& name);
Image decode_image(const std::string& bytes, const std::string& name);

// Reads the whole file (lt::InputError "<path>: cannot read ..." when it cannot be read).
std::string read_file_bytes(const std::filesystem::path& path);

// Reads and decodes a file; lt::InputError naming the file on failure.
Image read_image(const std::filesystem::path& path);

// The image's size after EXIF orientation, from its header only (no pixel decode).
ImageSize probe_image_size(const std::string& bytes, const std::string& name);

// Resampling filters, as PIL names them. Downscaling widens the kernel by the scale factor
// (antialiasing, like PIL's resize), so no filter aliases. Box is area averaging.
enum class ResizeFilter { Box, Bilinear, Bicubic, Lanczos };

// Resizes to exactly width x height with a separable two-pass filter (float intermediate).
// Bicubic (a = -0.5, PIL's BICUBIC) is AI Toolkit's choice for dataset images.
Image resize(const Image& image, int width, int height, ResizeFilter filter = ResizeFilter::Bicubic);

// The same resampler over float planes: `data` is [channels][height][width] (CHW).
std::vector<float> resize_planar(const std::vector<float>& data, int channels, int width,
                                 int height, int out_width, int out_height, ResizeFilter filter);

// Cuts the rectangle [x, x + width) x [y, y + height); it must lie inside the image.
Image crop(const Image& image, int x, int y, int width, int height);
// The centred width x height rectangle (offsets floor((W - w) / 2), like AI Toolkit's crop_x).
Image center_crop(const Image& image, int width, int height);
Image flip_horizontal(const Image& image);

// [3, H, W] float32 in [-1, 1] (x / 127.5 - 1), the VAE's input convention.
at::Tensor image_to_tensor(const Image& image);
// Inverse of image_to_tensor for a [3, H, W] (or [1, 3, H, W]) tensor in [-1, 1], any float dtype
// or device; values are clamped and rounded.
Image tensor_to_image(const at::Tensor& tensor);

// PNG encoding; write_png writes atomically (temp file + rename). `text`: tEXt chunks (keyword,
// Latin-1 text) after the header, e.g. {"parameters", ...} as A1111 writes its generation settings.
using PngText = std::vector<std::pair<std::string, std::string>>;
std::string encode_png(const Image& image, const PngText& text = {});
void write_png(const std::filesystem::path& path, const Image& image, const PngText& text = {});
// The tEXt chunks of an encoded PNG, in file order.
PngText read_png_text(const std::string& bytes);

// Lays images out in a grid of `columns` columns (0 = ceil(sqrt(N))), each cell sized to the
// largest image, `padding` pixels between cells and around the border, filled with `background`.
Image make_grid(const std::vector<Image>& images, int columns = 0, int padding = 2,
                uint8_t background = 0);

}  // namespace lt::io
