// Benchmark: a Flux.1 LoRA training step with the frozen base in bf16 and with the base as fp8 e4m3
// codes (model.quantize: true, qtype qfloat8), on the CPU.
//
//   lt-bench-flux-quant [--hidden N] [--double N] [--single N] [--px N] [--txt N] [--rank N] [--steps N]
//
// The transformer is FLUX.1-dev's architecture at a middle size (default 512 wide = 4 heads of 128,
// 2 double + 4 single blocks, a 1024-wide text projection) with random weights; a rank-16 LoRA sits
// on every Linear of the blocks (AI Toolkit's targets); one image of px x px pixels
// ((px/16)^2 tokens) beside `txt` text tokens; gradient checkpointing on; AdamW on the adapter.
// Memory is counted by the project's CPU allocator (every tensor allocation, so the figures do not
// depend on the machine's load): the weights after load, and the peak of each training step
// (forward, backward, optimizer step) with everything that is alive. Seconds per step are wall
// time and do depend on the load.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "loratrain/lora/network.h"
#include "loratrain/memory/budget_allocator.h"
#include "loratrain/models/flux/transformer.h"
#include "loratrain/models/layers.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace flux = lt::models::flux;

struct Options {
  int64_t hidden = 512, double_blocks = 2, single_blocks = 4, px = 256, txt = 256, rank = 16, steps = 3;
};

struct Result {
  int64_t weights = 0;   // bytes alive after load (and quantization)
  int64_t step_peak = 0; // largest peak over the steps
  double seconds = 0;    // median seconds per step after the first
};

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

Result run(const Options& o, bool fp8, lt::memory::CpuBudgetAllocator& alloc) {
  torch::manual_seed(0);
  const int64_t before = alloc.allocated();
  flux::FluxConfig c;
  c.num_attention_heads = o.hidden / 128;
  c.attention_head_dim = 128;
  c.num_layers = o.double_blocks;
  c.num_single_layers = o.single_blocks;
  c.joint_attention_dim = 1024;
  c.guidance_embeds = true;
  flux::FluxTransformer2DModel model(c);
  model->to(torch::kBFloat16);
  if (fp8) lt::models::quantize_linear_layers(*model, lt::models::WeightQuantization::fp8_e4m3);
  Result r;
  r.weights = alloc.allocated() - before;

  lt::lora::NetworkConfig net_config;
  net_config.linear = o.rank;
  net_config.linear_alpha = static_cast<double>(o.rank);
  lt::lora::LoRANetwork network(net_config);
  network->add_component(lt::lora::ComponentSpec::flux_transformer(), *model);
  network->apply_to();
  model->set_gradient_checkpointing(true);
  torch::optim::AdamW optimizer(network->parameters(), torch::optim::AdamWOptions(1e-4));

  const int64_t tokens = (o.px / 16) * (o.px / 16), side = o.px / 16;
  flux::FluxInputs in;
  in.hidden_states = torch::randn({1, tokens, c.in_channels}).to(torch::kBFloat16);
  in.encoder_hidden_states = torch::randn({1, o.txt, c.joint_attention_dim}).to(torch::kBFloat16);
  in.pooled_projections = torch::randn({1, c.pooled_projection_dim}).to(torch::kBFloat16);
  in.timestep = torch::full({1}, 0.5).to(torch::kBFloat16);
  in.guidance = torch::full({1}, 1.0).to(torch::kBFloat16);
  in.txt_ids = torch::zeros({o.txt, 3});
  const at::Tensor rows = torch::arange(side).repeat_interleave(side).to(torch::kFloat);
  const at::Tensor cols = torch::arange(side).repeat({side}).to(torch::kFloat);
  in.img_ids = torch::stack({torch::zeros({tokens}), rows, cols}, 1);
  const at::Tensor target = torch::randn({1, tokens, c.in_channels});

  std::vector<double> times;
  for (int64_t s = 0; s < o.steps; ++s) {
    alloc.reset_peak();
    const auto t0 = Clock::now();
    const at::Tensor pred = model->forward(in);
    const at::Tensor loss = torch::mse_loss(pred.to(torch::kFloat), target);
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    r.step_peak = std::max(r.step_peak, alloc.peak_allocated() - before);
    std::printf("  %s step %lld: loss %.5f, %.2f s, peak %.1f MiB\n", fp8 ? "fp8 " : "bf16", static_cast<long long>(s),
                loss.item<double>(), times.back(), mib(alloc.peak_allocated() - before));
  }
  std::vector<double> later(times.begin() + (times.size() > 1 ? 1 : 0), times.end());
  std::sort(later.begin(), later.end());
  r.seconds = later[later.size() / 2];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const int64_t v = std::stoll(argv[i + 1]);
    if (k == "--hidden") o.hidden = v;
    else if (k == "--double") o.double_blocks = v;
    else if (k == "--single") o.single_blocks = v;
    else if (k == "--px") o.px = v;
    else if (k == "--txt") o.txt = v;
    else if (k == "--rank") o.rank = v;
    else if (k == "--steps") o.steps = v;
    else {
      std::fprintf(stderr, "lt-bench-flux-quant: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  if (o.hidden % 128 != 0 || o.px % 16 != 0 || o.steps < 1) {
    std::fprintf(stderr, "lt-bench-flux-quant: --hidden must be a multiple of 128, --px of 16, --steps >= 1\n");
    return 2;
  }
  torch::set_num_threads(static_cast<int>(std::max<int64_t>(1, at::get_num_threads())));
  lt::memory::CpuBudgetAllocator alloc(0);
  lt::memory::ScopedCpuAllocator scope(&alloc);
  std::printf("Flux transformer %lld wide (%lld heads x 128), %lld double + %lld single blocks; %lldx%lld px (%lld image "
              "tokens) + %lld text tokens; LoRA rank %lld; gradient checkpointing; AdamW; bf16 compute; %d threads\n",
              static_cast<long long>(o.hidden), static_cast<long long>(o.hidden / 128),
              static_cast<long long>(o.double_blocks), static_cast<long long>(o.single_blocks),
              static_cast<long long>(o.px), static_cast<long long>(o.px), static_cast<long long>((o.px / 16) * (o.px / 16)),
              static_cast<long long>(o.txt), static_cast<long long>(o.rank), at::get_num_threads());
  const Result bf16 = run(o, false, alloc);
  const Result fp8 = run(o, true, alloc);
  std::printf("\n| base | weights after load | training-step peak | s/step (median) |\n|---|---|---|---|\n");
  std::printf("| bf16 | %.1f MiB | %.1f MiB | %.2f |\n", mib(bf16.weights), mib(bf16.step_peak), bf16.seconds);
  std::printf("| fp8 e4m3 codes (qfloat8) | %.1f MiB | %.1f MiB | %.2f |\n", mib(fp8.weights), mib(fp8.step_peak), fp8.seconds);
  std::printf("8-bit base: weights x%.2f, step peak x%.2f of bf16\n",
              static_cast<double>(fp8.weights) / static_cast<double>(bf16.weights),
              static_cast<double>(fp8.step_peak) / static_cast<double>(bf16.step_peak));
  return 0;
}
