// Benchmark of the full-size SD1.5 UNet (diffusers' default UNet2DConditionModel config) on CPU.
//
//   lt-bench-sd15 [--file PATH] [--iters N] [--threads N] [--skip-write]
//
// 1. Builds the UNet with random weights and writes it as an LDM single file
//    (model.diffusion_model.* keys, fp32), as users download checkpoints.
// 2. Re-executes itself with --load-only in a fresh process, which builds the module, detects the
//    layout, loads the file into it and reports the load time and peak RSS (VmHWM of the fresh
//    process; ru_maxrss too) against the weights' size: the bound is 1.2x (no second copy).
// 3. Times forward and forward+backward at 64x64 latents, batch 1, with and without gradient
//    checkpointing (weights frozen; gradients flow to the input, as a LoRA run's would to adapters).
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "loratrain/models/key_maps.h"
#include "loratrain/models/sd/load.h"

using namespace lt::models;
using namespace lt::models::sd;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) * 1024.0;  // Linux reports KiB
}

// Peak resident set of the current address space (VmHWM). Unlike ru_maxrss it starts afresh at
// exec (ru_maxrss keeps the forked parent's peak) and can be reset between phases.
double vm_hwm_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) * 1024.0;  // kB
  }
  return 0;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

size_t weight_bytes(torch::nn::Module& m) {
  size_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel() * p.element_size();
  return n;
}

int load_only(const std::string& path) {
  const double rss_start = vm_hwm_bytes();
  auto t0 = Clock::now();
  auto file = lt::io::SafetensorsFile::open(path);
  UNetConfig config = UNetConfig::detect_from_weights(*file, "model.diffusion_model.");
  UNet2DConditionModel unet(config);
  const double t_build = seconds_since(t0);
  auto t1 = Clock::now();
  const size_t loaded = load_unet(*unet, *file);
  const double t_load = seconds_since(t1);
  const double bytes = static_cast<double>(weight_bytes(*unet));
  const double peak = vm_hwm_bytes();
  std::printf("load_only tensors=%zu weights_gib=%.3f detect_build_s=%.2f load_s=%.2f peak_rss_gib=%.3f (VmHWM) "
              "peak_over_weights=%.3f rss_at_start_gib=%.3f ru_maxrss_gib=%.3f\n",
              loaded, gib(bytes), t_build, t_load, gib(peak), peak / bytes, gib(rss_start), gib(peak_rss_bytes()));
  return peak / bytes <= 1.2 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::string path = "/tmp/lt-bench-sd15.safetensors";
  int iters = 1, threads = 0;
  bool skip_write = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--file" && i + 1 < argc) path = argv[++i];
    else if (a == "--iters" && i + 1 < argc) iters = std::stoi(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) threads = std::stoi(argv[++i]);
    else if (a == "--skip-write") skip_write = true;
    else if (a == "--load-only" && i + 1 < argc) return load_only(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--file PATH] [--iters N] [--threads N] [--skip-write]\n", argv[0]);
      return 2;
    }
  }
  if (threads > 0) torch::set_num_threads(threads);
  std::printf("torch threads: %d\n", torch::get_num_threads());

  const UNetConfig config = UNetConfig::sd15();
  auto t0 = Clock::now();
  torch::manual_seed(0);
  UNet2DConditionModel unet(config);
  size_t params = 0;
  for (const auto& p : unet->parameters()) params += p.numel();
  std::printf("build: %zu parameters, %.3f GiB fp32, %.2f s\n", params, gib(weight_bytes(*unet)), seconds_since(t0));

  if (!skip_write) {
    auto t1 = Clock::now();
    const KeyMap map = unet_ldm_key_map(config);
    std::vector<std::pair<std::string, at::Tensor>> tensors;
    for (const auto& p : unet->named_parameters()) tensors.emplace_back(map.to_ldm(p.key()), p.value());
    lt::io::save_safetensors(path, tensors, {{"format", "pt"}});
    std::printf("write: %s, %.2f s\n", path.c_str(), seconds_since(t1));
  }

  // The load is measured in a fresh process: this one already holds a full model.
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    execl("/proc/self/exe", argv[0], "--load-only", path.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("load check: %s\n", WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "peak RSS within 1.2x weights" : "FAILED");

  for (auto& p : unet->parameters()) p.set_requires_grad(false);
  torch::manual_seed(1);
  at::Tensor x = torch::randn({1, 4, 64, 64}), ctx = torch::randn({1, 77, 768}), t = torch::tensor({500});
  {
    torch::NoGradGuard no_grad;
    unet->forward(x, t, ctx);  // warm-up
    auto t2 = Clock::now();
    for (int i = 0; i < iters; ++i) unet->forward(x, t, ctx);
    std::printf("forward (no grad) 64x64 b1: %.2f s/it\n", seconds_since(t2) / iters);
  }
  for (bool ckpt : {false, true}) {
    unet->set_gradient_checkpointing(ckpt);
    reset_peak_rss();
    const double rss_before = vm_hwm_bytes();
    auto t3 = Clock::now();
    for (int i = 0; i < iters; ++i) {
      at::Tensor xi = x.clone().set_requires_grad(true);
      unet->forward(xi, t, ctx).pow(2).mean().backward();
    }
    std::printf("forward+backward 64x64 b1, checkpointing %s: %.2f s/it (peak RSS %.2f GiB, %.2f GiB above the model)\n",
                ckpt ? "on " : "off", seconds_since(t3) / iters, gib(vm_hwm_bytes()), gib(vm_hwm_bytes() - rss_before));
  }
  return 0;
}
