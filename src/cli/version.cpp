#include <torch/cuda.h>
#include <torch/version.h>

#include <fmt/format.h>

#include "commands.h"
#include "loratrain/version.h"

namespace lt::cli {

std::string version_text() {
  std::string text = fmt::format("lora-train {}\nLibTorch {}\n", kVersion, TORCH_VERSION);
  const bool cuda = torch::cuda::is_available();
  text += fmt::format("CUDA: {}\n", cuda ? "available" : "not available");
  text += "devices: cpu";
  if (cuda) text += fmt::format(", {} CUDA device(s)", torch::cuda::device_count());
  return text;
}

}  // namespace lt::cli
