// CLIP text encoder: key tree, loading, and outputs against transformers' (fixtures).
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <set>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/attention.h"
#include "loratrain/models/text/clip.h"
#include "loratrain/util/error.h"
#include "tensor_support.h"
#include "test_paths.h"

using namespace lt::models;

using lt::test::max_abs_diff;
using lt::test::check_close;

namespace {

std::filesystem::path case_dir(const std::string& name) { return lt::test::fixtures_dir() / "parity" / name; }

std::set<std::string> file_keys(const lt::io::SafetensorsFile& f) {
  std::set<std::string> keys;
  for (const auto& t : f.tensors()) keys.insert(t.name);
  return keys;
}

std::set<std::string> model_keys(torch::nn::Module& m, const LoadOptions& options) {
  std::set<std::string> keys;
  for (const auto& [k, v] : module_tensors(m)) {
    if (!options.optional_keys.count(k)) keys.insert(k);
  }
  return keys;
}

template <typename Model>
void run_parity(const std::string& name, bool projection) {
  auto config = CLIPTextConfig::from_file(case_dir(name) / "config.json");
  Model model(config);
  auto weights = lt::io::SafetensorsFile::open(case_dir(name) / "weights.safetensors");
  const auto options = clip_text_load_options();
  CATCH_CHECK(model_keys(*model, options) == file_keys(*weights));
  load_state_dict(*model, *weights, options);
  model->eval();

  auto io = lt::io::SafetensorsFile::open(case_dir(name) / "io.safetensors");
  torch::NoGradGuard no_grad;
  CLIPTextOutput out = model->forward(io->load("in.input_ids"), /*output_hidden_states=*/true);
  check_close("last_hidden_state", out.last_hidden_state, io->load("out.last_hidden_state"));
  if (projection) {
    check_close("text_embeds", out.text_embeds, io->load("out.text_embeds"));
  } else {
    check_close("pooler_output", out.pooler_output, io->load("out.pooler_output"));
  }
  CATCH_REQUIRE(out.hidden_states.size() == static_cast<size_t>(config.num_hidden_layers + 1));
  check_close("penultimate", out.hidden_states[out.hidden_states.size() - 2], io->load("out.penultimate_hidden_state"));
  for (size_t i = 0; i < out.hidden_states.size(); ++i) {
    check_close("hidden_states." + std::to_string(i), out.hidden_states[i], io->load("out.hidden_states." + std::to_string(i)));
  }
}

CLIPTextConfig tiny_config() {
  CLIPTextConfig c;
  c.vocab_size = 50;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 2;
  c.max_position_embeddings = 12;
  c.projection_dim = 8;
  return c;
}

class ConstantAdapter : public Adapter {
 public:
  explicit ConstantAdapter(int64_t out_features) : out_features_(out_features) {}
  torch::Tensor delta(const torch::Tensor& x) override {
    auto sizes = x.sizes().vec();
    sizes.back() = out_features_;
    return torch::full(sizes, 0.5, x.options());
  }

 private:
  int64_t out_features_;
};

}  // namespace

CATCH_TEST_CASE("CLIPTextModel matches transformers (clip_text fixture)", "[text][clip][parity]") {
  run_parity<CLIPTextModel>("clip_text", false);
}

CATCH_TEST_CASE("CLIPTextModelWithProjection matches transformers", "[text][clip][parity]") {
  run_parity<CLIPTextModelWithProjection>("clip_text_with_projection", true);
}

