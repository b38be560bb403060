// LoRA network: kohya targets and names on the SD1.5 UNet topology and CLIP, filters, the trainable
// set, kohya/PEFT files, merge equivalence, and the inspect summary.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <set>

#include "loratrain/io/safetensors.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/layers.h"
#include "loratrain/models/sd/unet.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/util/error.h"
#include "lora/network_helpers.h"
#include "test_paths.h"

using lt::models::Conv2d;
using lt::models::Linear;
using namespace lt::lora;
using lt::test::scratch_dir;

// Containers named like the diffusers classes kohya selects by (module_class_name() matches the
// last name component without "Impl"), holding the real leaf modules LoRA attaches to.
namespace mock {
#define LT_MOCK_MODULE(Name)                    \
  struct Name##Impl : torch::nn::Module {};     \
  TORCH_MODULE(Name)
LT_MOCK_MODULE(Block);
LT_MOCK_MODULE(Transformer2DModel);
LT_MOCK_MODULE(BasicTransformerBlock);
LT_MOCK_MODULE(Attention);
LT_MOCK_MODULE(FeedForward);
LT_MOCK_MODULE(GEGLU);
LT_MOCK_MODULE(ResnetBlock2D);
LT_MOCK_MODULE(Downsample2D);
LT_MOCK_MODULE(Upsample2D);
#undef LT_MOCK_MODULE
}  // namespace mock

using lt::test::names_of;
using lt::test::randomize_up;

namespace {

torch::nn::ModuleList list_of(std::vector<std::shared_ptr<torch::nn::Module>> items) {
  torch::nn::ModuleList list;
  for (auto& m : items) list->push_back(m);
  return list;
}

mock::Attention attention(int64_t c) {
  mock::Attention a;
  a->register_module("to_q", Linear(c, c, false));
  a->register_module("to_k", Linear(c, c, false));
  a->register_module("to_v", Linear(c, c, false));
  a->register_module("to_out", list_of({Linear(c, c).ptr(), torch::nn::Dropout(0.0).ptr()}));
  return a;
}

// diffusers Transformer2DModel (SD1.x: 1x1 conv proj_in/proj_out, one BasicTransformerBlock).
mock::Transformer2DModel transformer(int64_t c) {
  mock::BasicTransformerBlock b;
  b->register_module("attn1", attention(c));
  b->register_module("attn2", attention(c));
  mock::GEGLU geglu;
  geglu->register_module("proj", Linear(c, 8 * c));
  mock::FeedForward ff;
  ff->register_module("net", list_of({geglu.ptr(), torch::nn::Dropout(0.0).ptr(), Linear(4 * c, c).ptr()}));
  b->register_module("ff", ff);
  mock::Transformer2DModel t;
  t->register_module("proj_in", Conv2d(c, c, 1));
  t->register_module("transformer_blocks", list_of({b.ptr()}));
  t->register_module("proj_out", Conv2d(c, c, 1));
  return t;
}

mock::ResnetBlock2D resnet(int64_t in, int64_t out, int64_t temb) {
  mock::ResnetBlock2D r;
  r->register_module("conv1", Conv2d(in, out, 3, 1, 1));
  r->register_module("time_emb_proj", Linear(temb, out));
  r->register_module("conv2", Conv2d(out, out, 3, 1, 1));
  if (in != out) r->register_module("conv_shortcut", Conv2d(in, out, 1));
  return r;
}

// The real SD1.5 UNet (diffusers' default UNet2DConditionModel config) with tiny widths: the
// module tree, hence every name, equals the full-size model's (test_lora_slow checks that one).
lt::models::sd::UNetConfig tiny_sd15_config() {
  auto c = lt::models::sd::UNetConfig::sd15();
  c.block_out_channels = {8, 16, 32, 32};
  c.norm_num_groups = 4;
  c.cross_attention_dim = std::vector<int64_t>(4, 16);
  c.attention_head_dim = std::vector<int64_t>(4, 2);
  return c;
}

lt::models::sd::UNet2DConditionModel sd15_unet_tree() { return lt::models::sd::UNet2DConditionModel(tiny_sd15_config()); }

// kohya's 192 UNet module names for SD1.5, written out from its rules (not from our walker).
std::set<std::string> kohya_sd15_unet_names() {
  std::vector<std::string> transformers;
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 2; ++j) transformers.push_back("down_blocks_" + std::to_string(i) + "_attentions_" + std::to_string(j));
  transformers.push_back("mid_block_attentions_0");
  for (int i = 1; i < 4; ++i)
    for (int j = 0; j < 3; ++j) transformers.push_back("up_blocks_" + std::to_string(i) + "_attentions_" + std::to_string(j));
  std::set<std::string> names;
  for (const auto& t : transformers) {
    names.insert("lora_unet_" + t + "_proj_in");
    names.insert("lora_unet_" + t + "_proj_out");
    for (const char* attn : {"attn1", "attn2"})
      for (const char* p : {"to_q", "to_k", "to_v", "to_out_0"})
        names.insert("lora_unet_" + t + "_transformer_blocks_0_" + attn + "_" + p);
    names.insert("lora_unet_" + t + "_transformer_blocks_0_ff_net_0_proj");
    names.insert("lora_unet_" + t + "_transformer_blocks_0_ff_net_2");
  }
  return names;
}

