// The T5 / umT5 encoder: config reading and detection, the module tree against transformers' keys,
// the relative position buckets, and the forward pass against a reference written out below from
// the T5 v1.1 definition (the parity case tests/fixtures/parity/t5_encoder checks T5 against
// transformers itself; umT5's per-layer bias tables are checked here).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "loratrain/io/safetensors.h"
#include "loratrain/models/attention.h"
#include "loratrain/models/text/t5.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

using namespace lt::models;

using lt::test::parity_case;

namespace {

T5Config tiny_config(const std::string& model_type) {
  T5Config c;
  c.model_type = model_type;
  c.vocab_size = 50;
  c.d_model = 16;
  c.d_kv = 6;  // inner width 18 != d_model
  c.num_heads = 3;
  c.d_ff = 20;
  c.num_layers = 3;
  c.relative_attention_num_buckets = 32;
  c.relative_attention_max_distance = 128;
  return c;
}

// Every parameter re-drawn (norm scales near 1), so no layer is an identity.
void randomize(torch::nn::Module& m, uint64_t seed) {
  torch::NoGradGuard no_grad;
  torch::manual_seed(seed);
  for (auto& p : m.named_parameters(true)) {
    at::Tensor v = torch::randn(p.value().sizes());
    if (p.key().find("layer_norm") != std::string::npos) {
      v = 1.0 + 0.1 * v;
    } else if (p.value().dim() == 2 && p.key().find("relative_attention_bias") == std::string::npos &&
               p.key() != "shared.weight") {
      v = v / std::sqrt(static_cast<double>(p.value().size(1)));
    }
    p.value().copy_(v);
  }
}

// Bucket of one relative position, from the T5 definition in double precision.
int64_t reference_bucket(int64_t relative, int64_t num_buckets, int64_t max_distance) {
  const int64_t half = num_buckets / 2, max_exact = half / 2;
  const int64_t base = relative > 0 ? half : 0;
  const int64_t n = std::abs(relative);
  if (n < max_exact) return base + n;
  const auto log_spaced = static_cast<int64_t>(std::log(static_cast<double>(n) / max_exact) /
                                               std::log(static_cast<double>(max_distance) / max_exact) *
                                               static_cast<double>(half - max_exact));
  return base + std::min(max_exact + log_spaced, half - 1);
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& w, double eps) {
  return w * (x / (x.pow(2).mean(-1, true) + eps).sqrt());
}

// The encoder written out from its definition: pre-norm blocks, attention logits q·kᵀ + bias
// without scaling, gated tanh-GELU FFN. Lengths here stay below the log-spaced bucket boundaries.
at::Tensor reference_forward(T5EncoderModelImpl& m, const at::Tensor& ids, const std::optional<at::Tensor>& mask) {
  const T5Config& c = m.config;
  const int64_t b = ids.size(0), l = ids.size(1), h_count = c.num_heads;
  at::Tensor h = m.shared->weight.index_select(0, ids.flatten()).view({b, l, c.d_model});
  at::Tensor additive = torch::zeros({b, 1, 1, l});
  if (mask) additive.masked_fill_(mask->view({b, 1, 1, l}).eq(0), std::numeric_limits<float>::lowest());
  auto linear = [](const at::Tensor& x, const LinearImpl& lin) { return x.matmul(lin.weight.t()); };
  for (int64_t i = 0; i < c.num_layers; ++i) {
    auto* block = m.encoder->block[static_cast<size_t>(i)]->as<T5Block>();
    auto& att = *block->self_attention->SelfAttention;
    auto* table_owner = c.bias_in_every_layer() ? block : m.encoder->block[0]->as<T5Block>();
    const at::Tensor table = table_owner->self_attention->SelfAttention->relative_attention_bias->weight;  // [NB, H]
    at::Tensor bias = torch::empty({1, h_count, l, l});
    for (int64_t qi = 0; qi < l; ++qi) {
      for (int64_t ki = 0; ki < l; ++ki) {
        const int64_t bucket = reference_bucket(ki - qi, c.relative_attention_num_buckets, c.relative_attention_max_distance);
        bias.select(2, qi).select(2, ki).copy_(table[bucket].view({1, h_count}));
      }
    }
    at::Tensor x = rms(h, block->self_attention->layer_norm->weight, c.layer_norm_epsilon);
    auto heads = [&](const at::Tensor& t) { return t.view({b, l, h_count, c.d_kv}).transpose(1, 2); };
    at::Tensor q = heads(linear(x, *att.q)), k = heads(linear(x, *att.k)), v = heads(linear(x, *att.v));
    at::Tensor probs = torch::softmax(q.matmul(k.transpose(-1, -2)) + bias + additive, -1);
    h = h + linear(probs.matmul(v).transpose(1, 2).reshape({b, l, h_count * c.d_kv}), *att.o);
    auto& ff = *block->feed_forward->DenseReluDense;
    x = rms(h, block->feed_forward->layer_norm->weight, c.layer_norm_epsilon);
    at::Tensor g = linear(x, *ff.wi_0);
    g = 0.5 * g * (1.0 + torch::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g.pow(3))));
    h = h + linear(g * linear(x, *ff.wi_1), *ff.wo);
  }
  return rms(h, m.encoder->final_layer_norm->weight, c.layer_norm_epsilon);
}

