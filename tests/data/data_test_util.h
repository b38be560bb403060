// Helpers for the data tests: small images and caption files written into scratch folders.
#pragma once
#include <filesystem>
#include <fstream>
#include <string>

#include "loratrain/io/image.h"

namespace lt::test {

// A w x h image with a deterministic pattern that depends on `tag` (so files differ in content).
inline io::Image pattern_image(int w, int h, int tag = 0) {
  io::Image im(w, h);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      uint8_t* p = im.at(x, y);
      p[0] = static_cast<uint8_t>((x * 7 + tag * 31) & 0xFF);
      p[1] = static_cast<uint8_t>((y * 5 + tag * 17) & 0xFF);
      p[2] = static_cast<uint8_t>(((x + y) * 3 + tag * 11) & 0xFF);
    }
  return im;
}

inline void write_text(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

inline std::string read_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

}  // namespace lt::test