lt::models::CLIPTextConfig tiny_clip_config() {
  lt::models::CLIPTextConfig c;
  c.vocab_size = 100;
  c.hidden_size = 16;
  c.intermediate_size = 32;
  c.num_hidden_layers = 12;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 8;
  c.eos_token_id = 2;
  return c;
}

// A small model made of UNet-named parts with a forward pass through every leaf kind LoRA
// handles: 3x3 conv (resnet conv1), stride-2 3x3 conv (downsampler), 1x1 conv (proj_in/out),
// Linear (attention and feed-forward).
struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() {
    res = register_module("resnet", resnet(4, 8, 4));
    down = register_module("downsample", mock::Downsample2D());
    down->register_module("conv", Conv2d(8, 8, 3, 2, 1));
    xf = register_module("transformer", transformer(8));
  }
  // x: [N, 4, 8, 8] -> [N, 8, 4, 4]
  torch::Tensor forward(const torch::Tensor& x) {
    auto leaf = [](const std::shared_ptr<torch::nn::Module>& m, const std::string& path) {
      return m->named_modules("", false)[path];
    };
    auto lin = [&](const std::string& p, const torch::Tensor& t) {
      return std::dynamic_pointer_cast<lt::models::LinearImpl>(leaf(xf.ptr(), p))->forward(t);
    };
    auto conv = [&](const std::shared_ptr<torch::nn::Module>& m, const std::string& p, const torch::Tensor& t) {
      return std::dynamic_pointer_cast<lt::models::Conv2dImpl>(leaf(m, p))->forward(t);
    };
    torch::Tensor h = torch::silu(conv(res.ptr(), "conv1", x));
    h = conv(down.ptr(), "conv", h);
    h = conv(xf.ptr(), "proj_in", h);
    const auto n = h.size(0);
    torch::Tensor tokens = h.flatten(2).transpose(1, 2);  // [N, 16, 8]
    const std::string b = "transformer_blocks.0.";
    torch::Tensor a = lin(b + "attn1.to_q", tokens) * lin(b + "attn1.to_k", tokens) + lin(b + "attn1.to_v", tokens);
    tokens = tokens + lin(b + "attn1.to_out.0", a);
    tokens = tokens + lin(b + "ff.net.2", torch::gelu(lin(b + "ff.net.0.proj", tokens)).chunk(2, -1)[0]);
    h = tokens.transpose(1, 2).reshape({n, 8, 4, 4});
    return conv(xf.ptr(), "proj_out", h);
  }
  mock::ResnetBlock2D res{nullptr};
  mock::Downsample2D down{nullptr};
  mock::Transformer2DModel xf{nullptr};
};
TORCH_MODULE(TinyNet);

ComponentSpec tiny_spec() {
  ComponentSpec s = ComponentSpec::sd_unet();
  s.conv_target_classes.push_back("Block");
  return s;
}

TinyNet copy_of(const TinyNet& src) {
  TinyNet dst;
  torch::NoGradGuard no_grad;
  auto a = src->named_parameters();
  for (auto& p : dst->named_parameters()) p.value().copy_(a[p.key()]);
  return dst;
}

}  // namespace

CATCH_TEST_CASE("module_class_name drops namespaces and Impl", "[lora]") {
  mock::Transformer2DModel t;
  CATCH_CHECK(module_class_name(*t) == "Transformer2DModel");
  Linear l(2, 2);
  CATCH_CHECK(module_class_name(*l) == "Linear");
}