std::set<std::string> parameter_names(torch::nn::Module& m) {
  std::set<std::string> out;
  for (const auto& p : m.named_parameters(true)) out.insert(p.key());
  return out;
}

}  // namespace

CATCH_TEST_CASE("T5 config: config.json keys, defaults, errors", "[t5][config]") {
  const T5Config c = T5Config::from_file(parity_case("t5_encoder") / "config.json");
  CATCH_CHECK(c.model_type == "t5");
  CATCH_CHECK(c.d_model == 32);
  CATCH_CHECK(c.d_kv == 8);
  CATCH_CHECK(c.d_ff == 37);
  CATCH_CHECK(c.num_heads == 4);
  CATCH_CHECK(c.num_layers == 2);
  CATCH_CHECK(c.vocab_size == 1000);
  CATCH_CHECK(c.relative_attention_num_buckets == 32);
  CATCH_CHECK(c.relative_attention_max_distance == 128);
  CATCH_CHECK(c.layer_norm_epsilon == 1e-6);
  CATCH_CHECK(!c.bias_in_every_layer());
  CATCH_CHECK(T5Config::from_json(c.to_json()).to_json() == c.to_json());

  // An empty config is T5-XXL v1.1.
  const T5Config xxl = T5Config::from_json(nlohmann::json::object());
  CATCH_CHECK(xxl.to_json() == T5Config::t5_v1_1_xxl().to_json());
  CATCH_CHECK(T5Config::from_json({{"model_type", "umt5"}}).bias_in_every_layer());

  CATCH_CHECK_THROWS_AS(T5Config::from_json({{"d_model", "big"}}), lt::InputError);
  CATCH_CHECK_THROWS_WITH(T5Config::from_json({{"feed_forward_proj", "relu"}}), Catch::Contains("relu"));
  CATCH_CHECK_THROWS_WITH(T5Config::from_json({{"model_type", "bert"}}), Catch::Contains("not a T5 encoder"));
  CATCH_CHECK_THROWS_AS(T5Config::from_json({{"num_heads", 0}}), lt::InputError);
  CATCH_CHECK_THROWS_AS(T5Config::from_file(parity_case("t5_encoder") / "missing.json"), lt::InputError);
}

