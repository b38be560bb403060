// SD UNet / VAE structure, configs, attention chunking and gradient checkpointing on tiny configs.
// Numerical parity with diffusers is test_parity's job; these check the properties around it.
#include <ATen/record_function.h>
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "loratrain/models/attention.h"
#include "loratrain/models/attention_blocks.h"
#include "loratrain/models/checkpointing.h"
#include "loratrain/models/fused_attention.h"
#include "loratrain/models/packed_conv.h"
#include "loratrain/models/sd/load.h"
#include "loratrain/util/error.h"
#include "test_support.h"

using namespace lt::models;
using namespace lt::models::sd;

using lt::test::read_json;

namespace {

std::set<std::string> file_keys(const lt::io::SafetensorsFile& f) {
  std::set<std::string> keys;
  for (const auto& t : f.tensors()) keys.insert(t.name);
  return keys;
}

std::set<std::string> module_keys(torch::nn::Module& m) {
  std::set<std::string> keys;
  for (const auto& [k, t] : module_tensors(m)) keys.insert(k);
  return keys;
}

UNet2DConditionModel fixture_unet() {
  UNet2DConditionModel unet(UNetConfig::from_json(read_json(lt::test::parity_case("sd15_unet") / "config.json")));
  load_unet(*unet, *lt::io::SafetensorsFile::open(lt::test::parity_case("sd15_unet") / "weights.safetensors"));
  return unet;
}

// A LoRA-like adapter owning its own parameters outside the module tree.
class TestAdapter : public Adapter {
 public:
  TestAdapter(int64_t in, int64_t out) {
    down = torch::randn({4, in}) * 0.1;
    up = torch::randn({out, 4}) * 0.1;
    down.set_requires_grad(true);
    up.set_requires_grad(true);
  }
  torch::Tensor delta(const torch::Tensor& x) override { return torch::matmul(torch::matmul(x, down.t()), up.t()); }
  torch::Tensor down, up;
};

}  // namespace

CATCH_TEST_CASE("UNet and VAE module keys equal the diffusers state-dict keys", "[unet][vae]") {
  UNet2DConditionModel unet(UNetConfig::from_json(read_json(lt::test::parity_case("sd15_unet") / "config.json")));
  CATCH_CHECK(module_keys(*unet) == file_keys(*lt::io::SafetensorsFile::open(lt::test::parity_case("sd15_unet") / "weights.safetensors")));
  AutoencoderKL vae(VAEConfig::from_json(read_json(lt::test::parity_case("vae") / "config.json")));
  CATCH_CHECK(module_keys(*vae) == file_keys(*lt::io::SafetensorsFile::open(lt::test::parity_case("vae") / "weights.safetensors")));
}

CATCH_TEST_CASE("UNet config: JSON fields, rejection of unsupported features, detection from weights", "[unet][config]") {
  const auto j = read_json(lt::test::parity_case("sd15_unet") / "config.json");
  const UNetConfig c = UNetConfig::from_json(j);
  CATCH_CHECK(c.block_out_channels == std::vector<int64_t>{16, 24});
  CATCH_CHECK(c.attention_head_dim == std::vector<int64_t>{4, 4});
  CATCH_CHECK(c.layers_per_block == std::vector<int64_t>{2, 2});
  CATCH_CHECK(c.cross_attention_dim == std::vector<int64_t>{32, 32});
  CATCH_CHECK(c.norm_num_groups == 8);
  CATCH_CHECK(UNetConfig::from_json(c.to_json()).to_json() == c.to_json());

  auto bad = j;
  bad["class_embed_type"] = "timestep";
  CATCH_CHECK_THROWS_WITH(UNetConfig::from_json(bad), Catch::Contains("class_embed_type"));
  bad = j;
  bad["attention_head_dim"] = std::vector<int>{4, 4, 4};
  CATCH_CHECK_THROWS_WITH(UNetConfig::from_json(bad), Catch::Contains("attention_head_dim"));
  bad = j;
  bad["down_block_types"] = {"CrossAttnDownBlock2D", "SimpleCrossAttnDownBlock2D"};
  CATCH_CHECK_THROWS_WITH(UNetConfig::from_json(bad), Catch::Contains("SimpleCrossAttnDownBlock2D"));

  for (const auto& [file, prefix] : std::vector<std::pair<std::string, std::string>>{
           {"weights.safetensors", ""}, {"weights_ldm.safetensors", "model.diffusion_model."}}) {
    CATCH_INFO(file);
    UNetConfig d = UNetConfig::detect_from_weights(*lt::io::SafetensorsFile::open(lt::test::parity_case("sd15_unet") / file), prefix);
    // Head counts are not stored in weights; everything else must be read back exactly.
    d.attention_head_dim = c.attention_head_dim;
    d.norm_num_groups = c.norm_num_groups;
    d.sample_size = c.sample_size;
    CATCH_CHECK(d.to_json() == c.to_json());
  }
  // Without config.json the group count follows the channels (32 for real models).
  CATCH_CHECK(UNetConfig::detect_from_weights(*lt::io::SafetensorsFile::open(lt::test::parity_case("sd15_unet") / "weights.safetensors"), "")
                  .norm_num_groups == 8);
}