CATCH_TEST_CASE("SD1.5 UNet: kohya's 192 attention targets with kohya names", "[lora][naming]") {
  auto unet = sd15_unet_tree();
  LoRANetwork net(NetworkConfig{});
  CATCH_CHECK(net->add_component(ComponentSpec::sd_unet(), *unet) == 192);
  CATCH_CHECK(names_of(net) == kohya_sd15_unet_names());
  CATCH_CHECK(net->count(true) == 192);
  // proj_in is a 1x1 conv: a conv adapter with a 1x1 down kernel.
  for (const auto& m : net->modules()) {
    if (m->lora_name == "lora_unet_mid_block_attentions_0_proj_in") {
      CATCH_CHECK(m->is_conv());
      CATCH_CHECK(m->lora_down.sizes() == torch::IntArrayRef({4, 32, 1, 1}));
      CATCH_CHECK(m->peft_name == "unet.mid_block.attentions.0.proj_in");
    }
  }
}

CATCH_TEST_CASE("SD1.5 UNet with conv rank: LoCon adds kohya's resnet and sampler targets", "[lora][naming]") {
  auto unet = sd15_unet_tree();
  NetworkConfig cfg;
  cfg.linear = 8;
  cfg.conv = 4;
  LoRANetwork net(cfg);
  // kohya logs "create LoRA for U-Net: 278 modules" for SD1.5 with conv_dim: 192 + 22 resnets x
  // (conv1, conv2, time_emb_proj) + 14 conv_shortcuts + 3 downsamplers + 3 upsamplers.
  CATCH_CHECK(net->add_component(ComponentSpec::sd_unet(), *unet) == 278);
  std::map<std::string, const LoRAModuleImpl*> by_name;
  for (const auto& m : net->modules()) by_name[m->lora_name] = m.get();
  const auto* conv1 = by_name.at("lora_unet_down_blocks_0_resnets_0_conv1");
  CATCH_CHECK(conv1->lora_down.sizes() == torch::IntArrayRef({4, 8, 3, 3}));  // conv rank, 8 channels
  CATCH_CHECK(conv1->lora_up.sizes() == torch::IntArrayRef({8, 4, 1, 1}));
  CATCH_CHECK(by_name.at("lora_unet_up_blocks_0_resnets_2_time_emb_proj")->rank == 8);  // Linear: linear rank
  CATCH_CHECK(by_name.at("lora_unet_up_blocks_0_resnets_2_conv_shortcut")->rank == 8);  // 1x1: linear rank
  CATCH_CHECK(by_name.count("lora_unet_down_blocks_2_downsamplers_0_conv") == 1);
  CATCH_CHECK(by_name.count("lora_unet_up_blocks_2_upsamplers_0_conv") == 1);
  CATCH_CHECK(by_name.count("lora_unet_conv_in") == 0);  // outside every target class
  CATCH_CHECK(by_name.at("lora_unet_down_blocks_0_resnets_0_conv1")->alpha == 4.0);  // conv_alpha defaults to conv
}

CATCH_TEST_CASE("CLIP text encoder: 72 targets named lora_te_text_model_...", "[lora][naming]") {
  lt::models::CLIPTextModel te(tiny_clip_config());
  NetworkConfig cfg;
  cfg.train_text_encoder = true;
  LoRANetwork net(cfg);
  CATCH_CHECK(net->add_component(ComponentSpec::text_encoder(0), *te) == 72);
  auto names = names_of(net);
  CATCH_CHECK(names.count("lora_te_text_model_encoder_layers_0_self_attn_q_proj") == 1);
  CATCH_CHECK(names.count("lora_te_text_model_encoder_layers_11_mlp_fc2") == 1);
  CATCH_CHECK(names.count("lora_te_text_model_encoder_layers_5_self_attn_out_proj") == 1);
  CATCH_CHECK(net->count(false) == 72);
  for (const auto& m : net->modules()) {
    if (m->lora_name == "lora_te_text_model_encoder_layers_0_self_attn_q_proj")
      CATCH_CHECK(m->peft_name == "text_encoder.text_model.encoder.layers.0.self_attn.q_proj");
  }
  // SDXL's second encoder: lora_te2_ / text_encoder_2.
  lt::models::CLIPTextModel te2(tiny_clip_config());
  LoRANetwork xl(cfg);
  xl->add_component(ComponentSpec::text_encoder(2), *te2);
  CATCH_CHECK(names_of(xl).count("lora_te2_text_model_encoder_layers_3_mlp_fc1") == 1);
  // train_text_encoder false (AI Toolkit's default): no adapters, encoder frozen all the same.
  lt::models::CLIPTextModel te3(tiny_clip_config());
  LoRANetwork off(NetworkConfig{});
  CATCH_CHECK(off->add_component(ComponentSpec::text_encoder(0), *te3) == 0);
  for (const auto& p : te3->parameters()) CATCH_CHECK_FALSE(p.requires_grad());
}

