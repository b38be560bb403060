// What diagnose's advice shares with lora-train's OOM guard (src/memory/ladder.cpp), for the lines
// of the playbook's ladder that it writes out as settings.
#pragma once
#include <algorithm>

namespace lt::diagnose {

// Frame counts stay 4k+1 (Wan/HunyuanVideo VAE): 81 -> 41 -> 21 -> 9 -> 5 -> 1.
inline int lower_frames(int n) {
  if (n <= 1) return 1;
  return std::max(1, std::min(((n - 1) / 2 / 4) * 4 + 1, n - 1));
}

// The attention chunk the guard sets (memory::kGuardAttentionChunk).
inline constexpr int kGuardAttentionChunk = 1024;

}  // namespace lt::diagnose
