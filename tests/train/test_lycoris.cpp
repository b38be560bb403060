// LoKr and LoHa adapters (AI Toolkit's network.type lokr / loha) on the tiny SD1 and SDXL bases:
// they learn, their files merge under ComfyUI's rules to the weights they trained, they load back,
// and `run` trains and saves them.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "loratrain/io/safetensors.h"
#include "loratrain/lora/format.h"
#include "loratrain/lora/network.h"
#include "loratrain/models/layers.h"
#include "loratrain/train/diffusion_model.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"

#include <set>
#include "fixed_batch.h"
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
//   Tucker (k x k convs, lokr_t2 | hada_t1, hada_t2): the factor is einsum of the core with its pair.
at::Tensor comfy_merge(const lt::io::SafetensorsFile& file, const std::string& stem, const at::Tensor& w, double strength) {
  auto get = [&](const std::string& part) {
    const std::string key = stem + "." + part;
    return file.contains(key) ? file.load(key, at::kFloat) : at::Tensor();
  };
  const at::Tensor alpha_t = get("alpha");
  at::Tensor diff;
  double scale = 1.0;
  // Tucker (CP) form: einsum("i j k l, j r, i p -> p r k l", t, w_b, w_a).
  auto tucker = [](const at::Tensor& t, const at::Tensor& b, const at::Tensor& a) {
    return torch::einsum("ijkl,jr,ip->prkl", {t, b, a}).contiguous();
  };
  if (get("hada_w1_a").defined()) {
    const at::Tensor w1b = get("hada_w1_b");
    if (get("hada_t1").defined()) {
      diff = tucker(get("hada_t1"), w1b, get("hada_w1_a")) * tucker(get("hada_t2"), get("hada_w2_b"), get("hada_w2_a"));
    } else {
      diff = get("hada_w1_a").mm(w1b) * get("hada_w2_a").mm(get("hada_w2_b").flatten(1));
    }
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
      w2 = get("lokr_t2").defined() ? tucker(get("lokr_t2"), get("lokr_w2_b"), get("lokr_w2_a"))
                                    : get("lokr_w2_a").mm(get("lokr_w2_b").flatten(1));
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
  const auto fit = lt::test::fit_fixed_batch(*model, network, kind == "loha" ? 3e-2 : 1e-2, 80);
  CATCH_REQUIRE(network->count(true) > 0);
  for (const auto& m : network->modules()) CATCH_CHECK(m->type() != AdapterType::LoRA);
  CATCH_INFO("loss " << fit.first << " -> " << fit.last << " after " << fit.steps << " steps");
  CATCH_CHECK(fit.last < 0.5 * fit.first);
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

// A file another trainer wrote with LyCORIS' use_tucker (Tucker/CP form on k x k convs): the module's
// own file rewritten with lokr_t2 | hada_t1/hada_t2 cores for every 3x3 conv.
CATCH_TEST_CASE("LoKr and LoHa files in Tucker form load and merge under ComfyUI's rules", "[lora][lycoris][tucker]") {
  const auto kind = GENERATE(std::string("lokr"), std::string("loha"));
  CATCH_INFO(kind);
  auto model = tiny_model("sd1");
  torch::manual_seed(9);
  lt::lora::LoRANetwork network(adapter_config(kind));
  for (const auto& target : model->lora_targets()) network->add_component(*target.spec, *target.root);
  const auto dir = lt::test::scratch_dir("lycoris_tucker_" + kind);
  lt::lora::SaveOptions save;
  save.dtype = at::kFloat;
  network->save(dir / "plain.safetensors", save);
  auto plain = lt::io::SafetensorsFile::open(dir / "plain.safetensors");

  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::set<std::string> tucker_stems;
  for (const auto& m : network->modules()) {
    const at::Tensor w = m->base_weight();
    const bool kxk = w.dim() == 4 && w.size(2) > 1;
    const int64_t r = m->rank;
    if (kxk && r > 0 && (kind == "loha" || m->lokr_shape().w2_rank > 0)) tucker_stems.insert(m->lora_name);
  }
  for (const auto& t : plain->tensors()) {
    const auto dot = t.name.rfind('.');
    const std::string stem = t.name.substr(0, dot), part = t.name.substr(dot + 1);
    if (!tucker_stems.count(stem) || part == "alpha" || part == "lokr_w1" || part.rfind("lokr_w1_", 0) == 0) {
      tensors.emplace_back(t.name, plain->load(t.name, at::kFloat));
    }
  }
  for (const auto& m : network->modules()) {
    if (!tucker_stems.count(m->lora_name)) continue;
    const auto shape = m->leaf_weight_shape();
    const int64_t r = kind == "loha" ? m->rank : m->lokr_shape().w2_rank, k = shape[2];
    const int64_t out = kind == "loha" ? shape[0] : shape[0] / m->lokr_shape().out_l;
    const int64_t in = kind == "loha" ? shape[1] : shape[1] / m->lokr_shape().in_m;
    auto add = [&](const std::string& part, std::vector<int64_t> s) { tensors.emplace_back(m->lora_name + "." + part, torch::randn(s) * 0.3); };
    if (kind == "loha") {
      for (const char* i : {"1", "2"}) {
        add(std::string("hada_w") + i + "_a", {r, out});
        add(std::string("hada_w") + i + "_b", {r, in});
        add(std::string("hada_t") + i, {r, r, k, k});
      }
    } else {
      add("lokr_w2_a", {r, out});
      add("lokr_w2_b", {r, in});
      add("lokr_t2", {r, r, k, k});
    }
  }
  CATCH_REQUIRE_FALSE(tucker_stems.empty());
  lt::io::save_safetensors(dir / "tucker.safetensors", tensors, plain->metadata());
  auto file = lt::io::SafetensorsFile::open(dir / "tucker.safetensors");

  auto fresh = tiny_model("sd1");
  std::vector<lt::lora::ComponentSpec> specs;
  for (const auto& t : fresh->lora_targets()) specs.push_back(*t.spec);
  const auto dims = lt::lora::module_dims_from_file(*file, specs);
  lt::lora::LoRANetwork loaded(lt::lora::NetworkConfig{});
  for (const auto& target : fresh->lora_targets()) loaded->add_component(*target.spec, *target.root, &dims);
  const auto report = loaded->load_weights(*file);
  CATCH_CHECK(report.loaded == network->modules().size());
  size_t tucker_checked = 0;
  loaded->apply_to();
  loaded->set_multiplier(0.8);
  torch::NoGradGuard no_grad;
  for (const auto& m : loaded->modules()) {
    CATCH_INFO(m->lora_name);
    const at::Tensor w = m->base_weight();
    const at::Tensor comfy = comfy_merge(*file, m->lora_name, w, 0.8);
    CATCH_CHECK((comfy - (w + m->delta_weight(0.8))).abs().max().item<double>() < 1e-5);
    if (!tucker_stems.count(m->lora_name)) continue;
    ++tucker_checked;
    // The forward pass applies the same weight.
    for (const auto& item : fresh->lora_targets()[0].root->named_modules()) {
      auto conv = std::dynamic_pointer_cast<lt::models::Conv2dImpl>(item.value());
      if (!conv || conv->weight.unsafeGetTensorImpl() != w.unsafeGetTensorImpl()) continue;
      const at::Tensor x = torch::randn({1, conv->weight.size(1), 8, 8});
      const at::Tensor expected = torch::conv2d(x, comfy, conv->bias, {conv->stride, conv->stride}, {conv->padding, conv->padding});
      CATCH_CHECK((conv->forward(x) - expected).abs().max().item<double>() < 1e-4);
    }
  }
  CATCH_CHECK(tucker_checked == tucker_stems.size());
  const auto info = lt::lora::inspect_lora(*file);
  CATCH_CHECK(info.problems.empty());
  CATCH_CHECK(info.conv_modules >= tucker_stems.size());
}

// LoHa's backward keeps only the factors and rebuilds the products: its gradients equal plain
// autograd's over the same formula, for a Linear and for a strided 3x3 conv.
CATCH_TEST_CASE("LoHa's own backward gives autograd's gradients", "[lora][lycoris]") {
  torch::manual_seed(2);
  const bool conv = GENERATE(false, true);
  CATCH_INFO((conv ? "conv" : "linear"));
  lt::lora::AdapterOptions options;
  options.type = AdapterType::LoHa;
  options.rank = 3;
  options.alpha = 2.0;
  auto linear_leaf = std::make_shared<lt::models::LinearImpl>(12, 10);
  auto conv_leaf = std::make_shared<lt::models::Conv2dImpl>(6, 5, 3, 2, 1);
  lt::lora::LoRAModule module = conv ? lt::lora::LoRAModule("m", "m", conv_leaf, options)
                                     : lt::lora::LoRAModule("m", "m", linear_leaf, options);
  module->multiplier = 0.7;
  std::vector<at::Tensor> factors;
  for (const auto& [name, t] : module->file_parts()) {
    torch::NoGradGuard no_grad;
    t.normal_(0.0, 0.5);
    factors.push_back(t);
  }
  const at::Tensor x = conv ? torch::randn({2, 6, 9, 9}) : torch::randn({2, 4, 12});
  const at::Tensor x1 = x.clone().requires_grad_(true), x2 = x.clone().requires_grad_(true);
  const at::Tensor y1 = module->delta(x1);
  const at::Tensor probe = torch::randn_like(y1);
  (y1 * probe).sum().backward();
  std::vector<at::Tensor> ours;
  for (auto& f : factors) {
    ours.push_back(f.grad().clone());
    f.mutable_grad() = at::Tensor();
  }
  // The same delta by plain autograd.
  const at::Tensor w = (factors[0].matmul(factors[1]) * factors[2].matmul(factors[3]) * (0.7 * 2.0 / 3.0))
                           .reshape(module->leaf_weight_shape());
  const at::Tensor y2 = conv ? torch::conv2d(x2, w, {}, {2, 2}, {1, 1}) : torch::nn::functional::linear(x2, w);
  CATCH_CHECK((y1 - y2).abs().max().item<double>() < 1e-5);
  (y2 * probe).sum().backward();
  CATCH_CHECK((x1.grad() - x2.grad()).abs().max().item<double>() < 1e-4);
  for (size_t i = 0; i < factors.size(); ++i) {
    CATCH_INFO("factor " << i);
    CATCH_CHECK((ours[i] - factors[i].grad()).abs().max().item<double>() < 1e-4 * (1.0 + factors[i].grad().abs().max().item<double>()));
  }
}