CATCH_TEST_CASE("only_if_contains / ignore_if_contains, ignore wins", "[lora][filters]") {
  auto unet = sd15_unet_tree();
  NetworkConfig cfg;
  cfg.only_if_contains = {"attn2"};
  LoRANetwork only(cfg);
  CATCH_CHECK(only->add_component(ComponentSpec::sd_unet(), *unet) == 64);  // 16 blocks x 4 projections
  cfg.ignore_if_contains = {"to_k", "attn2.to_v"};  // by kohya name or by dotted path
  LoRANetwork both(cfg);
  CATCH_CHECK(both->add_component(ComponentSpec::sd_unet(), *unet) == 32);
  for (const auto& n : names_of(both)) {
    CATCH_CHECK(n.find("attn2") != std::string::npos);
    CATCH_CHECK(n.find("to_k") == std::string::npos);
    CATCH_CHECK(n.find("to_v") == std::string::npos);
  }
  NetworkConfig up_only;
  up_only.only_if_contains = {"lora_unet_up_blocks_3"};
  LoRANetwork up(up_only);
  CATCH_CHECK(up->add_component(ComponentSpec::sd_unet(), *unet) == 36);
}

CATCH_TEST_CASE("the trainable set is exactly the adapter parameters", "[lora][train]") {
  TinyNet model;
  NetworkConfig cfg;
  cfg.linear = 4;
  cfg.conv = 2;
  LoRANetwork net(cfg);
  const size_t n = net->add_component(tiny_spec(), *model);
  // resnet conv1/conv2/time_emb_proj/conv_shortcut, downsampler conv, proj_in/out, attn1 and attn2
  // projections (8), ff.net.0.proj and ff.net.2.
  CATCH_REQUIRE(n == 17);
  net->apply_to();
  CATCH_CHECK(net->trainable_parameters().size() == 2 * n);
  for (const auto& p : model->parameters()) CATCH_CHECK_FALSE(p.requires_grad());
  std::map<std::string, torch::Tensor> base_before;
  for (const auto& p : model->named_parameters()) base_before[p.key()] = p.value().clone();
  std::vector<torch::Tensor> lora_before;
  for (const auto& p : net->parameters()) lora_before.push_back(p.clone());

  torch::manual_seed(1);
  torch::Tensor x = torch::randn({2, 4, 8, 8});
  torch::Tensor target = torch::randn({2, 8, 4, 4});
  lt::optim::AdamW opt(net->trainable_parameters());
  for (int step = 0; step < 3; ++step) {
    opt.zero_grad();
    torch::mse_loss(model->forward(x), target).backward();
    opt.step(1e-2);
  }
  for (const auto& p : model->named_parameters()) {
    CATCH_CHECK_FALSE(p.value().grad().defined());
    CATCH_CHECK(torch::equal(p.value(), base_before[p.key()]));
  }
  // Every adapter on the forward path (10 of the 17: TinyNet skips attn2 and part of the resnet)
  // trained, down and up (up from zero after the first step); the others got no gradient.
  size_t changed = 0;
  auto after = net->parameters();
  for (size_t i = 0; i < after.size(); ++i) {
    const bool moved = !torch::equal(after[i], lora_before[i]);
    CATCH_CHECK(moved == after[i].grad().defined());
    changed += moved ? 1 : 0;
  }
  CATCH_CHECK(changed == 20);
}

CATCH_TEST_CASE("initialisation: zero up, kaiming-uniform down, fp32", "[lora]") {
  TinyNet model;
  // In eval mode the convolutions, frozen by apply_to, keep LibTorch's own kernel as the base forward
  // did (in training mode they would run on packed copies, equal to 1e-6 but not bit for bit).
  model->eval();
  torch::manual_seed(2);
  torch::Tensor x = torch::randn({1, 4, 8, 8});
  const torch::Tensor base = model->forward(x);
  NetworkConfig cfg;
  cfg.conv = 4;
  LoRANetwork net(cfg);
  net->add_component(tiny_spec(), *model);
  net->apply_to();
  CATCH_CHECK(torch::equal(model->forward(x), base));  // up = 0: exactly the base model
  for (const auto& m : net->modules()) {
    CATCH_CHECK(m->lora_up.abs().max().item<float>() == 0.0f);
    const double fan_in = static_cast<double>(m->lora_down[0].numel());
    CATCH_CHECK(m->lora_down.abs().max().item<double>() <= 1.0 / std::sqrt(fan_in) + 1e-7);
    CATCH_CHECK(m->lora_down.abs().max().item<double>() > 0.5 / std::sqrt(fan_in));
    CATCH_CHECK(m->lora_down.scalar_type() == torch::kFloat);
  }
}