CATCH_TEST_CASE("T5 config from weight shapes: T5-XXL v1.1 and umT5-XXL", "[t5][config]") {
  auto xxl_shapes = [](int64_t vocab, bool bias_every_layer) {
    std::map<std::string, std::vector<int64_t>> s{{"shared.weight", {vocab, 4096}},
                                                  {"encoder.final_layer_norm.weight", {4096}}};
    for (int i = 0; i < 24; ++i) {
      const std::string p = "encoder.block." + std::to_string(i) + ".layer.";
      for (const char* n : {"q", "k", "v", "o"}) s[p + "0.SelfAttention." + n + ".weight"] = {4096, 4096};
      if (i == 0 || bias_every_layer) s[p + "0.SelfAttention.relative_attention_bias.weight"] = {32, 64};
      s[p + "1.DenseReluDense.wi_0.weight"] = {10240, 4096};
      s[p + "1.DenseReluDense.wi_1.weight"] = {10240, 4096};
      s[p + "1.DenseReluDense.wo.weight"] = {4096, 10240};
    }
    return s;
  };
  CATCH_CHECK(T5Config::detect_from_weights(xxl_shapes(32128, false)).to_json() == T5Config::t5_v1_1_xxl().to_json());
  CATCH_CHECK(T5Config::detect_from_weights(xxl_shapes(256384, true)).to_json() == T5Config::umt5_xxl().to_json());

  auto shapes = xxl_shapes(32128, false);
  shapes.erase("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight");
  CATCH_CHECK_THROWS_WITH(T5Config::detect_from_weights(shapes), Catch::Contains("relative_attention_bias"));
}

CATCH_TEST_CASE("T5 module tree is transformers' state-dict key tree", "[t5]") {
  // T5: the fixture's keys (save_pretrained: shared.weight, no tied encoder.embed_tokens.weight).
  T5EncoderModel t5(T5Config::from_file(parity_case("t5_encoder") / "config.json"));
  auto file = lt::io::SafetensorsFile::open(parity_case("t5_encoder") / "weights.safetensors");
  std::set<std::string> file_keys;
  for (const auto& t : file->tensors()) file_keys.insert(t.name);
  CATCH_CHECK(parameter_names(*t5) == file_keys);
  CATCH_CHECK(t5->named_buffers(true).size() == 0);

  // umT5: every block has its own table; T5 only block 0.
  const auto names = parameter_names(*T5EncoderModel(tiny_config("umt5")));
  for (int i = 0; i < 3; ++i) {
    CATCH_CHECK(names.count("encoder.block." + std::to_string(i) + ".layer.0.SelfAttention.relative_attention_bias.weight"));
  }
  const auto t5_names = parameter_names(*T5EncoderModel(tiny_config("t5")));
  CATCH_CHECK(t5_names.count("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"));
  CATCH_CHECK(!t5_names.count("encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight"));
  CATCH_CHECK(names.size() == t5_names.size() + 2);
}

CATCH_TEST_CASE("T5 relative position buckets: bidirectional, exact then log-spaced, clamped", "[t5]") {
  const at::Tensor rel = torch::tensor({0, -1, 1, -7, 7, -8, 8, -20, -50, 50, -100, -127, 127, -128, -1000, 1000}, torch::kLong);
  const at::Tensor got = t5_relative_position_bucket(rel, 32, 128);
  // Keys before the query: 0..15; after it: 16..31. Exact below 8, then 8 + floor(ln(n/8)/ln(16)*8).
  const std::vector<int64_t> expected = {0, 1, 17, 7, 23, 8, 24, 10, 13, 29, 15, 15, 31, 15, 15, 31};
  CATCH_CHECK(std::vector<int64_t>(got.data_ptr<int64_t>(), got.data_ptr<int64_t>() + got.numel()) == expected);
  for (int64_t r = -300; r <= 300; ++r) {
    // Away from the log-spaced boundaries (where fp32 and double may round apart) both agree.
    const int64_t n = std::abs(r);
    if (n == 16 || n == 32 || n == 64 || n == 128) continue;
    CATCH_INFO("relative position " << r);
    CATCH_CHECK(t5_relative_position_bucket(torch::tensor({r}), 32, 128).item<int64_t>() == reference_bucket(r, 32, 128));
  }
}

