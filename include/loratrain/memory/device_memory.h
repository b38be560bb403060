// What the OOM guard knows about the device's memory, whatever the device is: CUDA's caching
// allocator, or the CPU with (optionally) a simulated VRAM budget (DESIGN.md principle 3).
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace lt::memory {

struct FreeTotal {
  int64_t free = 0;   // bytes the device could still hand out to this process
  int64_t total = 0;  // the device's (or the budget's) capacity
};

// Mirrors torch.cuda.memory_allocated / memory_reserved / max_memory_allocated.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  virtual std::string name() const = 0;      // "cuda:0 (NVIDIA H200)", "cpu (simulated VRAM 1.50 GiB)"
  virtual int64_t allocated() const = 0;     // bytes held by live tensors
  virtual int64_t reserved() const = 0;      // bytes held by the allocator (>= allocated)
  virtual int64_t peak_allocated() const = 0;  // max of allocated() since the last reset_peak()
  virtual void reset_peak() = 0;
  virtual FreeTotal free_and_total() const = 0;
  virtual void empty_cache() = 0;            // return cached, unused blocks to the device
  virtual bool is_cuda() const { return false; }
  // Plain host RAM (CPU without a simulated budget): total/free are the machine's, shared with
  // the OS, so "memory held by others" means nothing there.
  virtual bool is_host() const { return false; }
};

struct DeviceMemoryOptions {
  std::string device = "cpu";   // "cpu", "cuda", "cuda:N"
  int64_t simulate_vram = 0;    // memory.simulate_vram (CPU only): budget in bytes, 0 = none
  int64_t vram_limit = 0;       // memory.vram_limit (CUDA only): cap below the card, 0 = none
};

// The backend for `options.device`. On CPU it installs the counting/budget allocator process-wide
// until the returned object is destroyed. CUDA in a build without CUDA throws lt::InputError.
std::unique_ptr<DeviceMemory> make_device_memory(const DeviceMemoryOptions& options);

// Tunes glibc malloc for training: large buffers stay in the heap after free instead of going back
// to the kernel. Without it every step re-faults its activation buffers page by page (measured at
// up to 15 s/step on CPU for big activations). Call once at start, before the first big
// allocation. Returns false when malloc refused a setting (non-glibc libc: no effect).
bool tune_host_allocator();

#ifdef LT_WITH_CUDA
// cuda_memory.cpp: caching-allocator statistics, cudaMemGetInfo, per-process memory fraction.
std::unique_ptr<DeviceMemory> make_cuda_memory(int device_index, int64_t vram_limit);
#endif

}  // namespace lt::memory
