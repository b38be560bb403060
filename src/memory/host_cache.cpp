#include "loratrain/memory/host_cache.h"

#include <c10/core/CPUAllocator.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

namespace lt::memory {

namespace {

constexpr int64_t kGranule = 64 << 10;        // block sizes and offsets are multiples of this
constexpr int64_t kHugePage = 2 << 20;        // the range starts on a huge-page boundary
constexpr int64_t kCommitStep = 64 << 20;     // address space is made usable in steps of this
constexpr int64_t kMaxReserve = int64_t(1) << 40;

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Twice the machine's RAM, so any request the host could hold has room (address space is free:
// only committed pages count, and only touched pages are resident).
int64_t reserve_size() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    std::getline(in, unit);
    if (key == "MemTotal:") return std::min(kMaxReserve, round_up(2 * kib * 1024, kCommitStep));
  }
  return int64_t(64) << 30;
}

void host_cache_delete(void* data);

}  // namespace

struct HostCachingAllocator::Range {
  std::mutex mutex;
  char* base = nullptr;       // nullptr: no range could be reserved, everything goes to `fallback`
  int64_t reserved = 0;       // bytes of address space, PROT_NONE beyond `committed`
  int64_t committed = 0;      // prefix made read/write (charged to the kernel's commit accounting)
  int64_t top = 0;            // prefix ever handed out; [top, committed) has never been used
  std::map<int64_t, int64_t> free_by_offset;          // offset -> size, coalesced
  std::set<std::pair<int64_t, int64_t>> free_by_size;  // (size, offset), for best fit
  std::unordered_map<int64_t, int64_t> live;           // offset -> size
  int64_t live_bytes = 0, cached_bytes = 0, hits = 0, grows = 0;
  c10::Allocator* fallback = c10::GetDefaultCPUAllocator();
  c10::DeleterFnPtr fallback_delete = fallback->raw_deleter();

  bool contains(const void* p) const {
    const char* c = static_cast<const char*>(p);
    return base != nullptr && c >= base && c < base + reserved;
  }

  void add_free(int64_t offset, int64_t size) {
    free_by_offset.emplace(offset, size);
    free_by_size.emplace(size, offset);
  }
  void remove_free(std::map<int64_t, int64_t>::iterator it) {
    free_by_size.erase({it->second, it->first});
    free_by_offset.erase(it);
  }

  // The offset of a block of `size` bytes (a multiple of kGranule), or -1 when the range is full
  // or the kernel refuses to commit more.
  int64_t take(int64_t size) {
    auto fit = free_by_size.lower_bound({size, 0});
    if (fit != free_by_size.end()) {
      const auto [block, offset] = *fit;
      remove_free(free_by_offset.find(offset));
      if (block > size) add_free(offset + size, block - size);
      cached_bytes -= size;
      ++hits;
      return offset;
    }
    // Grow at the top, starting inside a free block that ends there (its bytes are reused).
    int64_t start = top;
    auto last = free_by_offset.empty() ? free_by_offset.end() : std::prev(free_by_offset.end());
    const bool extend = last != free_by_offset.end() && last->first + last->second == top;
    if (extend) start = last->first;
    const int64_t end = start + size;
    if (end > reserved) return -1;
    if (end > committed) {
      const int64_t upto = std::min(reserved, round_up(end, kCommitStep));
      if (mprotect(base + committed, upto - committed, PROT_READ | PROT_WRITE) != 0) return -1;
#ifdef MADV_HUGEPAGE
      madvise(base + committed, upto - committed, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
      committed = upto;
    }
    if (extend) {
      cached_bytes -= last->second;
      remove_free(last);
    }
    top = end;
    ++grows;
    return start;
  }

  void give_back(int64_t offset, int64_t size) {
    cached_bytes += size;
    auto next = free_by_offset.lower_bound(offset);
    if (next != free_by_offset.end() && offset + size == next->first) {
      size += next->second;
      remove_free(next);
    }
    auto after = free_by_offset.lower_bound(offset);
    if (after != free_by_offset.begin()) {
      auto prev = std::prev(after);
      if (prev->first + prev->second == offset) {
        offset = prev->first;
        size += prev->second;
        remove_free(prev);
      }
    }
    add_free(offset, size);
  }
};

namespace {

void host_cache_delete(void* data) {
  if (data == nullptr) return;
  HostCachingAllocator::Range& r = HostCachingAllocator::instance().range();
  if (!r.contains(data)) {
    r.fallback_delete(data);
    return;
  }
  const int64_t offset = static_cast<char*>(data) - r.base;
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.live.find(offset);
  if (it == r.live.end()) return;  // not ours to free: never handed out
  const int64_t size = it->second;
  r.live.erase(it);
  r.live_bytes -= size;
  r.give_back(offset, size);
}

}  // namespace

HostCachingAllocator& HostCachingAllocator::instance() {
  static HostCachingAllocator* allocator = new HostCachingAllocator();  // never destroyed
  return *allocator;
}

HostCachingAllocator::HostCachingAllocator() : range_(new Range) {
  const int64_t size = reserve_size();
  // PROT_NONE and not MAP_NORESERVE: nothing is charged until mprotect commits a step, and then
  // the kernel's overcommit check applies as it does to malloc.
  void* p = mmap(nullptr, size + kHugePage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  char* raw = static_cast<char*>(p);
  char* aligned = reinterpret_cast<char*>(round_up(reinterpret_cast<int64_t>(raw), kHugePage));
  if (aligned > raw) munmap(raw, aligned - raw);
  munmap(aligned + size, raw + size + kHugePage - aligned - size);
  range_->base = aligned;
  range_->reserved = size;
}

c10::DeleterFnPtr HostCachingAllocator::raw_deleter() const { return &host_cache_delete; }

c10::DataPtr HostCachingAllocator::allocate_impl(size_t n) const {
  const c10::Device cpu(c10::DeviceType::CPU);
  Range& r = *range_;
  if (static_cast<int64_t>(n) >= kMinBlock && r.base != nullptr) {
    const int64_t size = round_up(static_cast<int64_t>(n), kGranule);
    std::lock_guard<std::mutex> lock(r.mutex);
    const int64_t offset = r.take(size);
    if (offset >= 0) {
      r.live.emplace(offset, size);
      r.live_bytes += size;
      void* data = r.base + offset;
      return {data, data, &host_cache_delete, cpu};
    }
  }
  void* data = r.fallback->raw_allocate(n);  // throws c10's host-RAM error when it cannot
  return {data, data, &host_cache_delete, cpu};
}

HostCacheStats HostCachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(range_->mutex);
  return {range_->live_bytes, range_->cached_bytes, range_->committed, range_->hits, range_->grows};
}

int64_t HostCachingAllocator::release_cached() {
  Range& r = *range_;
  std::lock_guard<std::mutex> lock(r.mutex);
  int64_t released = 0;
  for (const auto& [offset, size] : r.free_by_offset) {
    if (madvise(r.base + offset, size, MADV_DONTNEED) == 0) released += size;
  }
  return released;
}

}  // namespace lt::memory
