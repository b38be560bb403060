// The embedded demo's tiny SD1-architecture base model with seeded random weights.
#pragma once
#include <cstdint>
#include <filesystem>

namespace lt::train {

// Writes OUT/model.safetensors (single file, LDM key names) and OUT/tokenizer/ (vocab.json +
// merges.txt covering the demo captions' words and the trigger word "ltdemo"). With `full_size`
// the modules have SD1.5's real shapes (860M-parameter UNet, SD VAE, CLIP ViT-L text encoder).
void write_demo_base(const std::filesystem::path& out_dir, uint64_t seed = 1234, bool full_size = false);

}  // namespace lt::train
