// Helpers the LoRA tests share over a built network.
#pragma once
#include <cstdint>
#include <set>
#include <string>

#include "loratrain/lora/network.h"

namespace lt::test {

inline std::set<std::string> names_of(const lora::LoRANetwork& net) {
  std::set<std::string> out;
  for (const auto& m : net->modules()) out.insert(m->lora_name);
  return out;
}

// Gives every adapter non-zero up weights (a trained adapter), deterministically.
inline void randomize_up(lora::LoRANetwork& net, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& m : net->modules()) m->lora_up.normal_(0.0, 0.1);
}

}  // namespace lt::test
