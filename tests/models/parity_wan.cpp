// Parity runners for Wan 2.1: WanTransformer3DModel and AutoencoderKLWan with the cases' diffusers
// weights, and again with the same weights written in the official/ComfyUI names and loaded through
// the native-name loaders, so the single-file layouts are held to the reference too.
#include <torch/torch.h>

#include <unistd.h>

#include "loratrain/models/state_dict.h"
#include "loratrain/models/wan/checkpoint.h"
#include "loratrain/models/wan/transformer.h"
#include "loratrain/models/wan/vae.h"
#include "models/parity_runners.h"

namespace lt::test::parity {
namespace {

using namespace lt::models::wan;

std::filesystem::path temp_file(const std::string& what) {
  return std::filesystem::temp_directory_path() / ("lt_parity_wan_" + what + "_" + std::to_string(::getpid()) + ".safetensors");
}

const RunnerRegistrar wan_transformer_runner("WanTransformer3DModel", [](const Case& c) {
  const WanTransformerConfig config = WanTransformerConfig::from_json(c.config);
  std::vector<Pass> passes;
  WanTransformer3DModel model(config);
  model->eval();
  models::load_state_dict(*model, *c.open("weights.safetensors"));
  const at::Tensor out = model->forward(c.input("in.hidden_states"), c.input("in.timestep"), c.input("in.encoder_hidden_states"));
  passes.push_back({"weights.safetensors", {{"out.sample", out}}});

  const auto native_path = temp_file("transformer");
  io::save_safetensors(native_path, native_transformer_tensors(*model, lt::models::wan::kComfyTransformerRoot), {{"format", "pt"}});
  const auto native_file = io::SafetensorsFile::open(native_path);
  const TransformerLayout layout = detect_transformer_layout(*native_file);
  WanTransformer3DModel from_native(config);  // the tiny head width is not 128: sizes from config.json
  from_native->eval();
  load_transformer(*from_native, *native_file, layout);
  std::filesystem::remove(native_path);
  const at::Tensor native_out =
      from_native->forward(c.input("in.hidden_states"), c.input("in.timestep"), c.input("in.encoder_hidden_states"));
  passes.push_back({"native names under model.diffusion_model.", {{"out.sample", native_out}}});
  return passes;
});

const RunnerRegistrar wan_vae_runner("AutoencoderKLWan", [](const Case& c) {
  AutoencoderKLWan vae(WanVaeConfig::from_json(c.config));
  vae->eval();
  models::load_state_dict(*vae, *c.open("weights.safetensors"));
  auto [mean, logvar] = vae->encode(c.input("in.video"));
  const at::Tensor decoded = vae->decode(c.input("in.latent"));
  std::vector<Pass> passes{
      {"weights.safetensors", {{"out.latent_dist.mean", mean}, {"out.latent_dist.logvar", logvar}, {"out.decoded", decoded}}}};

  const auto native_path = temp_file("vae");
  io::save_safetensors(native_path, native_vae_tensors(*vae), {{"format", "pt"}});
  AutoencoderKLWan from_native(vae->config);
  from_native->eval();
  load_vae(*from_native, *io::SafetensorsFile::open(native_path));
  std::filesystem::remove(native_path);
  auto [native_mean, native_logvar] = from_native->encode(c.input("in.video"));
  passes.push_back({"native names", {{"out.latent_dist.mean", native_mean},
                                     {"out.latent_dist.logvar", native_logvar},
                                     {"out.decoded", from_native->decode(c.input("in.latent"))}}});
  return passes;
});

}  // namespace
}  // namespace lt::test::parity
