// Parity runner for Flux.1's FluxTransformer2DModel: the case's diffusers weights as they are, and
// the same weights written in BFL names (fused qkv and linear1, BFL's final adaLN order) and loaded
// through the BFL conversion, so the single-file loader is held to the reference too.
#include <torch/torch.h>

#include <unistd.h>

#include "loratrain/models/flux/checkpoint.h"
#include "loratrain/models/state_dict.h"
#include "models/parity_runners.h"

namespace lt::test::parity {
namespace {

using namespace lt::models::flux;

Outputs run_flux(FluxTransformer2DModelImpl& model, const Case& c) {
  FluxInputs in;
  in.hidden_states = c.input("in.hidden_states");
  in.encoder_hidden_states = c.input("in.encoder_hidden_states");
  in.pooled_projections = c.input("in.pooled_projections");
  in.timestep = c.input("in.timestep");
  in.img_ids = c.input("in.img_ids");
  in.txt_ids = c.input("in.txt_ids");
  if (c.has_input("in.guidance")) in.guidance = c.input("in.guidance");
  const at::Tensor out = model.forward(in);
  Outputs o{{"out.sample", out}};
  if (c.has_input("in.pixel_hw")) {
    const at::Tensor hw = c.input("in.pixel_hw");
    const int64_t h = 2 * (hw[0].item<int64_t>() / 16), w = 2 * (hw[1].item<int64_t>() / 16);
    o["out.sample_unpacked"] = unpack_latents(out, out.size(2) / 4, h, w);
  }
  return o;
}

const RunnerRegistrar flux_runner("FluxTransformer2DModel", [](const Case& c) {
  const FluxConfig config = FluxConfig::from_json(c.config);
  std::vector<Pass> passes;
  FluxTransformer2DModel model(config);
  model->eval();
  models::load_state_dict(*model, *c.open("weights.safetensors"));
  passes.push_back({"weights.safetensors", run_flux(*model, c)});

  const auto bfl_path = std::filesystem::temp_directory_path() / ("lt_parity_flux_bfl_" + std::to_string(::getpid()) + ".safetensors");
  io::save_safetensors(bfl_path, bfl_tensors(*model, lt::models::flux::kComfyTransformerRoot), {{"format", "pt"}});
  const auto bfl_file = io::SafetensorsFile::open(bfl_path);
  // The config read back from the BFL shapes (block counts, widths, rope axes, guidance).
  FluxTransformer2DModel from_bfl(detect_bfl_config(*bfl_file, lt::models::flux::kComfyTransformerRoot));
  from_bfl->eval();
  load_bfl_transformer(*from_bfl, *bfl_file, lt::models::flux::kComfyTransformerRoot);
  std::filesystem::remove(bfl_path);
  passes.push_back({"BFL names under model.diffusion_model.", run_flux(*from_bfl, c)});
  return passes;
});

}  // namespace
}  // namespace lt::test::parity