CATCH_TEST_CASE("adapter output equals the merged weight's, for linear, 1x1, 3x3 and strided convs", "[lora][merge]") {
  TinyNet model;
  NetworkConfig cfg;
  cfg.linear = 4;
  cfg.linear_alpha = 2.0;
  cfg.conv = 3;
  cfg.conv_alpha = 1.5;
  LoRANetwork net(cfg);
  net->add_component(tiny_spec(), *model);
  randomize_up(net, 3);
  net->apply_to();
  torch::manual_seed(4);
  torch::Tensor x = torch::randn({2, 4, 8, 8});
  const torch::Tensor base = [&] {
    net->remove();
    auto y = model->forward(x);
    net->apply_to();
    return y;
  }();
  const torch::Tensor adapted = model->forward(x).detach();
  CATCH_CHECK((adapted - base).abs().max().item<float>() > 1e-3f);  // the adapters do something
  net->set_multiplier(0.5);
  const torch::Tensor half = model->forward(x).detach();
  net->set_multiplier(1.0);

  TinyNet merged = copy_of(model);
  {
    torch::NoGradGuard no_grad;
    auto copies = net->merged_weights(1.0);
    CATCH_CHECK(copies.size() == net->modules().size());
    auto params = merged->named_parameters();
    for (auto& [peft, w] : copies) params[peft.substr(std::string("unet.").size()) + ".weight"].copy_(w);
  }
  CATCH_CHECK(torch::allclose(merged->forward(x), adapted, 1e-4, 1e-5));
  // merge_to changes the model itself and detaches the adapters.
  net->merge_to(0.5);
  CATCH_CHECK(torch::allclose(model->forward(x), half, 1e-4, 1e-5));
}

CATCH_TEST_CASE("kohya file: keys, dtype, alpha, ss_ metadata; merged into the base it reproduces the adapter model", "[lora][save][merge]") {
  TinyNet model;
  NetworkConfig cfg;
  cfg.linear = 4;
  cfg.linear_alpha = 1.0;
  cfg.conv = 2;
  LoRANetwork net(cfg);
  net->add_component(tiny_spec(), *model);
  randomize_up(net, 5);
  net->apply_to();
  torch::manual_seed(6);
  torch::Tensor x = torch::randn({1, 4, 8, 8});
  const torch::Tensor adapted = model->forward(x).detach();

  const auto dir = scratch_dir("lora");
  SaveOptions opts;
  opts.metadata = {{"ss_output_name", "tiny"}, {"ss_steps", "3"}, {"ss_base_model_version", "sd_v1"}};
  net->save(dir / "tiny_fp16.safetensors", opts);
  auto f16 = lt::io::SafetensorsFile::open(dir / "tiny_fp16.safetensors");
  CATCH_CHECK(f16->tensors().size() == 3 * net->modules().size());
  const auto& alpha = f16->info("lora_unet_transformer_transformer_blocks_0_attn1_to_q.alpha");
  CATCH_CHECK(alpha.shape.empty());
  CATCH_CHECK(alpha.dtype == lt::io::DType::F16);
  CATCH_CHECK(f16->info("lora_unet_resnet_conv1.lora_down.weight").shape == std::vector<int64_t>({2, 4, 3, 3}));
  CATCH_CHECK(f16->info("lora_unet_resnet_conv1.lora_up.weight").shape == std::vector<int64_t>({8, 2, 1, 1}));
  CATCH_CHECK(f16->load("lora_unet_resnet_conv1.alpha").item<float>() == 2.0f);
  CATCH_CHECK(f16->metadata().at("ss_network_module") == "networks.lora");
  CATCH_CHECK(f16->metadata().at("ss_network_dim") == "4");
  CATCH_CHECK(f16->metadata().at("ss_network_alpha") == "1.0");
  CATCH_CHECK(f16->metadata().at("ss_network_args") == R"({"conv_dim":"2","conv_alpha":"2.0"})");
  CATCH_CHECK(f16->metadata().at("ss_output_name") == "tiny");

  // fp32 file -> fresh copy of the base -> network built from the file's dims -> merged.
  opts.dtype = torch::kFloat;
  net->save(dir / "tiny.safetensors", opts);
  net->remove();
  TinyNet fresh = copy_of(model);
  auto file = lt::io::SafetensorsFile::open(dir / "tiny.safetensors");
  const ComponentSpec spec = tiny_spec();
  auto dims = module_dims_from_file(*file, {spec});
  LoRANetwork loaded(NetworkConfig{});
  CATCH_CHECK(loaded->add_component(spec, *fresh, &dims) == net->modules().size());
  auto report = loaded->load_weights(*file);
  CATCH_CHECK(report.format == LoRAFormat::Kohya);
  CATCH_CHECK(report.loaded == net->modules().size());
  loaded->merge_to(1.0);
  CATCH_CHECK(torch::allclose(fresh->forward(x), adapted, 1e-4, 1e-5));
}

