#include "loratrain/models/sd/sdxl.h"

#include <torch/torch.h>

#include "loratrain/models/sd/load.h"
#include "loratrain/models/state_dict.h"
#include "loratrain/models/text/clip_checkpoint.h"
#include "loratrain/util/error.h"

namespace lt::models::sd {

namespace fs = std::filesystem;

namespace {

constexpr const char* kUNetRoot = "model.diffusion_model.";
constexpr const char* kVAERoot = "first_stage_model.";

// Eval mode and frozen: base weights never train (adapters live outside them).
template <typename Module>
Module finish(Module module) {
  module->eval();
  for (auto& p : module->parameters()) p.set_requires_grad(false);
  return module;
}

LoadOptions with_dtype(LoadOptions options, std::optional<at::ScalarType> dtype) {
  options.dtype = dtype;
  return options;
}

// A VAE from one .safetensors (LDM or diffusers names) whose config is not stored: SDXL's scale.
AutoencoderKL vae_from_file(const io::SafetensorsFile& file, at::ScalarType dtype) {
  const std::string prefix = file.contains(std::string(kVAERoot) + "encoder.conv_in.weight") ? kVAERoot : "";
  VAEConfig config = VAEConfig::detect_from_weights(file, prefix);
  config.scaling_factor = VAEConfig::sdxl().scaling_factor;
  config.sample_size = VAEConfig::sdxl().sample_size;
  AutoencoderKL vae(config);
  load_vae(*vae, file, with_dtype({}, dtype));
  return vae;
}

}  // namespace

SDXLCheckpoint SDXLCheckpoint::open(const fs::path& path, bool separate_vae) {
  if (!fs::exists(path)) throw InputError(path.string() + ": model not found (model.name_or_path)");
  SDXLCheckpoint c;
  c.path_ = path;
  if (fs::is_directory(path)) {
    c.detection_ = detect_diffusers_folder(path);
  } else {
    c.file_ = io::SafetensorsFile::open(path);
    c.detection_ = detect_checkpoint(*c.file_);
  }
  const Detection& d = c.detection_;
  if (d.is_lora()) {
    throw InputError(path.string() + ": this is a LoRA file, not a base model (model.name_or_path must be the base checkpoint)");
  }
  if (d.family != ModelFamily::kSDXL) {
    throw InputError(path.string() + ": not an SDXL checkpoint: " +
                     (d.family == ModelFamily::kUnknown ? std::string("no known model layout")
                                                        : std::string("an ") + playbook::to_string(d.family) + " checkpoint") +
                     " (" + d.evidence + ")");
  }
  if (c.file_ && d.format != KeyFormat::kLDM) {
    throw InputError(path.string() + ": holds only one component (" + d.evidence +
                     "); give a full single-file checkpoint or a diffusers folder");
  }
  std::vector<std::string> optional;
  if (separate_vae) optional.push_back("vae");
  require_complete(d, path.string(), optional);
  return c;
}

UNet2DConditionModel SDXLCheckpoint::load_unet(std::optional<at::ScalarType> dtype) const {
  UNet2DConditionModel unet{nullptr};
  if (file_) {
    unet = UNet2DConditionModel(UNetConfig::detect_from_weights(*file_, kUNetRoot));
    sd::load_unet(*unet, *file_, with_dtype({}, dtype));
  } else {
    unet = UNet2DConditionModel(UNetConfig::from_json(read_component_config(path_ / "unet")));
    sd::load_unet(*unet, *io::SafetensorsFile::open(diffusers_component_weights(path_ / "unet")), with_dtype({}, dtype));
  }
  if (!unet->config.addition_embed_type) {
    throw InputError(path_.string() + ": the UNet has no added size/text embedding (addition_embed_type text_time): "
                     "not SDXL's UNet");
  }
  return finish(unet);
}

CLIPTextModel SDXLCheckpoint::load_text_encoder(std::optional<at::ScalarType> dtype) const {
  if (file_) return finish(load_clip_text_model(*file_, kSDXLTextEncoderRoot, dtype));
  CLIPTextModel model(CLIPTextConfig::from_file(path_ / "text_encoder" / "config.json"));
  load_state_dict(*model, *io::SafetensorsFile::open(diffusers_component_weights(path_ / "text_encoder")),
                  with_dtype(clip_text_load_options(), dtype));
  return finish(model);
}

CLIPTextModelWithProjection SDXLCheckpoint::load_text_encoder_2(std::optional<at::ScalarType> dtype) const {
  if (file_) return finish(load_open_clip_text_model_with_projection(*file_, kSDXLTextEncoder2Root, dtype));
  CLIPTextModelWithProjection model(CLIPTextConfig::from_file(path_ / "text_encoder_2" / "config.json"));
  load_state_dict(*model, *io::SafetensorsFile::open(diffusers_component_weights(path_ / "text_encoder_2")),
                  with_dtype(clip_text_load_options(), dtype));
  return finish(model);
}

AutoencoderKL SDXLCheckpoint::load_vae(const std::optional<fs::path>& vae_path, at::ScalarType dtype) const {
  AutoencoderKL vae{nullptr};
  std::optional<fs::path> folder;
  if (vae_path) {
    if (!fs::exists(*vae_path)) throw InputError(vae_path->string() + ": VAE not found (model.vae_path)");
    if (fs::is_directory(*vae_path)) {
      folder = *vae_path;
    } else {
      vae = vae_from_file(*io::SafetensorsFile::open(*vae_path), dtype);
    }
  } else if (file_) {
    vae = vae_from_file(*file_, dtype);
  } else {
    folder = path_ / "vae";
  }
  if (folder) {
    vae = AutoencoderKL(VAEConfig::from_json(read_component_config(*folder)));
    sd::load_vae(*vae, *io::SafetensorsFile::open(diffusers_component_weights(*folder)), with_dtype({}, dtype));
  }
  vae->to(dtype);
  return finish(vae);
}

CLIPTokenizer SDXLCheckpoint::load_tokenizer(const std::optional<fs::path>& tokenizer_path) const {
  if (tokenizer_path) return load_clip_tokenizer(*tokenizer_path);
  if (!file_) return load_clip_tokenizer(path_ / "tokenizer");
  const fs::path beside = path_.parent_path() / "tokenizer";
  if (fs::exists(beside)) return load_clip_tokenizer(beside);
  throw InputError(path_.string() + ": a single-file checkpoint carries no tokenizer vocabulary: set "
                   "model.tokenizer_path to a diffusers tokenizer/ folder (vocab.json + merges.txt) or to OpenAI's "
                   "bpe_simple_vocab_16e6.txt.gz (SDXL's second tokenizer uses the same vocabulary)");
}

CLIPTokenizer SDXLCheckpoint::load_tokenizer_2(const std::optional<fs::path>& tokenizer_path) const {
  if (!tokenizer_path && !file_) return load_clip_tokenizer(path_ / "tokenizer_2");
  // The folder the first tokenizer comes from, and a tokenizer_2/ next to it or inside it.
  const fs::path first = tokenizer_path ? *tokenizer_path : path_.parent_path() / "tokenizer";
  for (const fs::path& candidate : {first / "tokenizer_2", first.parent_path() / "tokenizer_2"}) {
    if (fs::is_directory(candidate) && fs::exists(candidate / "vocab.json")) return load_clip_tokenizer(candidate);
  }
  return load_tokenizer(tokenizer_path).with_pad_token(kSDXLTokenizer2PadToken);
}

void check_sdxl_components(const UNetConfig& unet, const CLIPTextConfig& te1, const CLIPTextConfig& te2,
                           const std::string& source) {
  const int64_t context = te1.hidden_size + te2.hidden_size;
  for (int64_t width : unet.cross_attention_dim) {
    if (width != context) {
      throw InputError(source + ": the UNet's cross-attention width " + std::to_string(width) +
                       " is not the text encoders' " + std::to_string(te1.hidden_size) + " + " +
                       std::to_string(te2.hidden_size) + " = " + std::to_string(context));
    }
  }
  if (!unet.addition_time_embed_dim || !unet.projection_class_embeddings_input_dim) {
    throw InputError(source + ": the UNet has no added size/text embedding: not SDXL's UNet");
  }
  const int64_t added = te2.projection_dim + 6 * *unet.addition_time_embed_dim;
  if (*unet.projection_class_embeddings_input_dim != added) {
    throw InputError(source + ": the UNet's added embedding takes " +
                     std::to_string(*unet.projection_class_embeddings_input_dim) + " inputs, but text_encoder_2's " +
                     "projection (" + std::to_string(te2.projection_dim) + ") + 6 size embeddings of " +
                     std::to_string(*unet.addition_time_embed_dim) + " give " + std::to_string(added));
  }
}

SDXLComponents load_sdxl_components(const fs::path& path, const SDXLLoadOptions& options) {
  const SDXLCheckpoint checkpoint = SDXLCheckpoint::open(path, options.vae_path.has_value());
  SDXLComponents c;
  c.text_encoder = checkpoint.load_text_encoder(options.dtype);
  c.text_encoder_2 = checkpoint.load_text_encoder_2(options.dtype);
  c.unet = checkpoint.load_unet(options.dtype);
  check_sdxl_components(c.unet->config, c.text_encoder->config, c.text_encoder_2->config, path.string());
  c.vae = checkpoint.load_vae(options.vae_path, options.vae_dtype);
  c.tokenizer = checkpoint.load_tokenizer(options.tokenizer_path);
  c.tokenizer_2 = checkpoint.load_tokenizer_2(options.tokenizer_path);
  return c;
}

SDXLTextEmbeddings encode_sdxl_text(CLIPTextModelImpl& te1, CLIPTextModelWithProjectionImpl& te2,
                                    const at::Tensor& input_ids, const at::Tensor& input_ids_2) {
  const auto device1 = te1.text_model->embeddings->token_embedding->weight.device();
  const auto device2 = te2.text_model->embeddings->token_embedding->weight.device();
  const CLIPTextOutput o1 = te1.forward(input_ids.to(device1), /*output_hidden_states=*/true);
  const CLIPTextOutput o2 = te2.forward(input_ids_2.to(device2), /*output_hidden_states=*/true);
  const at::Tensor h1 = o1.hidden_states.at(o1.hidden_states.size() - 2);
  const at::Tensor h2 = o2.hidden_states.at(o2.hidden_states.size() - 2);
  SDXLTextEmbeddings e;
  e.context = torch::cat({h1, h2.to(h1.device(), h1.scalar_type())}, -1);  // [B, L, hidden_1 + hidden_2]
  e.pooled = o2.text_embeds;                                                  // [B, projection_dim]
  return e;
}

at::Tensor clip_input_ids(const CLIPTokenizer& tokenizer, const std::vector<std::string>& captions) {
  std::vector<int64_t> ids;
  const auto encodings = tokenizer.encode_batch(captions);
  for (const auto& e : encodings) ids.insert(ids.end(), e.input_ids.begin(), e.input_ids.end());
  const auto length = encodings.empty() ? tokenizer.model_max_length() : static_cast<int64_t>(encodings[0].input_ids.size());
  return torch::tensor(ids, torch::kLong).view({static_cast<int64_t>(captions.size()), length});
}

at::Tensor sdxl_add_time_ids(const std::vector<SDXLSizeConditioning>& samples) {
  std::vector<float> values;
  values.reserve(samples.size() * 6);
  for (const auto& s : samples) {
    for (int64_t v : {s.original_height, s.original_width, s.crop_top, s.crop_left, s.target_height, s.target_width}) {
      values.push_back(static_cast<float>(v));
    }
  }
  return torch::tensor(values, torch::kFloat).view({static_cast<int64_t>(samples.size()), 6});
}

}  // namespace lt::models::sd
