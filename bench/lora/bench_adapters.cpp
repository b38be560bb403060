// LoRA, LoKr and LoHa at equal rank on the full-size SD1.5 UNet (diffusers' default config,
// random weights) on CPU. For each adapter type, on the same targets (attention/proj Linears and
// the resnet/sampler convs, kohya's LoCon set): modules, trainable parameters, the bytes of the
// adapter's training state (fp32 weights + grads + AdamW's two moments), and one forward+backward
// at a small latent size with the time and the peak RSS above the frozen model.
//
//   lt-bench-adapters [--rank 16] [--latent 32] [--threads 2]
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "loratrain/lora/network.h"
#include "loratrain/models/sd/unet.h"

using lt::lora::AdapterType;
using lt::models::sd::UNet2DConditionModel;
using lt::models::sd::UNetConfig;
using Clock = std::chrono::steady_clock;

namespace {

double vm_hwm_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // kB
  }
  return 0.0;
}
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }
double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

}  // namespace

int main(int argc, char** argv) {
  int64_t rank = 16, latent = 32;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rank")) rank = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--latent")) latent = std::stoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads")) threads = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s [--rank N] [--latent N] [--threads N]\n", argv[0]);
      return 2;
    }
  }
  torch::set_num_threads(threads);
  torch::manual_seed(0);
  UNet2DConditionModel unet(UNetConfig::sd15());
  for (auto& p : unet->parameters()) p.set_requires_grad(false);
  std::printf("SD1.5 UNet, rank %lld, latents %lldx%lld, batch 1, %d threads, checkpointing off\n",
              static_cast<long long>(rank), static_cast<long long>(latent), static_cast<long long>(latent), threads);
  std::printf("| adapter | modules | parameters | training state (MiB) | fwd+bwd (s) | peak RSS above the model (MiB) |\n");
  std::printf("|---|---|---|---|---|---|\n");

  const at::Tensor x = torch::randn({1, 4, latent, latent}), ctx = torch::randn({1, 77, 768}), t = torch::tensor({500});
  struct Variant {
    const char* name;
    AdapterType type;
    bool full;
  };
  for (const Variant& v : {Variant{"LoRA/LoCon", AdapterType::LoRA, false},
                           Variant{"LoKr", AdapterType::LoKr, false}, Variant{"LoKr full-rank", AdapterType::LoKr, true},
                           Variant{"LoHa", AdapterType::LoHa, false}}) {
    lt::lora::NetworkConfig config;
    config.type = v.type;
    config.linear = rank;
    config.linear_alpha = static_cast<double>(rank);
    config.conv = rank;
    config.lokr_full_rank = v.full;
    lt::lora::LoRANetwork network(config);
    network->add_component(lt::lora::ComponentSpec::sd_unet(), *unet);
    network->apply_to();
    size_t params = 0;
    for (const auto& p : network->parameters()) params += p.numel();
    // fp32 weights, their gradients and AdamW's exp_avg / exp_avg_sq.
    const double state = 4.0 * 4.0 * static_cast<double>(params);
    reset_peak_rss();
    const double before = vm_hwm_bytes();
    auto t0 = Clock::now();
    unet->forward(x, t, ctx).pow(2).mean().backward();
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("| %s | %zu | %zu | %.1f | %.1f | %.0f |\n", v.name, network->modules().size(), params,
                mib(state), secs, mib(vm_hwm_bytes() - before));
    std::fflush(stdout);
    network->remove();
  }
  return 0;
}
