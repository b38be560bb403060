// What the x86 CPU this process runs on can execute, for choices between kernels. Header-only and
// free of LibTorch: the CLI reads it before LibTorch's first kernel call.
#pragma once

namespace lt::util {

// AVX-512 F, BW, VL and DQ together. LibTorch's AVX-512 kernels (ATEN_CPU_CAPABILITY=avx512) and
// its oneDNN bf16 convolutions (mkldnn_bf16_device_check) both need all four.
inline bool cpu_has_avx512_core() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return false;
#endif
}

}  // namespace lt::util
