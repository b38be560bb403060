#include "loratrain/memory/device_memory.h"

#include <climits>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "loratrain/memory/budget_allocator.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::memory {

std::unique_ptr<DeviceMemory> make_device_memory(const DeviceMemoryOptions& options) {
  const std::string device = to_lower(trim(options.device));
  if (device == "cpu") {
    if (options.vram_limit > 0) {
      throw InputError("memory.vram_limit applies to CUDA devices; on the CPU use memory.simulate_vram");
    }
    return std::make_unique<CpuMemory>(options.simulate_vram);
  }
  if (device == "cuda" || starts_with(device, "cuda:")) {
    int index = 0;
    if (device.size() > 5) {
      const std::string digits = device.substr(5);
      if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
        throw InputError("device '" + options.device + "': expected cuda or cuda:N");
      }
      index = std::stoi(digits);
    }
    if (options.simulate_vram > 0) {
      throw InputError("memory.simulate_vram applies to device cpu; on CUDA use memory.vram_limit");
    }
#ifdef LT_WITH_CUDA
    return make_cuda_memory(index, options.vram_limit);
#else
    (void)index;
    throw InputError("device '" + options.device +
                     "' requested, but this lora-train was built against a CPU-only LibTorch "
                     "(rebuild with a CUDA LibTorch, see README)");
#endif
  }
  throw InputError("unknown device '" + options.device + "' (cpu, cuda, cuda:N)");
}

bool tune_host_allocator() {
#if defined(__GLIBC__)
  // Large tensors otherwise come from mmap and go back to the kernel on free, so the next step
  // faults the same buffers in again page by page. Serving them from the heap and never trimming
  // it trades resident memory (bounded by the run's peak) for steady step times.
  bool ok = mallopt(M_MMAP_MAX, 0) == 1;
  ok = mallopt(M_TRIM_THRESHOLD, INT_MAX) == 1 && ok;
  // Grow the heap in 64 MiB steps rather than page by page.
  ok = mallopt(M_TOP_PAD, 64 << 20) == 1 && ok;
  return ok;
#else
  return false;
#endif
}

}  // namespace lt::memory
