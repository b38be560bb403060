// Seeded randomness for the data pipeline, identical on every platform and standard library:
// std::mt19937_64's output sequence is fixed by the standard, but std::uniform_*_distribution and
// std::shuffle are not, so the draws below are written out. Every random choice is derived from
// (seed, epoch, batch index, ...) through mix_seed, so a position in the data stream is enough to
// reproduce it: nothing hidden has to be saved for resume.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace lt::data {

// splitmix64 finaliser: a bijective 64-bit mix.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One seed from several values, order-sensitive.
inline uint64_t mix_seed(std::initializer_list<uint64_t> values) {
  uint64_t h = 0x6A09E667F3BCC908ull;
  for (uint64_t v : values) h = splitmix64(h ^ splitmix64(v));
  return h;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  uint64_t next() { return engine_(); }
  // Uniform in [0, 1) with 53 random bits (like Python's random.random()).
  double uniform() { return static_cast<double>(engine_() >> 11) * (1.0 / 9007199254740992.0); }
  // Uniform integer in [0, n), n > 0, without modulo bias.
  uint64_t below(uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do {
      r = engine_();
    } while (r >= limit);
    return r % n;
  }
  // Fisher-Yates, back to front (the order Python's random.shuffle uses).
  template <typename T>
  void shuffle(std::vector<T>& v) {
    for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

 private:
  std::mt19937_64 engine_;
};

// FNV-1a, 64 bit: content and cache-key hashing (not cryptographic; collisions are checked
// against the full key stored in each cache file).
class Fnv64 {
 public:
  Fnv64& update(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) {
      h_ ^= p[i];
      h_ *= 0x100000001B3ull;
    }
    return *this;
  }
  Fnv64& update(const std::string& s) { return update(s.data(), s.size()); }
  uint64_t digest() const { return h_; }
  std::string hex() const {
    static const char* digits = "0123456789abcdef";
    std::string out(16, '0');
    for (int i = 0; i < 16; ++i) out[15 - i] = digits[(h_ >> (4 * i)) & 0xF];
    return out;
  }

 private:
  uint64_t h_ = 0xCBF29CE484222325ull;
};

}  // namespace lt::data
