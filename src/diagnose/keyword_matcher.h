// Multi-keyword search over lowercase text, fast enough for 100 MB logs: keywords of >= 4 bytes
// are bucketed by a hash of their first 4 bytes, and a 4096-bit filter rejects almost every
// position with one lookup. Each keyword carries the table and row it came from, so the analyzer
// can dispatch a hit to the rule that owns it.
#pragma once
#include <array>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace lt::diagnose::detail {

struct Keyword {
  std::string text;   // lowercase, at least 4 bytes
  uint8_t table = 0;  // which rule table the keyword belongs to (the analyzer's own enum)
  uint16_t row = 0;   // row in that table
};

class KeywordMatcher {
 public:
  explicit KeywordMatcher(std::vector<Keyword> keywords) : keywords_(std::move(keywords)) {
    buckets_.resize(kBuckets);
    for (size_t id = 0; id < keywords_.size(); ++id) {
      const uint32_t h = hash(keywords_[id].text.data());
      filter_[h >> 6] |= uint64_t(1) << (h & 63);
      buckets_[h].push_back(static_cast<uint16_t>(id));
    }
  }
  const Keyword& keyword(size_t id) const { return keywords_[id]; }
  size_t size() const { return keywords_.size(); }

  // Calls fn(id, pos) for every occurrence of every keyword in `s`.
  template <class Fn>
  void scan(std::string_view s, Fn&& fn) const {
    if (s.size() < 4) return;
    const char* p = s.data();
    const size_t last = s.size() - 4;
    for (size_t i = 0; i <= last; ++i) {
      const uint32_t h = hash(p + i);
      if (!(filter_[h >> 6] & (uint64_t(1) << (h & 63)))) continue;
      for (uint16_t id : buckets_[h]) {
        const std::string& t = keywords_[id].text;
        if (t.size() <= s.size() - i && std::memcmp(p + i, t.data(), t.size()) == 0) fn(id, i);
      }
    }
  }

 private:
  static constexpr uint32_t kBits = 12;
  static constexpr uint32_t kBuckets = 1u << kBits;
  static uint32_t hash(const char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return (v * 2654435761u) >> (32 - kBits);
  }
  std::vector<Keyword> keywords_;
  std::array<uint64_t, kBuckets / 64> filter_{};
  std::vector<std::vector<uint16_t>> buckets_;
};

}  // namespace lt::diagnose::detail
