// LoKr and LoHa adapters (AI Toolkit's network.type lokr / loha) on the tiny SD1 and SDXL bases:
// they learn, their files merge under ComfyUI's rules to the weights they trained, they load back,
// and `run` trains and saves them.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/io/safetensors.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/layers.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/sample/noise.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/objective.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "train_fixture.h"

using lt::lora::AdapterType;

namespace {

std::unique_ptr<lt::train::DiffusionModel> tiny_model(const std::string& base) {
  lt::train::ModelLoadOptions options;
  options.name_or_path = base == "sd1" ? lt::test::tiny_assets() / "base" / "model.safetensors"
                                       : lt::test::tiny_sdxl() / "sdxl" / "model.safetensors";
  return lt::train::load_diffusion_model(options);
}

lt::lora::NetworkConfig adapter_config(const std::string& kind) {
  lt::lora::NetworkConfig net;
  net.linear = 4;
  net.linear_alpha = 2;
  net.conv = 4;
  if (kind == "loha") net.type = AdapterType::LoHa;
  if (kind.rfind("lokr", 0) == 0) {
    net.type = AdapterType::LoKr;
    net.lokr_full_rank = kind == "lokr_full";
    net.lokr_decompose_both = kind == "lokr_both";
    net.linear = 2;  // small enough that the tiny layers' factors get decomposed
  }
  return net;
}

// What ComfyUI's LoKr/LoHa weight adapters add to a layer's weight `w` from a file's tensors
// (written here from the format's definition, independently of the network code):
//   LoKr: w1 = lokr_w1 | lokr_w1_a @ lokr_w1_b, w2 = lokr_w2 | lokr_w2_a @ lokr_w2_b;
//         dim = the rank of the decomposed factor (w2's when both), scale alpha / dim or 1 without;
//         diff = kron(w1 (widened to 4-d when w2 is), w2) reshaped to w.
//   LoHa: diff = (w1_a @ w1_b) * (w2_a @ w2_b) reshaped to w, scale alpha / w1_b.rows.
at::Tensor comfy_merge(const lt::io::SafetensorsFile& file, const std::string& stem, const at::Tensor& w, double strength) {
  auto get = [&](const std::string& part) {
    const std::string key = stem + "." + part;
    return file.contains(key) ? file.load(key, at::kFloat) : at::Tensor();
  };
  const at::Tensor alpha_t = get("alpha");
  at::Tensor diff;
  double scale = 1.0;
  if (get("hada_w1_a").defined()) {
    const at::Tensor w1b = get("hada_w1_b");
    diff = get("hada_w1_a").mm(w1b) * get("hada_w2_a").mm(get("hada_w2_b").flatten(1));
    if (alpha_t.defined()) scale = alpha_t.item<double>() / static_cast<double>(w1b.size(0));
  } else {
    at::Tensor w1 = get("lokr_w1"), w2 = get("lokr_w2");
    std::optional<int64_t> dim;
    if (!w1.defined()) {
      dim = get("lokr_w1_b").size(0);
      w1 = get("lokr_w1_a").mm(get("lokr_w1_b"));
    }
    if (!w2.defined()) {
      dim = get("lokr_w2_b").size(0);
      w2 = get("lokr_w2_a").mm(get("lokr_w2_b").flatten(1));
    }
    if (w2.dim() == 4) w1 = w1.unsqueeze(2).unsqueeze(2);
    if (alpha_t.defined() && dim) scale = alpha_t.item<double>() / static_cast<double>(*dim);
    diff = torch::kron(w1, w2);
  }
  return w.to(at::kFloat) + strength * scale * diff.reshape(w.sizes());
}

}  // namespace

CATCH_TEST_CASE("LyCORIS factorization splits dimensions as LyCORIS does", "[lora][lycoris]") {
  using lt::lora::lokr_factorization;
  CATCH_CHECK(lokr_factorization(320, -1) == std::make_pair<int64_t, int64_t>(16, 20));
  CATCH_CHECK(lokr_factorization(768, -1) == std::make_pair<int64_t, int64_t>(24, 32));
  CATCH_CHECK(lokr_factorization(64, 4) == std::make_pair<int64_t, int64_t>(4, 16));
  CATCH_CHECK(lokr_factorization(64, 32) == std::make_pair<int64_t, int64_t>(2, 32));  // swapped: m <= n
  CATCH_CHECK(lokr_factorization(1280, 8) == std::make_pair<int64_t, int64_t>(8, 160));
  CATCH_CHECK(lokr_factorization(13, -1) == std::make_pair<int64_t, int64_t>(1, 13));  // a prime
  CATCH_CHECK(lokr_factorization(100, 6) == std::make_pair<int64_t, int64_t>(5, 20));  // 6 does not divide: best m <= 6
  // 320 x 768 at rank 4: w1 [16, 24] full, w2 [20, 32] decomposed (4 < 32 / 2).
  auto s = lt::lora::lokr_shape(320, 768, 4, -1, false, false);
  CATCH_CHECK(s.out_l == 16);
  CATCH_CHECK(s.in_m == 24);
  CATCH_CHECK(s.w1_rank == 0);
  CATCH_CHECK(s.w2_rank == 4);
  CATCH_CHECK(lt::lora::lokr_shape(320, 768, 4, -1, false, true).w1_rank == 4);
  CATCH_CHECK(lt::lora::lokr_shape(320, 768, 4, -1, true, true).w2_rank == 0);
  CATCH_CHECK(lt::lora::lokr_shape(320, 768, 16, -1, false, false).w2_rank == 0);  // 16 >= 32 / 2: full
}

