// The CUDA backend: statistics from the caching allocator (what torch.cuda.memory_allocated,
// memory_reserved and max_memory_allocated report), free/total from the driver, and
// memory.vram_limit as a per-process memory fraction. Compiled only with LT_WITH_CUDA.
#ifdef LT_WITH_CUDA
#include <cstdlib>

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <spdlog/spdlog.h>

#include "loratrain/memory/compat.h"
#include "loratrain/memory/device_memory.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::memory {

namespace {

namespace cca = c10::cuda::CUDACachingAllocator;

// Index 0 of every StatArray is the aggregate over small and large pools in every LibTorch
// version (StatType::AGGREGATE moved namespaces in 2.x; its value did not).
constexpr size_t kAggregate = 0;

class CudaMemory final : public DeviceMemory {
  // Defined before its callers: its return type (the allocator's DeviceStats) is deduced, and its
  // name and namespace differ between LibTorch versions.
  auto stats() const { return cca::getDeviceStats(device_); }

 public:
  CudaMemory(int device, int64_t vram_limit) : device_(static_cast<c10::DeviceIndex>(device)) {
    // The allocator reads its settings once, at its first use: set ours before that unless the
    // user chose their own.
    if (std::getenv("PYTORCH_CUDA_ALLOC_CONF") == nullptr && std::getenv("PYTORCH_ALLOC_CONF") == nullptr) {
      setenv("PYTORCH_CUDA_ALLOC_CONF", compat::default_cuda_alloc_conf(), 0);
    }
    int count = 0;
    C10_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (device < 0 || device >= count) {
      throw InputError("device cuda:" + std::to_string(device) + " does not exist (" +
                       std::to_string(count) + " CUDA device(s))");
    }
    c10::cuda::CUDAGuard guard(device_);
    // One tiny tensor initialises the CUDA context and the caching allocator for this device, so
    // that the memory fraction below has a pool to apply to.
    at::empty({1}, at::TensorOptions().device(at::kCUDA, device_).dtype(at::kByte));
    cudaDeviceProp prop{};
    C10_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    device_name_ = prop.name;
    size_t free = 0, total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    total_ = static_cast<int64_t>(total);
    // The fraction is process-wide state of the allocator: set it every time (1.0 without a
    // limit), so that a run never inherits an earlier run's cap in the same process.
    limit_ = vram_limit > 0 && vram_limit < total_ ? vram_limit : 0;
    cca::setMemoryFraction(limit_ > 0 ? static_cast<double>(limit_) / static_cast<double>(total_) : 1.0, device_);
  }

  std::string name() const override {
    std::string n = "cuda:" + std::to_string(static_cast<int>(device_)) + " (" + device_name_ + ")";
    if (limit_ > 0) n += " limited to " + format_bytes(limit_);
    return n;
  }
  int64_t allocated() const override { return stats().allocated_bytes[kAggregate].current; }
  int64_t reserved() const override { return stats().reserved_bytes[kAggregate].current; }
  int64_t peak_allocated() const override { return stats().allocated_bytes[kAggregate].peak; }
  void reset_peak() override { cca::resetPeakStats(device_); }
  void empty_cache() override { cca::emptyCache(); }
  bool is_cuda() const override { return true; }

  FreeTotal free_and_total() const override {
    c10::cuda::CUDAGuard guard(device_);
    size_t free = 0, total = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    FreeTotal ft{static_cast<int64_t>(free), static_cast<int64_t>(total)};
    if (limit_ > 0) {
      // Under the fraction cap the process can only grow its pool up to the limit.
      ft.total = limit_;
      ft.free = std::max<int64_t>(0, std::min<int64_t>(ft.free, limit_ - reserved()));
    }
    return ft;
  }

 private:
  c10::DeviceIndex device_;
  std::string device_name_;
  int64_t total_ = 0;
  int64_t limit_ = 0;
};

}  // namespace

std::unique_ptr<DeviceMemory> make_cuda_memory(int device_index, int64_t vram_limit) {
  return std::make_unique<CudaMemory>(device_index, vram_limit);
}

}  // namespace lt::memory
#endif  // LT_WITH_CUDA