CATCH_TEST_CASE("CLIPTextConfig reads config.json keys verbatim", "[text][clip][config]") {
  auto c = CLIPTextConfig::from_file(case_dir("clip_text") / "config.json");
  CATCH_CHECK(c.hidden_size == 32);
  CATCH_CHECK(c.intermediate_size == 37);
  CATCH_CHECK(c.num_attention_heads == 4);
  CATCH_CHECK(c.hidden_act == "quick_gelu");
  CATCH_CHECK(c.eos_token_id == 2);
  CATCH_CHECK(c.projection_dim == 512);
  // Round trip through to_json.
  auto again = CLIPTextConfig::from_json(c.to_json());
  CATCH_CHECK(again.to_json() == c.to_json());
  // Defaults are transformers' CLIPTextConfig defaults.
  auto d = CLIPTextConfig::from_json(nlohmann::json::object());
  CATCH_CHECK(d.vocab_size == 49408);
  CATCH_CHECK(d.eos_token_id == 49407);
  // Nested CLIPConfig form.
  auto nested = CLIPTextConfig::from_json(nlohmann::json{{"text_config", {{"hidden_size", 64}, {"num_attention_heads", 2}}}});
  CATCH_CHECK(nested.hidden_size == 64);
  CATCH_CHECK_THROWS_AS(CLIPTextConfig::from_json(nlohmann::json{{"hidden_act", "relu"}}), lt::InputError);
  CATCH_CHECK_THROWS_AS(CLIPTextConfig::from_json(nlohmann::json{{"hidden_size", "big"}}), lt::InputError);
  CATCH_CHECK_THROWS_AS(CLIPTextConfig::from_json(nlohmann::json{{"hidden_size", 30}, {"num_attention_heads", 4}}),
                        lt::InputError);
}

CATCH_TEST_CASE("CLIPTextConfig is detected from weight shapes", "[text][clip][config]") {
  std::map<std::string, std::vector<int64_t>> shapes{
      {"cond.text_model.embeddings.token_embedding.weight", {49408, 768}},
      {"cond.text_model.embeddings.position_embedding.weight", {77, 768}},
  };
  for (int i = 0; i < 12; ++i) {
    shapes["cond.text_model.encoder.layers." + std::to_string(i) + ".mlp.fc1.weight"] = {3072, 768};
  }
  auto c = CLIPTextConfig::detect_from_weights(shapes, "cond.");
  CATCH_CHECK(c.num_hidden_layers == 12);
  CATCH_CHECK(c.hidden_size == 768);
  CATCH_CHECK(c.intermediate_size == 3072);
  CATCH_CHECK(c.num_attention_heads == 12);
  CATCH_CHECK(c.hidden_act == "quick_gelu");
  CATCH_CHECK_THROWS_AS(CLIPTextConfig::detect_from_weights(shapes, "other."), lt::InputError);
}

CATCH_TEST_CASE("position_ids in a checkpoint are accepted and ignored", "[text][clip][loader]") {
  auto weights = lt::io::SafetensorsFile::open(case_dir("clip_text") / "weights.safetensors");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& t : weights->tensors()) tensors.emplace_back(t.name, weights->load(t.name));
  // Some merged checkpoints carry float position ids that are slightly off; they must not matter.
  tensors.emplace_back("text_model.embeddings.position_ids", torch::arange(77).to(torch::kFloat).unsqueeze(0) - 0.01);
  auto path = lt::test::scratch_dir("clip_position_ids") / "with_ids.safetensors";
  lt::io::save_safetensors(path, tensors);
  auto config = CLIPTextConfig::from_file(case_dir("clip_text") / "config.json");
  CLIPTextModel with_ids(config), without_ids(config);
  load_state_dict(*with_ids, *lt::io::SafetensorsFile::open(path), clip_text_load_options());
  load_state_dict(*without_ids, *weights, clip_text_load_options());
  auto io = lt::io::SafetensorsFile::open(case_dir("clip_text") / "io.safetensors");
  torch::NoGradGuard no_grad;
  auto ids = io->load("in.input_ids");
  CATCH_CHECK(torch::equal(with_ids(ids).last_hidden_state, without_ids(ids).last_hidden_state));
  CATCH_CHECK(torch::equal(with_ids->text_model->embeddings->position_ids, torch::arange(77).unsqueeze(0)));

  // Strictness stays: a missing weight is still an error.
  tensors.erase(tensors.begin());
  lt::io::save_safetensors(path, tensors);
  CLIPTextModel broken(config);
  CATCH_CHECK_THROWS_AS(load_state_dict(*broken, *lt::io::SafetensorsFile::open(path), clip_text_load_options()),
                        lt::InputError);
}