CATCH_TEST_CASE("load_weights restores a kohya file exactly and rejects mismatches", "[lora][load]") {
  TinyNet model;
  NetworkConfig cfg;
  cfg.linear = 4;
  cfg.linear_alpha = 3.0;
  LoRANetwork net(cfg);
  net->add_component(tiny_spec(), *model);
  randomize_up(net, 7);
  const auto dir = scratch_dir("lora_load");
  SaveOptions opts;
  opts.dtype = torch::kFloat;
  net->save(dir / "a.safetensors", opts);
  auto file = lt::io::SafetensorsFile::open(dir / "a.safetensors");

  TinyNet other = copy_of(model);
  LoRANetwork same(cfg);
  same->add_component(tiny_spec(), *other);
  same->load_weights(*file);
  for (size_t i = 0; i < net->modules().size(); ++i) {
    CATCH_CHECK(torch::equal(same->modules()[i]->lora_down, net->modules()[i]->lora_down));
    CATCH_CHECK(torch::equal(same->modules()[i]->lora_up, net->modules()[i]->lora_up));
    CATCH_CHECK(same->modules()[i]->alpha == 3.0);
  }
  NetworkConfig wrong = cfg;
  wrong.linear = 8;
  TinyNet third = copy_of(model);
  LoRANetwork rank8(wrong);
  rank8->add_component(tiny_spec(), *third);
  CATCH_CHECK_THROWS_WITH(rank8->load_weights(*file), Catch::Contains("with different shapes") &&
                                                          Catch::Contains("network down [8, 8]"));
  NetworkConfig more = cfg;
  more.conv = 2;
  TinyNet fourth = copy_of(model);
  LoRANetwork with_conv(more);
  with_conv->add_component(tiny_spec(), *fourth);
  CATCH_CHECK_THROWS_WITH(with_conv->load_weights(*file), Catch::Contains("missing from the file"));
  auto report = with_conv->load_weights(*file, /*strict=*/false);
  // The conv target classes bring the resnet's 4 leaves and the downsampler's conv.
  CATCH_CHECK(report.missing.size() == 5);
  CATCH_CHECK(report.loaded == net->modules().size());
}

CATCH_TEST_CASE("PEFT/diffusers file: keys, folded alpha, maps to the same modules", "[lora][peft]") {
  TinyNet model;
  NetworkConfig cfg;
  cfg.linear = 4;
  cfg.linear_alpha = 1.0;  // scale 1/4, folded into lora_B
  cfg.conv = 2;
  LoRANetwork net(cfg);
  net->add_component(tiny_spec(), *model);
  randomize_up(net, 8);
  net->apply_to();
  torch::manual_seed(9);
  torch::Tensor x = torch::randn({1, 4, 8, 8});
  const torch::Tensor adapted = model->forward(x).detach();
  const auto dir = scratch_dir("lora_peft");
  SaveOptions opts;
  opts.format = LoRAFormat::PEFT;
  opts.dtype = torch::kFloat;
  net->save(dir / "pytorch_lora_weights.safetensors", opts);
  auto file = lt::io::SafetensorsFile::open(dir / "pytorch_lora_weights.safetensors");
  CATCH_CHECK(detect_lora_format(*file) == LoRAFormat::PEFT);
  CATCH_CHECK(file->tensors().size() == 2 * net->modules().size());
  CATCH_CHECK(file->contains("unet.transformer.transformer_blocks.0.attn1.to_out.0.lora_A.weight"));
  CATCH_CHECK(file->contains("unet.resnet.conv1.lora_B.weight"));
  for (const auto& t : file->tensors()) CATCH_CHECK(t.name.find(".alpha") == std::string::npos);
  // lora_B = up * alpha / rank.
  const auto* to_q = [&]() -> const LoRAModuleImpl* {
    for (const auto& m : net->modules())
      if (m->lora_name == "lora_unet_transformer_transformer_blocks_0_attn1_to_q") return m.get();
    return nullptr;
  }();
  CATCH_REQUIRE(to_q != nullptr);
  CATCH_CHECK(torch::allclose(file->load("unet.transformer.transformer_blocks.0.attn1.to_q.lora_B.weight"),
                              to_q->lora_up * 0.25));
  const auto meta = nlohmann::json::parse(file->metadata().at("lora_adapter_metadata"));
  CATCH_CHECK(meta.at("unet.r") == 4);
  CATCH_CHECK(meta.at("unet.lora_alpha") == 4);
  CATCH_CHECK(meta.at("unet.rank_pattern").at("resnet.conv1") == 2);
  CATCH_CHECK(meta.at("unet.alpha_pattern").at("resnet.conv1") == 2);

  // The same modules, by kohya name, and the same output.
  net->remove();
  const ComponentSpec spec = tiny_spec();
  auto dims = module_dims_from_file(*file, {spec});
  std::set<std::string> dim_names;
  for (const auto& [k, v] : dims) {
    dim_names.insert(k);
    CATCH_CHECK(v.alpha == static_cast<double>(v.rank));  // folded: scale 1
  }
  CATCH_CHECK(dim_names == names_of(net));
  TinyNet fresh = copy_of(model);
  LoRANetwork loaded(NetworkConfig{});
  loaded->add_component(spec, *fresh, &dims);
  CATCH_CHECK(loaded->load_weights(*file).format == LoRAFormat::PEFT);
  loaded->apply_to();
  CATCH_CHECK(torch::allclose(fresh->forward(x), adapted, 1e-4, 1e-5));
  // Resume into a network with the original alpha: lora_B is unfolded back to the same up weights.
  TinyNet again = copy_of(model);
  LoRANetwork resumed(cfg);
  resumed->add_component(spec, *again);
  resumed->load_weights(*file);
  CATCH_CHECK(torch::allclose(resumed->modules()[0]->lora_up, net->modules()[0]->lora_up, 1e-6, 1e-7));
}

