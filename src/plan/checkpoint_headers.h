// Inside the planner: parameter counts read from checkpoint headers (never the weights), shared by
// the transformer families' files.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace lt::io {
class SafetensorsFile;
}

namespace lt::plan {

// Counts the tensors under `prefix` into a component's totals: elements, the largest tensor and,
// when asked, the elements of its Linear weights (2-D `.weight`s). A scaled fp8 file's scales and
// marker and an embedded tokenizer (ComfyUI's umT5 `spiece_model`) are not weights.
void count_weights(const io::SafetensorsFile& file, const std::string& prefix, int64_t& total, int64_t& largest,
                   int64_t* linear = nullptr);

// A diffusers pipeline's component folder (transformer/, text_encoder/, vae/, ...): every weight
// file of it (one file or the shards its index names) counted as above and then given to `each`
// (e.g. to read shapes). False when the folder is not there.
bool count_component(const std::filesystem::path& folder, int64_t& total, int64_t& largest, int64_t* linear = nullptr,
                     const std::function<void(const io::SafetensorsFile&)>& each = {});

}  // namespace lt::plan
