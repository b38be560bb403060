// Parity runners for the sampling schedulers (DDPM, DDIM, Euler, flow-match Euler, flow UniPC): each case's
// config.json built through make_scheduler_from_config, driven as the case's meta.json `call`
// states, its tables and one step compared with diffusers'.
#include <torch/torch.h>

#include "loratrain/sample/scheduler.h"
#include "models/parity_runners.h"

namespace lt::test::parity {
namespace {

using namespace lt::sample;

int64_t step_index(const Case& c) { return c.input("in.step_index").item<int64_t>(); }

const RunnerRegistrar ddpm_runner("DDPMScheduler", [](const Case& c) {
  auto s = make_scheduler_from_config(c.config);
  auto& ddpm = dynamic_cast<DDPMScheduler&>(*s);
  Outputs o;
  o["out.noisy_samples"] = ddpm.add_noise(c.input("in.original_samples"), c.input("in.noise"), c.input("in.timesteps"));
  o["out.betas"] = ddpm.betas();
  o["out.alphas_cumprod"] = ddpm.alphas_cumprod();
  return std::vector<Pass>{{"add_noise", o}};
});

const RunnerRegistrar ddim_runner("DDIMScheduler", [](const Case& c) {
  auto s = make_scheduler_from_config(c.config);
  auto& ddim = dynamic_cast<DDIMScheduler&>(*s);
  ddim.set_eta(0.0);
  ddim.set_timesteps(20);
  const auto out = ddim.step(c.input("in.model_output"), step_index(c), c.input("in.sample"));
  Outputs o{{"out.timesteps", ddim.timesteps()},
            {"out.alphas_cumprod", ddim.alphas_cumprod()},
            {"out.step.prev_sample", out.prev_sample},
            {"out.step.pred_original_sample", out.pred_original_sample}};
  return std::vector<Pass>{{"20 steps", o}};
});

const RunnerRegistrar euler_runner("EulerDiscreteScheduler", [](const Case& c) {
  auto s = make_scheduler_from_config(c.config);
  s->set_timesteps(20);
  const int64_t i = step_index(c);
  const auto out = s->step(c.input("in.model_output"), i, c.input("in.sample"));
  Outputs o{{"out.timesteps", s->timesteps()},
            {"out.sigmas", s->sigmas()},
            {"out.init_noise_sigma", torch::tensor(s->init_noise_sigma(), torch::kFloat)},
            {"out.scaled_model_input", s->scale_model_input(c.input("in.sample"), i)},
            {"out.step.prev_sample", out.prev_sample},
            {"out.step.pred_original_sample", out.pred_original_sample}};
  return std::vector<Pass>{{"20 steps", o}};
});

const RunnerRegistrar flow_runner("FlowMatchEulerDiscreteScheduler", [](const Case& c) {
  auto s = make_scheduler_from_config(c.config);
  auto& flow = dynamic_cast<FlowMatchEulerDiscreteScheduler&>(*s);
  Outputs o;
  if (c.has_input("in.image_seq_len")) {
    // Flux's pipeline: unshifted sigmas linspace(1, 1/N, N), shifted by mu of the image's tokens.
    const at::Tensor lengths = c.input("in.image_seq_len");
    std::vector<double> mus;
    TimestepOptions options;
    for (int64_t k = 0; k < 20; ++k) options.sigmas.push_back(1.0 + (1.0 / 20 - 1.0) * static_cast<double>(k) / 19.0);
    for (int64_t k = 0; k < lengths.size(0); ++k) {
      options.mu = calculate_shift(lengths[k].item<int64_t>(), 256, 4096, 0.5, 1.15);
      mus.push_back(*options.mu);
      flow.set_timesteps(20, options);
      o["out.seq" + std::to_string(k) + ".timesteps"] = flow.timesteps();
      o["out.seq" + std::to_string(k) + ".sigmas"] = flow.sigmas();
    }
    o["out.mu"] = torch::tensor(mus, torch::kDouble).to(torch::kFloat);
    o["out.step.prev_sample"] = flow.step(c.input("in.model_output"), 0, c.input("in.sample")).prev_sample;
  } else {
    flow.set_timesteps(20);
    o["out.timesteps"] = flow.timesteps();
    o["out.sigmas"] = flow.sigmas();
    o["out.step.prev_sample"] = flow.step(c.input("in.model_output"), step_index(c), c.input("in.sample")).prev_sample;
  }
  return std::vector<Pass>{{"20 steps", o}};
});

// A whole loop (the multistep history, the corrector, the lower-order last step) from the case's
// fixed model outputs, through the sampler's scheduler interface.
const RunnerRegistrar unipc_runner("UniPCMultistepScheduler", [](const Case& c) {
  auto s = make_scheduler_from_config(c.config);
  const at::Tensor model_outputs = c.input("in.model_outputs");
  const int64_t steps = model_outputs.size(0);
  s->set_timesteps(steps);
  at::Tensor x = c.input("in.sample");
  std::vector<at::Tensor> samples;
  for (int64_t i = 0; i < steps; ++i) {
    x = s->step(model_outputs[i], i, x).prev_sample;
    samples.push_back(x);
  }
  Outputs o{{"out.timesteps", s->timesteps()}, {"out.sigmas", s->sigmas()}, {"out.samples", torch::stack(samples)}};
  return std::vector<Pass>{{std::to_string(steps) + " steps", o}};
});

}  // namespace
}  // namespace lt::test::parity