CATCH_TEST_CASE("text encoder adapters: merged weights reproduce the adapted CLIP output", "[lora][merge]") {
  lt::models::CLIPTextModel te(tiny_clip_config());
  NetworkConfig cfg;
  cfg.train_text_encoder = true;
  cfg.linear = 2;
  LoRANetwork net(cfg);
  net->add_component(ComponentSpec::text_encoder(0), *te);
  randomize_up(net, 10);
  net->apply_to();
  torch::Tensor ids = torch::tensor({{0, 5, 9, 2, 1, 1}}, torch::kLong);
  const torch::Tensor adapted = te->forward(ids).last_hidden_state.detach();
  net->merge_to(1.0);
  const torch::Tensor merged = te->forward(ids).last_hidden_state.detach();
  CATCH_CHECK(torch::allclose(merged, adapted, 1e-4, 1e-5));
}

CATCH_TEST_CASE("a bf16 base gets fp32 adapters and an fp32 delta", "[lora][dtype]") {
  Linear leaf(8, 4);
  leaf->to(torch::kBFloat16);
  mock::Transformer2DModel holder;
  holder->register_module("proj", leaf);
  LoRANetwork net(NetworkConfig{});
  CATCH_REQUIRE(net->add_component(ComponentSpec::sd_unet(), *holder) == 1);
  randomize_up(net, 11);
  net->apply_to();
  LoRAModule m = net->modules()[0];
  CATCH_CHECK(m->lora_down.scalar_type() == torch::kFloat);
  torch::Tensor x = torch::randn({2, 8}).to(torch::kBFloat16);
  CATCH_CHECK(m->delta(x).scalar_type() == torch::kFloat);
  CATCH_CHECK(leaf->forward(x).scalar_type() == torch::kBFloat16);
}