CATCH_TEST_CASE("UNet LDM single file loads the same tensors as the diffusers file", "[unet][loader]") {
  const UNetConfig c = UNetConfig::from_json(read_json(lt::test::parity_case("sd15_unet") / "config.json"));
  UNet2DConditionModel a(c), b(c);
  auto ldm = lt::io::SafetensorsFile::open(lt::test::parity_case("sd15_unet") / "weights_ldm.safetensors");
  CATCH_CHECK(detect_unet_layout(*ldm) == WeightLayout::kLdm);
  CATCH_CHECK(load_unet(*a, *lt::io::SafetensorsFile::open(lt::test::parity_case("sd15_unet") / "weights.safetensors")) == 304);
  CATCH_CHECK(load_unet(*b, *ldm) == 304);
  auto ta = module_tensors(*a), tb = module_tensors(*b);
  for (const auto& [k, t] : ta) CATCH_CHECK(torch::equal(t, tb.at(k)));
}

CATCH_TEST_CASE("UNet handles scalar timesteps and sizes that are not multiples of the up factor", "[unet]") {
  torch::NoGradGuard no_grad;
  auto unet = fixture_unet();
  torch::manual_seed(0);
  at::Tensor ctx = torch::randn({2, 5, 32});
  at::Tensor odd = torch::randn({2, 4, 9, 7});
  CATCH_CHECK(unet->forward(odd, torch::tensor(10), ctx).sizes() == odd.sizes());
  at::Tensor x = torch::randn({2, 4, 8, 8});
  at::Tensor a = unet->forward(x, torch::tensor(300), ctx);
  at::Tensor b = unet->forward(x, torch::tensor({300, 300}), ctx);
  CATCH_CHECK(torch::allclose(a, b, 0, 0));
}

CATCH_TEST_CASE("chunked (memory-efficient) attention equals plain attention in the UNet and VAE", "[unet][vae][attention]") {
  torch::NoGradGuard no_grad;
  auto unet = fixture_unet();
  torch::manual_seed(1);
  at::Tensor x = torch::randn({1, 4, 8, 8}), ctx = torch::randn({1, 7, 32}), t = torch::tensor({42});
  unet->set_attention_query_chunk(0);
  at::Tensor plain = unet->forward(x, t, ctx);
  unet->set_attention_query_chunk(5);  // 64 and 16 query rows in uneven chunks
  at::Tensor chunked = unet->forward(x, t, ctx);
  // Equal up to float32 summation order: 1e-6 relative to the output's magnitude.
  CATCH_CHECK((plain - chunked).abs().max().item<double>() <= 1e-6 * std::max(1.0, plain.abs().max().item<double>()));

  AutoencoderKL vae(VAEConfig::from_json(read_json(lt::test::parity_case("vae") / "config.json")));
  load_vae(*vae, *lt::io::SafetensorsFile::open(lt::test::parity_case("vae") / "weights.safetensors"));
  at::Tensor img = torch::rand({1, 3, 32, 32}) * 2 - 1;
  vae->set_attention_query_chunk(0);
  at::Tensor m0 = vae->encode(img).mean;
  vae->set_attention_query_chunk(7);
  at::Tensor m1 = vae->encode(img).mean;
  CATCH_CHECK((m0 - m1).abs().max().item<double>() <= 1e-6 * std::max(1.0, m0.abs().max().item<double>()));
}