CATCH_TEST_CASE("CLIP pooling follows transformers' eos rule", "[text][clip]") {
  torch::manual_seed(0);
  auto c = tiny_config();
  auto ids = torch::tensor({{48, 5, 49, 7, 49, 49}, {48, 9, 3, 49, 0, 0}}, torch::kLong);
  torch::NoGradGuard no_grad;
  {
    c.eos_token_id = 2;  // legacy: argmax of the ids
    CLIPTextModel m(c);
    auto out = m(ids);
    CATCH_CHECK(torch::equal(out.pooler_output[0], out.last_hidden_state[0][2]));
    CATCH_CHECK(torch::equal(out.pooler_output[1], out.last_hidden_state[1][3]));
  }
  {
    c.eos_token_id = 7;  // explicit: first position holding the eos id
    CLIPTextModel m(c);
    auto out = m(ids);
    CATCH_CHECK(torch::equal(out.pooler_output[0], out.last_hidden_state[0][3]));
    CATCH_CHECK(torch::equal(out.pooler_output[1], out.last_hidden_state[1][0]));  // none: argmax of zeros
  }
}

CATCH_TEST_CASE("CLIP text encoder is causal and honours a padding mask", "[text][clip]") {
  torch::manual_seed(1);
  CLIPTextModel m(tiny_config());
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(0, 50, {2, 10}, torch::kLong);
  auto base = m(ids).last_hidden_state;
  // Changing a later token leaves every earlier position unchanged.
  auto changed = ids.clone();
  changed.index_put_({torch::indexing::Slice(), 7}, (ids.index({torch::indexing::Slice(), 7}) + 1) % 50);
  auto other = m(changed).last_hidden_state;
  CATCH_CHECK(torch::equal(base.narrow(1, 0, 7), other.narrow(1, 0, 7)));
  CATCH_CHECK(max_abs_diff(base.narrow(1, 7, 3), other.narrow(1, 7, 3)) > 1e-4);
  // An all-ones mask is no mask; masking a key changes later positions only.
  auto ones = torch::ones({2, 10}, torch::kLong);
  CATCH_CHECK(torch::allclose(m(ids, false, ones).last_hidden_state, base, 1e-6, 1e-6));
  auto mask = ones.clone();
  mask.index_put_({torch::indexing::Slice(), 3}, 0);
  auto masked = m(ids, false, mask).last_hidden_state;
  CATCH_CHECK(torch::allclose(masked.narrow(1, 0, 3), base.narrow(1, 0, 3), 1e-6, 1e-6));
  CATCH_CHECK(max_abs_diff(masked.narrow(1, 4, 6), base.narrow(1, 4, 6)) > 1e-4);
}

CATCH_TEST_CASE("CLIP attention in query chunks equals plain attention", "[text][clip]") {
  torch::manual_seed(2);
  CLIPTextModel m(tiny_config());
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(0, 50, {2, 12}, torch::kLong);
  auto plain = m(ids).last_hidden_state;
  const auto saved = default_query_chunk();
  set_default_query_chunk(5);
  auto chunked = m(ids).last_hidden_state;
  set_default_query_chunk(saved);
  CATCH_CHECK(torch::allclose(plain, chunked, 1e-5, 1e-6));
}

CATCH_TEST_CASE("clip skip selects hidden states as SD pipelines do", "[text][clip]") {
  torch::manual_seed(3);
  CLIPTextModel m(tiny_config());
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(0, 50, {1, 6}, torch::kLong);
  auto out = m(ids, true);
  auto& tm = *m->text_model;
  CATCH_CHECK(torch::equal(clip_skip_hidden_state(tm, out, 1, true), out.last_hidden_state));
  CATCH_CHECK(torch::equal(clip_skip_hidden_state(tm, out, 2, false), out.hidden_states[2]));
  CATCH_CHECK(torch::allclose(clip_skip_hidden_state(tm, out, 2, true), tm.final_layer_norm(out.hidden_states[2])));
  // final_layer_norm of the last state is last_hidden_state itself.
  CATCH_CHECK(torch::equal(tm.final_layer_norm(out.hidden_states.back()), out.last_hidden_state));
  CATCH_CHECK_THROWS_AS(clip_skip_hidden_state(tm, out, 4, false), lt::InputError);
  CATCH_CHECK_THROWS_AS(clip_skip_hidden_state(tm, m(ids), 2, false), lt::InputError);
}