CATCH_TEST_CASE("inspect describes kohya and PEFT files and finds problems", "[lora][inspect]") {
  auto unet = sd15_unet_tree();
  lt::models::CLIPTextModel te(tiny_clip_config());
  NetworkConfig cfg;
  cfg.linear = 8;
  cfg.linear_alpha = 4;
  cfg.conv = 4;
  cfg.train_text_encoder = true;
  LoRANetwork net(cfg);
  net->add_component(ComponentSpec::text_encoder(0), *te);
  net->add_component(ComponentSpec::sd_unet(), *unet);
  const auto dir = scratch_dir("lora_inspect");
  SaveOptions opts;
  opts.metadata = {{"ss_base_model_version", "sd_v1"}};
  net->save(dir / "k.safetensors", opts);
  auto info = inspect_lora(*lt::io::SafetensorsFile::open(dir / "k.safetensors"));
  CATCH_CHECK(info.format == LoRAFormat::Kohya);
  CATCH_CHECK(info.modules == 278 + 72);
  CATCH_CHECK(info.modules_by_component.at("unet") == 278);
  CATCH_CHECK(info.modules_by_component.at("te") == 72);
  CATCH_CHECK(info.conv_modules == 22 * 2 + 6);
  CATCH_CHECK(info.ranks.at(8) == 192 + 72 + 22 + 14);
  CATCH_CHECK(info.alphas.at(4.0) == info.modules);
  CATCH_CHECK(info.dtype == "F16");
  CATCH_CHECK(info.problems.empty());
  const std::string text = describe(info);
  CATCH_CHECK(text.find("kohya format: 350 modules") != std::string::npos);
  CATCH_CHECK(text.find("ss_base_model_version: sd_v1") != std::string::npos);

  opts.format = LoRAFormat::PEFT;
  net->save(dir / "p.safetensors", opts);
  auto pinfo = inspect_lora(*lt::io::SafetensorsFile::open(dir / "p.safetensors"));
  CATCH_CHECK(pinfo.format == LoRAFormat::PEFT);
  CATCH_CHECK(pinfo.modules_by_component.at("unet") == 278);
  CATCH_CHECK(pinfo.modules_by_component.at("text_encoder") == 72);
  CATCH_CHECK(pinfo.alphas.at(8.0) == 192 + 72 + 22 + 14);  // lora_alpha = r from the metadata

  // A hand-broken file: rank mismatch and a module without its up weight.
  lt::io::save_safetensors(dir / "bad.safetensors",
                           {{"lora_unet_a.lora_down.weight", torch::zeros({4, 8})},
                            {"lora_unet_a.lora_up.weight", torch::zeros({8, 2})},
                            {"lora_unet_b.lora_down.weight", torch::zeros({4, 8})}});
  auto bad = inspect_lora(*lt::io::SafetensorsFile::open(dir / "bad.safetensors"));
  CATCH_CHECK(bad.problems.size() == 2);
  CATCH_CHECK(bad.modules_without_alpha == 1);
  lt::io::save_safetensors(dir / "model.safetensors", {{"model.diffusion_model.x.weight", torch::zeros({2})}});
  CATCH_CHECK_THROWS_AS(inspect_lora(*lt::io::SafetensorsFile::open(dir / "model.safetensors")), lt::InputError);
}

CATCH_TEST_CASE("SD1.5 UNet + CLIP: a saved LoRA merged into the base reproduces the adapter model", "[lora][merge][e2e]") {
  using lt::models::sd::UNet2DConditionModel;
  torch::manual_seed(20);
  UNet2DConditionModel unet(tiny_sd15_config());
  lt::models::CLIPTextModel te(tiny_clip_config());
  NetworkConfig cfg;
  cfg.linear = 4;
  cfg.linear_alpha = 2.0;
  cfg.conv = 2;
  cfg.train_text_encoder = true;
  LoRANetwork net(cfg);
  net->add_component(ComponentSpec::text_encoder(0), *te);
  net->add_component(ComponentSpec::sd_unet(), *unet);
  randomize_up(net, 21);
  net->apply_to();
  torch::Tensor ids = torch::tensor({{0, 5, 9, 2, 1, 1}}, torch::kLong);
  torch::Tensor sample = torch::randn({1, 4, 8, 8});
  torch::Tensor t = torch::tensor({500}, torch::kLong);
  auto run = [&](lt::models::CLIPTextModel& text, UNet2DConditionModel& u) {
    torch::NoGradGuard no_grad;
    torch::Tensor context = text->forward(ids).last_hidden_state;  // [1, 6, 16]
    return u->forward(sample, t, context);
  };
  const torch::Tensor adapted = run(te, unet);
  net->remove();
  CATCH_CHECK((run(te, unet) - adapted).abs().max().item<float>() > 1e-4f);

  const auto dir = scratch_dir("lora_sd15");
  SaveOptions opts;
  opts.dtype = torch::kFloat;
  net->save(dir / "sd15.safetensors", opts);
  auto file = lt::io::SafetensorsFile::open(dir / "sd15.safetensors");
  const std::vector<ComponentSpec> specs = {ComponentSpec::text_encoder(0), ComponentSpec::sd_unet()};
  auto dims = module_dims_from_file(*file, specs);
  LoRANetwork loaded(NetworkConfig{});
  loaded->add_component(specs[0], *te, &dims);
  loaded->add_component(specs[1], *unet, &dims);
  CATCH_CHECK(names_of(loaded) == names_of(net));
  loaded->load_weights(*file);
  loaded->merge_to(1.0);
  CATCH_CHECK(torch::allclose(run(te, unet), adapted, 1e-4, 1e-5));
}
