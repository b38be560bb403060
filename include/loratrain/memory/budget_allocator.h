// Simulated VRAM on the CPU: a c10::Allocator that wraps the default CPU allocator, counts live
// bytes and, when a budget would be exceeded, throws c10::OutOfMemoryError with a message shaped
// like the CUDA caching allocator's. Installed process-wide, every CPU tensor allocation goes
// through it, so OOMs come from the real allocation sites (DESIGN.md principle 3).
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include <c10/core/Allocator.h>

#include "loratrain/memory/compat.h"
#include "loratrain/memory/device_memory.h"

namespace lt::memory {

class CpuBudgetAllocator final : public c10::Allocator {
 public:
  // budget_bytes 0 = unlimited (counting only). `underlying` must support the raw interface
  // (raw_deleter() != nullptr); nullptr = the host caching allocator (host_cache.h).
  explicit CpuBudgetAllocator(int64_t budget_bytes = 0, c10::Allocator* underlying = nullptr);
  ~CpuBudgetAllocator() override;
  CpuBudgetAllocator(const CpuBudgetAllocator&) = delete;
  CpuBudgetAllocator& operator=(const CpuBudgetAllocator&) = delete;

  LT_C10_ALLOCATOR_METHODS(allocate_impl)
  c10::DeleterFnPtr raw_deleter() const override;

  int64_t budget() const;
  void set_budget(int64_t bytes);
  int64_t allocated() const;     // live bytes handed out by this allocator
  int64_t peak_allocated() const;
  void reset_peak();             // peak := allocated
  int64_t live_blocks() const;
  int64_t free_bytes() const;    // budget - allocated - occupied (0 when unlimited)

  // Test hooks (the OOM scenarios of issue 6).
  // Budget held by "another process": it lowers free memory without any tensor behind it.
  void occupy(int64_t bytes);    // sets (not adds) the occupied amount
  int64_t occupied() const;
  // The next `n` allocations of at least `min_bytes` fail with the same OutOfMemoryError.
  void fail_next_allocations(int n, int64_t min_bytes = 0);
  // Each allocation of at least `min_bytes` fails with `probability`, deterministically from
  // `seed` and the allocation's sequence number, until `max_failures` have been injected.
  void fail_randomly(double probability, uint64_t seed, int max_failures, int64_t min_bytes = 0);
  void clear_faults();
  int injected_failures() const;  // faults injected so far

 // Shared by the allocator and its live blocks (defined in the .cpp).
  struct State;

 private:
  c10::DataPtr allocate_impl(size_t n) const;
  [[noreturn]] void throw_oom(size_t n, bool injected) const;
  bool should_inject(size_t n) const;

  State* state_;  // shared with live blocks: freed by whichever of allocator / last block goes last
  c10::Allocator* underlying_;
};

// Installs an allocator as c10's CPU allocator for its lifetime and restores the previous one.
class ScopedCpuAllocator {
 public:
  explicit ScopedCpuAllocator(c10::Allocator* allocator);
  ~ScopedCpuAllocator();
  ScopedCpuAllocator(const ScopedCpuAllocator&) = delete;
  ScopedCpuAllocator& operator=(const ScopedCpuAllocator&) = delete;

 private:
  c10::Allocator* previous_;
};

// The CPU backend: counting allocator installed process-wide; with a budget it is simulated VRAM
// (total = budget), without one total/free come from the host (/proc/meminfo).
class CpuMemory final : public DeviceMemory {
 public:
  explicit CpuMemory(int64_t simulate_vram = 0);
  std::string name() const override;
  int64_t allocated() const override { return allocator_.allocated(); }
  // The host cache under the budget (host_cache.h) is host RAM, not simulated VRAM: the books
  // count live tensors, as a budget with nothing cached would.
  int64_t reserved() const override { return allocator_.allocated(); }
  int64_t peak_allocated() const override { return allocator_.peak_allocated(); }
  void reset_peak() override { allocator_.reset_peak(); }
  FreeTotal free_and_total() const override;
  void empty_cache() override {}
  bool is_host() const override { return allocator_.budget() <= 0; }
  CpuBudgetAllocator& allocator() { return allocator_; }

 private:
  CpuBudgetAllocator allocator_;
  ScopedCpuAllocator installed_;
};

// PyTorch's size format in allocator messages ("0 bytes", "20.00 MiB", "1.50 GiB").
std::string format_allocator_size(int64_t bytes);

}  // namespace lt::memory
