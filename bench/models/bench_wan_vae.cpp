// lt-bench-wan-vae: peak memory of Wan 2.1's VAE encoding 17 vs 81 frames (and decoding them back).
// The VAE runs in time chunks with the causal frame cache, so the peak above the weights should
// not grow with the frame count (issue bound: 81 frames at most 1.5x of 17).
//
//   lt-bench-wan-vae [--size 64] [--threads 2]            both frame counts, each in a fresh process
//   lt-bench-wan-vae --frames N [--size S] [--threads T]  one measurement (what the above runs)
//
// The model is the full-size Wan 2.1 VAE (base_dim 96, dim_mult 1,2,4,4, 2 res blocks, 16 latent
// channels) with random weights, fp32 on the CPU. Peak = VmHWM of the measuring process after the
// weights are built, minus its resident set at that point: the memory the encode itself needs.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "loratrain/models/wan/vae.h"

namespace {

double status_kb(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string f = field;
  while (std::getline(status, line)) {
    if (line.rfind(f, 0) == 0) return std::stod(line.substr(f.size()));
  }
  return 0;
}

void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

double mib(double kb) { return kb / 1024.0; }

int measure(int64_t frames, int64_t size, int threads) {
  torch::set_num_threads(threads);
  torch::NoGradGuard no_grad;
  torch::manual_seed(0);
  lt::models::wan::AutoencoderKLWan vae(lt::models::wan::WanVaeConfig{});
  vae->eval();
  const at::Tensor video = torch::rand({1, 3, frames, size, size}) * 2 - 1;
  reset_peak_rss();
  const double base = status_kb("VmRSS:");
  auto t0 = std::chrono::steady_clock::now();
  const at::Tensor latents = vae->encode(video).first;
  const double encode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double encode_peak = status_kb("VmHWM:") - base;
  reset_peak_rss();
  const double base2 = status_kb("VmRSS:");
  t0 = std::chrono::steady_clock::now();
  const at::Tensor decoded = vae->decode(latents);
  const double decode_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double decode_peak = status_kb("VmHWM:") - base2;
  std::printf("frames=%lld size=%lld latent_frames=%lld encode_peak_mib=%.1f encode_s=%.1f decode_peak_mib=%.1f decode_s=%.1f "
              "video_mib=%.1f\n",
              static_cast<long long>(frames), static_cast<long long>(size), static_cast<long long>(latents.size(2)),
              mib(encode_peak), encode_s, mib(decode_peak), decode_s,
              static_cast<double>(video.numel() * 4) / (1024.0 * 1024.0));
  return decoded.size(2) == frames ? 0 : 1;
}

double field(const std::string& line, const std::string& key) {
  const size_t at = line.find(key + "=");
  return at == std::string::npos ? 0 : std::stod(line.substr(at + key.size() + 1));
}

}  // namespace

int main(int argc, char** argv) {
  int64_t frames = 0, size = 64;
  int threads = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--frames") frames = std::stoll(argv[i + 1]);
    else if (a == "--size") size = std::stoll(argv[i + 1]);
    else if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: lt-bench-wan-vae [--frames N] [--size S] [--threads T]\n");
      return 2;
    }
  }
  if (frames > 0) return measure(frames, size, threads);
  double peaks[2] = {0, 0};
  const int64_t counts[2] = {17, 81};
  // Resolved here: inside popen's shell, /proc/self/exe is the shell.
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  for (int k = 0; k < 2; ++k) {
    const std::string cmd = self + " --frames " + std::to_string(counts[k]) + " --size " + std::to_string(size) +
                            " --threads " + std::to_string(threads);
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return 1;
    char buf[512];
    std::string line;
    while (std::fgets(buf, sizeof buf, p)) line += buf;
    if (pclose(p) != 0) return 1;
    std::fputs(line.c_str(), stdout);
    peaks[k] = field(line, "encode_peak_mib");
  }
  std::printf("encode peak 81 / 17 frames: %.2fx (bound 1.5x)\n", peaks[1] / peaks[0]);
  return peaks[1] <= 1.5 * peaks[0] ? 0 : 3;
}