CATCH_TEST_CASE("chunked attention with gradients: recomputed per chunk, same values and gradients", "[attention]") {
  torch::manual_seed(4);
  auto make = [] { return torch::randn({2, 3, 37, 8}).set_requires_grad(true); };
  at::Tensor q = make(), k = make(), v = make();
  at::Tensor weight = torch::randn({2, 3, 37, 8});
  auto grads = [&](int64_t chunk, bool fused) {
    for (auto* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
    lt::models::AttentionOptions options;
    options.query_chunk = chunk;
    options.fused_kernel = fused;
    at::Tensor out = lt::models::attention(q, k, v, options);
    (out * weight).sum().backward();
    return std::vector<at::Tensor>{out.detach(), q.grad().clone(), k.grad().clone(), v.grad().clone()};
  };
  const auto plain = grads(0, false);
  // LibTorch's products block by block, and the fused kernel where this CPU has it.
  for (const bool fused : {false, true}) {
    const auto chunked = grads(10, fused);  // 37 rows: chunks of 10, 10, 10, 7
    for (size_t i = 0; i < plain.size(); ++i) {
      CATCH_INFO("tensor " << i << (fused ? ", fused kernel" : ""));
      CATCH_CHECK((plain[i] - chunked[i]).abs().max().item<double>() <= 1e-5);
    }
    // The heads run on LibTorch's worker threads, whose autograd state is their own: the block
    // products there must not be recorded (they write into preallocated outputs).
    const int threads = at::get_num_threads();
    at::set_num_threads(2);
    const auto threaded = grads(10, fused);
    at::set_num_threads(threads);
    for (size_t i = 0; i < plain.size(); ++i) {
      CATCH_INFO("tensor " << i << " on 2 threads" << (fused ? ", fused kernel" : ""));
      CATCH_CHECK((plain[i] - threaded[i]).abs().max().item<double>() <= 1e-5);
    }
  }
}

CATCH_TEST_CASE("fused CPU attention kernel: the UNets' head widths and text lengths, values and gradients",
                "[attention]") {
  if (!lt::models::fused_attention::available()) {
    CATCH_WARN("this CPU has no AVX-512: the fused attention kernel does not run here");
    return;
  }
  // Head widths: SD1.5's 40/80/160, SDXL's 64, the tiny UNet's 4 and one of 24 (a masked last
  // vector in every tile); key lengths: 77 text tokens and 300 (column panels of 64 and a tail);
  // 300 query rows span two blocks of rows against 77 keys.
  struct Shape {
    int64_t queries, keys, dim;
  };
  for (const Shape shape : {Shape{300, 77, 40}, Shape{64, 300, 80}, Shape{50, 50, 160}, Shape{77, 77, 64},
                            Shape{40, 300, 4}, Shape{33, 21, 24}}) {
    torch::manual_seed(7);
    auto make = [&](int64_t length) { return torch::randn({2, 3, length, shape.dim}).set_requires_grad(true); };
    at::Tensor q = make(shape.queries), k = make(shape.keys), v = make(shape.keys);
    const at::Tensor weight = torch::randn({2, 3, shape.queries, shape.dim});
    auto grads = [&](bool fused) {
      for (auto* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
      lt::models::AttentionOptions options;
      options.query_chunk = fused ? 16 : 0;
      at::Tensor out = fused ? lt::models::attention(q, k, v, options)
                             : at::softmax(at::matmul(q, k.transpose(-1, -2)) / std::sqrt(double(shape.dim)), -1)
                                   .matmul(v);
      (out * weight).sum().backward();
      return std::vector<at::Tensor>{out.detach(), q.grad().clone(), k.grad().clone(), v.grad().clone()};
    };
    const auto expected = grads(false), actual = grads(true);
    for (size_t i = 0; i < expected.size(); ++i) {
      CATCH_INFO(shape.queries << " queries, " << shape.keys << " keys, heads of " << shape.dim << ": tensor " << i);
      const double magnitude = std::max(1.0, expected[i].abs().max().item<double>());
      CATCH_CHECK((expected[i] - actual[i]).abs().max().item<double>() <= 2e-5 * magnitude);
    }
  }
}

CATCH_TEST_CASE("long sequences on the CPU: the default path computes softmax(q k^T / sqrt(d)) v and its gradients",
                "[attention]") {
  // kCpuLongSequence queries: where lt::models::query_block_rows may pick blocks although no chunk is configured.
  torch::manual_seed(5);
  const int64_t rows = lt::models::kCpuLongSequence;
  auto make = [&] { return torch::randn({1, 2, rows, 8}).set_requires_grad(true); };
  at::Tensor q = make(), k = make(), v = make();
  at::Tensor weight = torch::randn({1, 2, rows, 8});
  auto grads = [&](bool by_hand) {
    for (auto* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
    at::Tensor out = by_hand ? at::softmax(at::matmul(q, k.transpose(-1, -2)) / std::sqrt(8.0), -1).matmul(v)
                             : lt::models::attention(q, k, v);
    (out * weight).sum().backward();
    return std::vector<at::Tensor>{out.detach(), q.grad().clone(), k.grad().clone(), v.grad().clone()};
  };
  const auto expected = grads(true);
  const auto actual = grads(false);
  for (size_t i = 0; i < expected.size(); ++i) {
    CATCH_INFO("tensor " << i);
    CATCH_CHECK((expected[i] - actual[i]).abs().max().item<double>() <= 1e-5 * std::max(1.0, expected[i].abs().max().item<double>()));
  }
  const bool blocks = lt::models::cpu_blocks_long_sequences();
  CATCH_CHECK(lt::models::query_block_rows(rows, rows, 0, /*cpu_speed_rule=*/false, 4) == 0);
  CATCH_CHECK(lt::models::query_block_rows(rows - 1, rows - 1, 0, /*cpu_speed_rule=*/true, 4) == 0);
  CATCH_CHECK(lt::models::query_block_rows(rows, rows, 4096, /*cpu_speed_rule=*/true, 4) ==
              (blocks ? lt::models::kCpuQueryBlock : 4096));
  // bf16 scores: blocks only from kCpuLongSequence16 (slower than the plain path below it).
  CATCH_CHECK(lt::models::query_block_rows(rows, rows, 0, /*cpu_speed_rule=*/true, 2) == 0);
  CATCH_CHECK(lt::models::query_block_rows(lt::models::kCpuLongSequence16, lt::models::kCpuLongSequence16, 0, /*cpu_speed_rule=*/true, 2) ==
              (blocks ? lt::models::kCpuQueryBlock : 0));
  // Cross-attention to 77 text tokens: by the size of the score matrix (faster in blocks from 1024
  // queries in fp32, slower at 256).
  CATCH_CHECK(lt::models::query_block_rows(1024, 77, 0, /*cpu_speed_rule=*/true, 4) == (blocks ? lt::models::kCpuQueryBlock : 0));
  CATCH_CHECK(lt::models::query_block_rows(rows, 77, 0, /*cpu_speed_rule=*/true, 4) == 0);
  // A CPU run standing for a GPU (memory.simulate_vram) keeps the configured path.
  CATCH_CHECK(lt::models::query_block_rows(4096, 4096, 1024, /*cpu_speed_rule=*/false, 4) == 1024);
}

CATCH_TEST_CASE("gradient checkpointing gives the same gradients for inputs, weights and adapters", "[unet][checkpointing]") {
  auto unet = fixture_unet();
  unet->train();
  auto* to_q = unet->down_blocks[0]->as<UNetDownBlockImpl>()->attentions[0]->as<Transformer2DModelImpl>()
                   ->transformer_blocks[0]->as<BasicTransformerBlockImpl>()->attn1->to_q.get();
  auto* conv1 = unet->up_blocks[1]->as<UNetUpBlockImpl>()->resnets[2]->as<ResnetBlock2DImpl>()->conv1.get();
  auto adapter = std::make_shared<TestAdapter>(16, 16);
  to_q->adapter = adapter;
  torch::manual_seed(2);
  at::Tensor x = torch::randn({2, 4, 8, 8}), ctx = torch::randn({2, 7, 32}), t = torch::tensor({10, 500});

  struct Grads {
    at::Tensor x, ctx, adapter_up, adapter_down;
    std::map<std::string, at::Tensor> params;
  };
  auto run = [&](bool checkpointing, bool frozen) {
    unet->set_gradient_checkpointing(checkpointing);
    unet->zero_grad();
    for (auto& p : unet->parameters()) p.set_requires_grad(!frozen);
    adapter->up.mutable_grad() = at::Tensor();
    adapter->down.mutable_grad() = at::Tensor();
    Grads g;
    at::Tensor xi = x.clone().set_requires_grad(!frozen), ci = ctx.clone().set_requires_grad(!frozen);
    at::Tensor out = unet->forward(xi, t, ci);
    (out * out).mean().backward();
    if (!frozen) {
      g.x = xi.grad().clone();
      g.ctx = ci.grad().clone();
      for (const auto& p : unet->named_parameters()) g.params[p.key()] = p.value().grad().clone();
    }
    g.adapter_up = adapter->up.grad().clone();
    g.adapter_down = adapter->down.grad().clone();
    return g;
  };
  for (bool frozen : {false, true}) {
    CATCH_INFO("frozen base, only the adapter trains: " << frozen);
    Grads off = run(false, frozen), on = run(true, frozen);
    CATCH_CHECK(off.adapter_up.abs().sum().item<double>() > 0);
    CATCH_CHECK((off.adapter_up - on.adapter_up).abs().max().item<double>() <= 1e-6);
    CATCH_CHECK((off.adapter_down - on.adapter_down).abs().max().item<double>() <= 1e-6);
    if (!frozen) {
      CATCH_CHECK((off.x - on.x).abs().max().item<double>() <= 1e-6);
      CATCH_CHECK((off.ctx - on.ctx).abs().max().item<double>() <= 1e-6);
      CATCH_REQUIRE(off.params.size() == on.params.size());
      double worst = 0;
      for (const auto& [k, gk] : off.params) worst = std::max(worst, (gk - on.params.at(k)).abs().max().item<double>());
      CATCH_CHECK(worst <= 1e-6);
      CATCH_CHECK(off.params.at("up_blocks.1.resnets.2.conv1.weight").abs().sum().item<double>() > 0);
    }
  }
  (void)conv1;
  to_q->adapter.reset();
  unet->set_gradient_checkpointing(false);
}

CATCH_TEST_CASE("checkpointing replays the forward's dropout mask in the recomputation", "[checkpointing]") {
  ResnetBlock2DOptions o;
  o.in_channels = 8;
  o.out_channels = 16;
  o.temb_channels = 12;
  o.groups = 4;
  o.dropout = 0.5;
  ResnetBlock2D block(o);
  block->train();
  at::Tensor x = torch::randn({2, 8, 6, 6}), temb = torch::randn({2, 12});
  auto grads = [&](bool on) {
    block->gradient_checkpointing = on;
    block->zero_grad();
    at::Tensor xi = x.clone().set_requires_grad(true);
    torch::manual_seed(7);
    block->forward(xi, temb).pow(2).sum().backward();
    return std::make_pair(xi.grad().clone(), block->conv1->weight.grad().clone());
  };
  auto [x_off, w_off] = grads(false);
  auto [x_on, w_on] = grads(true);
  CATCH_CHECK((x_off - x_on).abs().max().item<double>() <= 1e-6);
  CATCH_CHECK((w_off - w_on).abs().max().item<double>() <= 1e-6);
  // Outside grad mode the block runs directly (no autograd node).
  torch::NoGradGuard no_grad;
  block->gradient_checkpointing = true;
  CATCH_CHECK(!block->forward(x, temb).requires_grad());
}

CATCH_TEST_CASE("a checkpoint that keeps results hands them back in the recomputation, in order", "[checkpointing]") {
  at::Tensor w = torch::randn({5, 5}).set_requires_grad(true);
  at::Tensor x = torch::randn({3, 5});
  int computed = 0;
  // `expensive` stands for attention: computed once in the forward, taken back in the recomputation.
  auto expensive = [&](const at::Tensor& a) {
    at::Tensor kept = kept_result();
    at::Tensor r = kept.defined() ? kept : (++computed, (a * 3).detach());
    keep_for_recompute(r);
    return r;
  };
  auto fn = [&](const std::vector<at::Tensor>& in) {
    at::Tensor h = at::matmul(in[0], w);
    at::Tensor first = expensive(h.detach()), second = expensive(h.detach() + 1);
    return h * first + second;
  };
  for (bool keep : {false, true}) {
    CATCH_INFO("keep_results " << keep);
    computed = 0;
    w.mutable_grad() = at::Tensor();
    checkpoint(fn, {x}, keep).sum().backward();
    // Without keep_results the recomputation computes both again.
    CATCH_CHECK(computed == (keep ? 2 : 4));
    const at::Tensor h = at::matmul(x, w).detach();
    // d/dw sum(h * 3h + ...) with the kept factor constant: x^T (3h).
    CATCH_CHECK(torch::allclose(w.grad(), at::matmul(x.t(), 3 * h), 1e-5, 1e-6));
  }
  // Outside a keeping checkpoint nothing is kept or handed back.
  keep_for_recompute(x);
  CATCH_CHECK(!kept_result().defined());
}

CATCH_TEST_CASE("checkpointed transformer block with blocked attention: same gradients, attention kept",
                "[checkpointing]") {
  BasicTransformerBlockOptions o;
  o.dim = 16;
  o.num_attention_heads = 2;
  o.attention_head_dim = 8;
  o.cross_attention_dim = 12;
  o.query_chunk = 16;  // 64 tokens in blocks of 16 rows: BlockedAttention for both attentions
  BasicTransformerBlock block(o);
  block->train();
  auto adapter = std::make_shared<TestAdapter>(16, 16);
  block->attn1->to_v->adapter = adapter;
  torch::manual_seed(4);
  at::Tensor x = torch::randn({2, 64, 16}), ctx = torch::randn({2, 77, 12});
  auto grads = [&](bool on) {
    block->gradient_checkpointing = on;
    block->zero_grad();
    adapter->up.mutable_grad() = at::Tensor();
    adapter->down.mutable_grad() = at::Tensor();
    at::Tensor xi = x.clone().set_requires_grad(true);
    block->forward(xi, ctx).pow(2).sum().backward();
    return std::vector<at::Tensor>{xi.grad().clone(), adapter->up.grad().clone(), adapter->down.grad().clone(),
                                   block->attn2->to_k->weight.grad().clone()};
  };
  const auto off = grads(false), on = grads(true);
  for (size_t i = 0; i < off.size(); ++i) {
    CATCH_INFO("gradient " << i);
    CATCH_CHECK(off[i].abs().sum().item<double>() > 0);
    CATCH_CHECK((off[i] - on[i]).abs().max().item<double>() <= 1e-5);
  }
  block->attn1->to_v->adapter.reset();
}

namespace {
// oneDNN convolutions run on this thread (the packed path's forward and input gradient alike).
int g_convolutions = 0;
std::unique_ptr<at::ObserverContext> count_convolution(const at::RecordFunction& fn) {
  if (std::string(fn.name()) == "aten::mkldnn_convolution") ++g_convolutions;
  return nullptr;
}
}  // namespace

CATCH_TEST_CASE("checkpointed resnet on packed convolutions: same gradients, no convolution run again",
                "[checkpointing]") {
  if (!packed_convolutions_available()) {
    CATCH_WARN("this LibTorch has no oneDNN convolutions");
    return;
  }
  ResnetBlock2DOptions o;
  o.in_channels = 8;
  o.out_channels = 16;  // with a 1x1 shortcut (a matrix product, not a convolution, on this path)
  o.temb_channels = 12;
  o.groups = 4;
  ResnetBlock2D block(o);
  block->train();
  for (auto* conv : {&block->conv1, &block->conv2, &block->conv_shortcut}) {
    (*conv)->weight.set_requires_grad(false);
    (*conv)->bias.set_requires_grad(false);
  }
  torch::manual_seed(5);
  const at::Tensor x = torch::randn({2, 8, 8, 8}), temb = torch::randn({2, 12});
  auto run = [&](bool on, int& convolutions) {
    block->gradient_checkpointing = on;
    block->zero_grad();
    at::Tensor xi = x.clone().set_requires_grad(true);
    g_convolutions = 0;
    const auto handle = at::addThreadLocalCallback(at::RecordFunctionCallback(count_convolution));
    block->forward(xi, temb).pow(2).sum().backward();
    at::removeCallback(handle);
    convolutions = g_convolutions;
    return std::vector<at::Tensor>{xi.grad().clone(), block->norm1->weight.grad().clone(),
                                   block->norm2->weight.grad().clone(), block->time_emb_proj->weight.grad().clone()};
  };
  int plain_convolutions = 0, checkpointed_convolutions = 0;
  const auto off = run(false, plain_convolutions), on = run(true, checkpointed_convolutions);
  for (size_t i = 0; i < off.size(); ++i) {
    CATCH_INFO("gradient " << i);
    CATCH_CHECK(off[i].abs().sum().item<double>() > 0);
    CATCH_CHECK((off[i] - on[i]).abs().max().item<double>() <= 1e-5);
  }
  // Two forward, two input gradients; the recomputation takes the forward's outputs back.
  CATCH_CHECK(plain_convolutions == 4);
  CATCH_CHECK(checkpointed_convolutions == 4);
}

CATCH_TEST_CASE("VAE: sampling, scaling, sliced and tiled decode", "[vae]") {
  torch::NoGradGuard no_grad;
  AutoencoderKL vae(VAEConfig::from_json(read_json(lt::test::parity_case("vae") / "config.json")));
  load_vae(*vae, *lt::io::SafetensorsFile::open(lt::test::parity_case("vae") / "weights.safetensors"));
  vae->eval();
  torch::manual_seed(3);
  at::Tensor img = torch::rand({2, 3, 32, 32}) * 2 - 1;
  DiagonalGaussian d = vae->encode(img);
  CATCH_CHECK(d.mean.sizes() == std::vector<int64_t>{2, 4, 16, 16});
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(11), g2 = at::make_generator<at::CPUGeneratorImpl>(11);
  CATCH_CHECK(torch::equal(d.sample(g1), d.sample(g2)));
  at::Tensor z = d.sample(g1);
  CATCH_CHECK(torch::allclose(vae->unscale_latents(vae->scale_latents(z)), z, 1e-5, 1e-6));
  CATCH_CHECK(torch::allclose(vae->scale_latents(z), z * 0.18215));

  vae->use_slicing = true;
  at::Tensor sliced = vae->decode(z);
  DiagonalGaussian ds = vae->encode(img);
  vae->use_slicing = false;
  at::Tensor plain = vae->decode(z);
  CATCH_CHECK((sliced - plain).abs().max().item<double>() <= 1e-5);
  CATCH_CHECK((ds.mean - d.mean).abs().max().item<double>() <= 1e-5);

  // Tiles no smaller than the latent: tiled at half the larger side (8 of 16), never a no-op.
  vae->use_tiling = true;
  CATCH_CHECK(vae->tile_latent_min_size >= 16);
  at::Tensor halved = vae->decode(z);
  CATCH_CHECK(halved.sizes() == plain.sizes());
  CATCH_CHECK_FALSE(torch::equal(halved, plain));
  // 8x8 latent tiles with 2-row overlap over a 16x16 latent: same image size, seams blended.
  vae->tile_latent_min_size = 8;
  at::Tensor tiled = vae->decode(z);
  CATCH_CHECK(torch::equal(tiled, halved));
  CATCH_CHECK(tiled.sizes() == plain.sizes());
  CATCH_CHECK(torch::isfinite(tiled).all().item<bool>());
  // Encoding tiles the same way: the moments' first tile interior is that pixel tile's alone.
  DiagonalGaussian dt = vae->encode(img);
  CATCH_CHECK(dt.mean.sizes() == d.mean.sizes());
  at::Tensor first_moments = vae->quant_conv(vae->encoder(img.slice(2, 0, 16).slice(3, 0, 16)));
  CATCH_CHECK((dt.mean.slice(2, 0, 6).slice(3, 0, 6) - first_moments.slice(1, 0, 4).slice(2, 0, 6).slice(3, 0, 6))
                  .abs().max().item<double>() <= 1e-6);
  // The first tile's interior (away from any seam) is the decoder's output for that tile alone.
  at::Tensor first = vae->decoder(vae->post_quant_conv(z.slice(2, 0, 8).slice(3, 0, 8)));
  CATCH_CHECK((tiled.slice(2, 0, 12).slice(3, 0, 12) - first.slice(2, 0, 12).slice(3, 0, 12)).abs().max().item<double>() <= 1e-6);
  // Any size, e.g. a wide bucket (Flux's 736x352 at 1/8 scale): half of 46 cells is 23, rounded up to
  // 24 so that the tiles step by whole cells; the tiles join to exactly the untiled size.
  vae->tile_latent_min_size = 64;
  const at::Tensor wide = torch::rand({1, 3, 44, 92}) * 2 - 1;
  CATCH_CHECK(vae->encode(wide).mean.sizes() == std::vector<int64_t>{1, 4, 22, 46});
  CATCH_CHECK(vae->decode(torch::randn({1, 4, 22, 46})).sizes() == std::vector<int64_t>{1, 3, 44, 92});
}

// The autoencoder's training step (lt-make-demo-base --pretrain): the gradients of
// mse(decode(encode(x).mean), x) for every parameter equal diffusers' (grads.safetensors: AutoencoderKL
// 0.38.0 on torch 1.13 from the fixture's weights and in.image, in train mode), so that a VAE learning
// slowly is the recipe's doing and not a wrong backward.
CATCH_TEST_CASE("VAE reconstruction loss: gradients equal diffusers'", "[vae][gradients]") {
  AutoencoderKL vae(VAEConfig::from_json(read_json(lt::test::parity_case("vae") / "config.json")));
  load_vae(*vae, *lt::io::SafetensorsFile::open(lt::test::parity_case("vae") / "weights.safetensors"));
  vae->train();
  const at::Tensor x = lt::io::SafetensorsFile::open(lt::test::parity_case("vae") / "io.safetensors")->load("in.image");
  const auto expected = lt::io::SafetensorsFile::open(lt::test::parity_case("vae") / "grads.safetensors");
  const at::Tensor loss = torch::mse_loss(vae->decode(vae->encode(x).mean), x);
  loss.backward();
  CATCH_CHECK(loss.item<double>() == Approx(expected->load("out.loss").item<double>()).epsilon(1e-5));
  size_t compared = 0;
  for (const auto& p : vae->named_parameters(true)) {
    CATCH_INFO(p.key());
    const at::Tensor want = expected->load("grad." + p.key());
    const at::Tensor got = p.value().grad();
    CATCH_REQUIRE(got.defined());
    // Relative to the tensor's largest gradient (float32 sums in another order), with a floor: the key
    // projections' biases have no gradient in exact arithmetic (softmax ignores a shift common to all
    // keys), so both sides hold rounding noise of about 1e-9 there, which depends on the attention
    // kernel's summation order.
    const double scale = std::max(want.abs().max().item<double>(), 1e-5);
    CATCH_CHECK((got - want).abs().max().item<double>() / scale < 1e-3);
    ++compared;
  }
  CATCH_CHECK(compared + 1 == expected->tensors().size());
}
