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

// An AMD processor. Zen 4 runs a 512-bit multiply-add on its two 256-bit units at once, so its
// direct AVX-512 convolutions run at half an Intel core's rate per cycle, and algorithms that trade
// multiplications for memory passes (Winograd) pay off on smaller inputs there.
inline bool cpu_is_amd() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  return __builtin_cpu_is("amd");
#else
  return false;
#endif
}

}  // namespace lt::util