CATCH_TEST_CASE("LoRA attaches to the CLIP Linear leaves without changing keys", "[text][clip]") {
  torch::manual_seed(4);
  CLIPTextModelWithProjection m(tiny_config());
  auto keys_before = module_tensors(*m);
  auto ids = torch::randint(0, 50, {1, 6}, torch::kLong);
  torch::NoGradGuard no_grad;
  auto base = m(ids).last_hidden_state;
  auto& layer = *m->text_model->encoder->layers[0]->as<CLIPEncoderLayer>();
  layer.self_attn->q_proj->adapter = std::make_shared<ConstantAdapter>(16);
  layer.mlp->fc2->adapter = std::make_shared<ConstantAdapter>(16);
  CATCH_CHECK(max_abs_diff(m(ids).last_hidden_state, base) > 1e-4);
  auto keys_after = module_tensors(*m);
  CATCH_CHECK(keys_before.size() == keys_after.size());
  layer.self_attn->q_proj->adapter.reset();
  layer.mlp->fc2->adapter.reset();
  CATCH_CHECK(torch::equal(m(ids).last_hidden_state, base));
}

CATCH_TEST_CASE("CLIP text encoder runs in half precision weights", "[text][clip]") {
  torch::manual_seed(5);
  CLIPTextModel m(tiny_config());
  torch::NoGradGuard no_grad;
  auto ids = torch::randint(0, 50, {1, 8}, torch::kLong);
  auto ref = m(ids).last_hidden_state;
  m->to(torch::kBFloat16);
  auto low = m(ids).last_hidden_state;
  CATCH_CHECK(low.scalar_type() == torch::kBFloat16);
  CATCH_CHECK(max_abs_diff(low.to(torch::kFloat), ref) < 0.1 * std::max(1.0, ref.abs().max().item<double>()));
}

CATCH_TEST_CASE("CLIP gradient checkpointing gives identical gradients", "[text][clip]") {
  struct CountingAdapter : Adapter {
    int calls = 0;
    torch::Tensor delta(const torch::Tensor& x) override {
      ++calls;
      return torch::zeros_like(x);
    }
  };
  std::map<bool, int> forward_calls;
  auto grads = [&forward_calls](bool checkpointing) {
    torch::manual_seed(6);
    CLIPTextModel m(tiny_config());
    m->train();
    m->text_model->gradient_checkpointing = checkpointing;
    auto counter = std::make_shared<CountingAdapter>();
    m->text_model->encoder->layers[0]->as<CLIPEncoderLayer>()->self_attn->q_proj->adapter = counter;
    auto ids = torch::randint(0, 50, {2, 7}, torch::kLong);
    auto out = m(ids, true);
    (out.last_hidden_state.pow(2).sum() + out.pooler_output.sum()).backward();
    std::map<std::string, at::Tensor> g;
    for (const auto& p : m->named_parameters()) g[p.key()] = p.value().grad().clone();
    forward_calls[checkpointing] = counter->calls;
    return g;
  };
  auto plain = grads(false), recomputed = grads(true);
  CATCH_CHECK(forward_calls[false] == 1);
  CATCH_CHECK(forward_calls[true] == 2);  // the layer ran again in backward
  CATCH_REQUIRE(plain.size() == recomputed.size());
  for (const auto& [name, g] : plain) {
    CATCH_INFO(name);
    CATCH_REQUIRE(recomputed[name].defined());
    CATCH_CHECK(torch::allclose(g, recomputed[name], 1e-5, 1e-6));
  }
}