CATCH_TEST_CASE("LoKr and LoHa on each family's tiny base halve the loss on a fixed batch", "[train][learning][lycoris]") {
  const auto base = GENERATE(std::string("sd1"), std::string("sdxl"));
  const auto kind = GENERATE(std::string("lokr"), std::string("lokr_full"), std::string("loha"));
  CATCH_INFO(base << " " << kind);
  auto model = tiny_model(base);
  torch::manual_seed(3);  // after loading: the tiny bases are made on first use, from the same generator
  lt::lora::LoRANetwork network(adapter_config(kind));
  for (const auto& target : model->lora_targets()) network->add_component(*target.spec, *target.root);
  CATCH_REQUIRE(network->count(true) > 0);
  for (const auto& m : network->modules()) CATCH_CHECK(m->type() != AdapterType::LoRA);
  network->apply_to();
  model->set_training(true);
  auto optimizer = lt::optim::make_optimizer("adamw", network->trainable_parameters(), {});
  const lt::train::TrainingObjective objective(model->traits(), {});

  auto generator = lt::sample::make_generator(11);
  const auto latents = lt::sample::randn({2, model->traits().latent_channels, 8, 8}, generator);
  lt::train::Conditioning conditioning;
  {
    torch::NoGradGuard no_grad;
    conditioning.text = model->encode_text({"a red circle", "a blue square"});
  }
  conditioning.images.assign(2, {64, 64, 0, 0, 64, 64});
  const auto start = lt::sample::generator_state(generator);
  auto loss_now = [&] {
    lt::sample::set_generator_state(generator, start);
    return lt::train::training_loss(*model, objective, latents, conditioning, generator);
  };
  const double first = loss_now().item<double>();
  for (int step = 0; step < 80; ++step) {
    optimizer->zero_grad();
    loss_now().backward();
    optimizer->step(kind == "loha" ? 3e-2 : 1e-2);
  }
  const double last = loss_now().item<double>();
  CATCH_INFO("loss " << first << " -> " << last);
  CATCH_CHECK(last < 0.5 * first);
}

