// Everything in the memory area that differs between Debian's LibTorch 1.13 (CPU) and the CUDA
// LibTorch 2.x shipped inside PyTorch. Only this header may test TORCH_VERSION_*.
#pragma once
#include <cstring>
#include <string>

#include <c10/core/Allocator.h>
#include <c10/util/Exception.h>
#include <torch/version.h>

namespace lt::memory::compat {

// c10::OutOfMemoryError exists from 1.13 on (1.12 and older only had CUDAOutOfMemoryError, which
// this project does not support). CUDA's caching allocator throws it, and so does our simulated
// VRAM, so the guard catches one type on both builds.
using OutOfMemoryError = c10::OutOfMemoryError;

// Throws c10::OutOfMemoryError without paying for a symbolised backtrace: 1.13 builds the
// backtrace string eagerly (milliseconds per throw), 2.x builds it lazily.
[[noreturn]] inline void throw_out_of_memory(const std::string& message) {
#if TORCH_VERSION_MAJOR >= 2
  C10_THROW_ERROR(OutOfMemoryError, message);
#else
  throw c10::OutOfMemoryError(message, std::string(), nullptr);
#endif
}

// The host allocator's own failure text: 1.13 throws a plain c10::Error ("can't allocate memory"),
// 2.x throws c10::OutOfMemoryError ("not enough memory"). Both mean host RAM, not the GPU.
inline constexpr const char* kHostAllocatorSignatures[] = {
    "DefaultCPUAllocator: can't allocate memory",
    "DefaultCPUAllocator: not enough memory",
};

// Allocator settings we set when the user has not: expandable segments (2.1+) remove most
// fragmentation; older allocators only understand split size and garbage collection.
inline const char* default_cuda_alloc_conf() {
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1)
  return "expandable_segments:True";
#else
  return "max_split_size_mb:128,garbage_collection_threshold:0.8";
#endif
}

// What autograd keeps, where the versions differ (the planner counts it). 1.13's generated
// backward of mean over a dimension saves its input (for the element count), so an RMSNorm
// written as x * rsqrt(mean(x^2)) keeps x^2 beside x; 2.x saves only the count.
inline constexpr bool kMeanKeepsInput = TORCH_VERSION_MAJOR < 2;

}  // namespace lt::memory::compat

// c10::Allocator changed shape: 1.13 has `DataPtr allocate(size_t) const`; 2.3+ has a non-const
// `allocate` plus a pure virtual `copy_data`. Declaring both allocate overloads and copy_data
// (without `override`) makes one class definition correct on both: whichever signature the base
// declares virtual is the one overridden, the other is an ordinary member. Both forward to
// `IMPL(n)`, a const member of the class.
#define LT_C10_ALLOCATOR_METHODS(IMPL)                                               \
  c10::DataPtr allocate(size_t n) const { return IMPL(n); }                          \
  c10::DataPtr allocate(size_t n) { return IMPL(n); }                                \
  void copy_data(void* dest, const void* src, std::size_t count) const {             \
    if (count > 0) std::memcpy(dest, src, count);                                    \
  }