CATCH_TEST_CASE("T5LayerNorm is RMS without mean or bias", "[t5]") {
  T5LayerNorm norm(4, 1e-6);
  {
    torch::NoGradGuard no_grad;
    norm->weight.copy_(torch::tensor({1.0f, 2.0f, 0.5f, -1.0f}));
  }
  const at::Tensor x = torch::tensor({{1.0f, 2.0f, 3.0f, 4.0f}});
  const double rms_x = std::sqrt((1 + 4 + 9 + 16) / 4.0 + 1e-6);
  const at::Tensor expected = torch::tensor({{1.0f, 4.0f, 1.5f, -4.0f}}) / rms_x;
  CATCH_CHECK(torch::allclose(norm(x), expected, 1e-6, 1e-7));
}

CATCH_TEST_CASE("T5 and umT5 forward match the written-out definition, with and without a mask", "[t5]") {
  const std::string model_type = GENERATE(std::string("t5"), std::string("umt5"));
  CATCH_INFO("model_type " << model_type);
  torch::NoGradGuard no_grad;
  T5EncoderModel model(tiny_config(model_type));
  randomize(*model, 7);
  model->eval();
  const at::Tensor ids = torch::randint(0, 50, {2, 11}, torch::kLong);
  at::Tensor mask = torch::ones({2, 11}, torch::kLong);
  mask.index_put_({1, torch::indexing::Slice(7)}, 0);

  CATCH_CHECK((model(ids) - reference_forward(*model, ids, std::nullopt)).abs().max().item<double>() < 1e-5);
  CATCH_CHECK((model(ids, mask) - reference_forward(*model, ids, mask)).abs().max().item<double>() < 1e-5);

  // Relative positions: a padded sequence's unmasked rows equal the unpadded sequence's outputs.
  const at::Tensor short_out = model(ids.slice(1, 0, 7).slice(0, 1, 2));
  const at::Tensor masked_rows = model(ids, mask).slice(0, 1, 2).slice(1, 0, 7);
  CATCH_CHECK((short_out - masked_rows).abs().max().item<double>() < 1e-5);
  // ...and without the mask the pads change them.
  CATCH_CHECK((short_out - model(ids).slice(0, 1, 2).slice(1, 0, 7)).abs().max().item<double>() > 1e-3);

  // umT5 reads each block's own table; T5 only block 0's.
  const at::Tensor before = model(ids);
  auto* block1 = model->encoder->block[1]->as<T5Block>();
  if (model_type == "umt5") {
    // (Not a constant shift: softmax would cancel it.)
    auto& table = block1->self_attention->SelfAttention->relative_attention_bias->weight;
    table.add_(torch::randn(table.sizes()));
    CATCH_CHECK((model(ids) - before).abs().max().item<double>() > 1e-3);
  } else {
    CATCH_CHECK(block1->self_attention->SelfAttention->relative_attention_bias.is_empty());
  }
}

CATCH_TEST_CASE("T5 attention in query chunks gives the plain values and gradients", "[t5]") {
  T5EncoderModel model(tiny_config("umt5"));
  randomize(*model, 11);
  const at::Tensor ids = torch::randint(0, 50, {2, 13}, torch::kLong);
  at::Tensor mask = torch::ones({2, 13}, torch::kLong);
  mask.index_put_({0, torch::indexing::Slice(9)}, 0);

  auto run = [&](int64_t chunk) {
    const int64_t saved = default_query_chunk();
    set_default_query_chunk(chunk);
    model->zero_grad();
    const at::Tensor out = model(ids, mask);
    out.pow(2).sum().backward();
    set_default_query_chunk(saved);
    return std::make_pair(out.detach(), model->encoder->block[2]->as<T5Block>()->self_attention->SelfAttention->q->weight.grad().clone());
  };
  const auto plain = run(0);
  const auto chunked = run(4);
  CATCH_CHECK((plain.first - chunked.first).abs().max().item<double>() < 1e-5);
  CATCH_CHECK((plain.second - chunked.second).abs().max().item<double>() < 1e-4 * std::max(1.0, plain.second.abs().max().item<double>()));
}