CATCH_TEST_CASE("LoKr and LoHa files merge under ComfyUI's rules to the trained weights and load back", "[lora][lycoris]") {
  const auto base = GENERATE(std::string("sd1"), std::string("sdxl"));
  const auto kind = GENERATE(std::string("lokr"), std::string("lokr_full"), std::string("lokr_both"), std::string("loha"));
  CATCH_INFO(base << " " << kind);
  auto model = tiny_model(base);
  torch::manual_seed(5);
  lt::lora::LoRANetwork network(adapter_config(kind));
  for (const auto& target : model->lora_targets()) network->add_component(*target.spec, *target.root);
  {
    // Trained-like weights: every factor non-zero.
    torch::NoGradGuard no_grad;
    for (auto& p : network->trainable_parameters()) p.normal_(0.0, 0.2);
  }
  const auto dir = lt::test::scratch_dir("lycoris_" + base + "_" + kind);
  lt::lora::SaveOptions save;
  save.dtype = at::kFloat;
  network->save(dir / "adapter.safetensors", save);
  auto file = lt::io::SafetensorsFile::open(dir / "adapter.safetensors");

  size_t convs = 0, decomposed = 0;
  for (const auto& m : network->modules()) {
    const at::Tensor w = m->base_weight();
    const at::Tensor trained = w.to(at::kFloat) + m->delta_weight(0.8);
    const at::Tensor comfy = comfy_merge(*file, m->lora_name, w, 0.8);
    CATCH_INFO(m->lora_name);
    CATCH_REQUIRE(comfy.sizes() == trained.sizes());
    CATCH_CHECK((comfy - trained).abs().max().item<double>() < 1e-5);
    if (w.dim() == 4 && w.size(2) > 1) ++convs;
    if (m->rank > 0) ++decomposed;
  }
  CATCH_CHECK(convs > 0);  // 3x3 convs carry adapters too
  if (kind == "lokr_full") CATCH_CHECK(decomposed == 0);
  if (kind == "lokr" || kind == "lokr_both" || kind == "loha") CATCH_CHECK(decomposed > 0);

  // The adapter in the forward pass is the merged weight: every adapted leaf's output equals the
  // layer run with ComfyUI's merged weight (LoKr's factored forward included).
  network->apply_to();
  network->set_multiplier(0.8);
  {
    torch::NoGradGuard no_grad;
    std::map<const void*, std::string> stem_of;
    for (const auto& m : network->modules()) stem_of[m->base_weight().unsafeGetTensorImpl()] = m->lora_name;
    size_t checked = 0;
    for (const auto& target : model->lora_targets()) {
      for (const auto& item : target.root->named_modules()) {
        if (auto linear = std::dynamic_pointer_cast<lt::models::LinearImpl>(item.value())) {
          if (!linear->adapter) continue;
          const at::Tensor merged = comfy_merge(*file, stem_of.at(linear->weight.unsafeGetTensorImpl()), linear->weight, 0.8);
          const at::Tensor x = torch::randn({2, 3, linear->weight.size(1)});
          const at::Tensor expected = torch::nn::functional::linear(x, merged, linear->bias);
          CATCH_CHECK((linear->forward(x) - expected).abs().max().item<double>() < 1e-4);
          ++checked;
        } else if (auto conv = std::dynamic_pointer_cast<lt::models::Conv2dImpl>(item.value())) {
          if (!conv->adapter) continue;
          const at::Tensor merged = comfy_merge(*file, stem_of.at(conv->weight.unsafeGetTensorImpl()), conv->weight, 0.8);
          const at::Tensor x = torch::randn({2, conv->weight.size(1), 8, 8});
          const at::Tensor expected =
              torch::conv2d(x, merged, conv->bias, {conv->stride, conv->stride}, {conv->padding, conv->padding});
          CATCH_CHECK((conv->forward(x) - expected).abs().max().item<double>() < 1e-4);
          ++checked;
        }
      }
    }
    CATCH_CHECK(checked == network->modules().size());
  }
  network->remove();

  // Loaded back (for resume and for sample): the same modules, types and weights.
  auto fresh = tiny_model(base);
  const auto specs = [&] {
    std::vector<lt::lora::ComponentSpec> s;
    for (const auto& t : fresh->lora_targets()) s.push_back(*t.spec);
    return s;
  }();
  const auto dims = lt::lora::module_dims_from_file(*file, specs);
  lt::lora::LoRANetwork loaded(lt::lora::NetworkConfig{});
  for (const auto& target : fresh->lora_targets()) loaded->add_component(*target.spec, *target.root, &dims);
  CATCH_REQUIRE(loaded->modules().size() == network->modules().size());
  const auto report = loaded->load_weights(*file);
  CATCH_CHECK(report.loaded == network->modules().size());
  for (size_t i = 0; i < network->modules().size(); ++i) {
    const auto& a = network->modules()[i];
    const auto& b = loaded->modules()[i];
    CATCH_CHECK(a->type() == b->type());
    CATCH_CHECK(a->scale() == b->scale());
    CATCH_CHECK(torch::equal(a->delta_weight(1.0), b->delta_weight(1.0)));
  }

  // inspect names the adapter type.
  const std::string text = lt::lora::describe(lt::lora::inspect_lora(*file));
  CATCH_INFO(text);
  CATCH_CHECK_THAT(text, Catch::Contains(kind == "loha" ? "LoHa, kohya format" : "LoKr, kohya format"));
  CATCH_CHECK(lt::lora::inspect_lora(*file).problems.empty());
  CATCH_CHECK(file->metadata().at("ss_network_module") == "lycoris.kohya");

  // A layer of the wrong size gets one clear error.
  lt::lora::NetworkConfig other = adapter_config(kind);
  other.linear = 8;
  other.lokr_factor = 2;
  lt::lora::LoRANetwork mismatched(other);
  for (const auto& target : fresh->lora_targets()) mismatched->add_component(*target.spec, *target.root);
  CATCH_CHECK_THROWS_AS(mismatched->load_weights(*file), lt::InputError);
}

CATCH_TEST_CASE("run trains and saves a LoKr and a LoHa that ComfyUI can load", "[train][e2e][lycoris]") {
  const auto kind = GENERATE(std::string("lokr"), std::string("loha"));
  auto root = lt::test::scratch_dir("run_" + kind);
  auto config = lt::test::write_tiny_config(root, kind, 4);
  lt::train::RunRequest request;
  request.config_path = config;
  request.overrides = {"network.type=" + kind, "network.lokr_full_rank=false"};
  auto result = lt::train::run_training(request);
  CATCH_REQUIRE(result.exit_code == 0);
  auto file = lt::io::SafetensorsFile::open(root / kind / (kind + ".safetensors"));
  size_t parts = 0;
  for (const auto& t : file->tensors()) {
    CATCH_CHECK(t.name.find(".lora_") == std::string::npos);
    if (t.name.find(kind == "lokr" ? ".lokr_w" : ".hada_w") != std::string::npos) ++parts;
  }
  CATCH_CHECK(parts > 0);
  const auto info = lt::lora::inspect_lora(*file);
  CATCH_CHECK(info.types.at(kind) == info.modules);
  CATCH_CHECK(info.problems.empty());

  // PEFT cannot hold them: one clear config error before training.
  lt::train::RunRequest peft = request;
  peft.overrides.push_back("save.save_format=peft");
  CATCH_CHECK_THROWS_WITH(lt::train::run_training(peft), Catch::Contains("PEFT/diffusers layout holds LoRA adapters only"));
}
