// The host allocator under every CPU tensor: large blocks come from one reserved address range and
// stay resident after they are freed, so the next training step reuses them instead of getting
// fresh pages from the kernel (mmap, page faults, zeroing, munmap: system time on every step).
// It does for the host what CUDA's caching allocator does for the GPU, without any environment
// variable: glibc's tunables would have to be set before the process starts.
#pragma once
#include <cstdint>

#include <c10/core/Allocator.h>

#include "loratrain/memory/compat.h"

namespace lt::memory {

struct HostCacheStats {
  int64_t live = 0;       // bytes in blocks handed out from the range
  int64_t cached = 0;     // bytes freed and kept resident for reuse
  int64_t committed = 0;  // bytes of the range made usable so far (live + cached + the unused top)
  int64_t hits = 0;       // large allocations served from cached blocks
  int64_t grows = 0;      // large allocations that needed bytes the range had never handed out
};

// Process-wide and never destroyed: blocks may be freed after every other object is gone.
// Blocks below kMinBlock bytes go to c10's default CPU allocator (glibc keeps those in its heap);
// larger ones are best-fit from the free ranges, split and coalesced by address, the whole range
// advised for transparent huge pages. A request the range cannot hold (or the kernel will not
// commit) goes to the default allocator as well, which fails with its usual host-RAM message.
class HostCachingAllocator final : public c10::Allocator {
 public:
  static constexpr int64_t kMinBlock = 256 << 10;
  static HostCachingAllocator& instance();

  LT_C10_ALLOCATOR_METHODS(allocate_impl)
  c10::DeleterFnPtr raw_deleter() const override;

  HostCacheStats stats() const;
  // Gives the cached (free) bytes back to the kernel; their addresses stay reusable.
  int64_t release_cached();

  struct Range;
  Range& range() const { return *range_; }

 private:
  HostCachingAllocator();
  c10::DataPtr allocate_impl(size_t n) const;
  Range* range_;
};

}  // namespace lt::memory
