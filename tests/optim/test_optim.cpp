// Optimizers, LR schedules and gradient clipping: reference semantics, 8-bit tracking and memory,
// all-or-nothing steps and bit-identical state round trips.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>

#include "loratrain/io/safetensors.h"
#include "loratrain/optim/lr_schedule.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

using namespace lt::optim;
using lt::test::scratch_dir;

namespace {

// A least-squares problem y = X W*: the loss and gradient of W for the fixed data set.
struct Regression {
  torch::Tensor x, y;
  Regression(int64_t in, int64_t out, int64_t samples, uint64_t seed) {
    torch::manual_seed(seed);
    x = torch::randn({samples, in});
    y = x.matmul(torch::randn({in, out}) * 0.5);
  }
  torch::Tensor loss(const torch::Tensor& w) const { return (x.matmul(w) - y).pow(2).mean(); }
  double step_grad(torch::Tensor& w) const {
    w.mutable_grad() = torch::Tensor();
    torch::Tensor l = loss(w);
    l.backward();
    return l.item<double>();
  }
};

torch::Tensor make_param(std::vector<int64_t> shape, uint64_t seed) {
  torch::manual_seed(seed);
  return (torch::randn(shape) * 0.1).requires_grad_(true);
}

bool bit_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() && torch::equal(a, b);
}

}  // namespace

CATCH_TEST_CASE("AdamW matches torch::optim::AdamW bit for bit", "[optim]") {
  Regression problem(16, 8, 64, 1);
  torch::Tensor a = make_param({16, 8}, 2);
  torch::Tensor b = a.detach().clone().requires_grad_(true);
  AdamW ours({a}, AdamWOptions{0.9, 0.99, 1e-6, 0.05});
  torch::optim::AdamW reference({b}, torch::optim::AdamWOptions(3e-3).betas({0.9, 0.99}).eps(1e-6).weight_decay(0.05));
  for (int step = 0; step < 25; ++step) {
    problem.step_grad(a);
    problem.step_grad(b);
    ours.step(3e-3);
    reference.step();
  }
  CATCH_CHECK(bit_equal(a.detach(), b.detach()));
  CATCH_CHECK(ours.steps_taken() == 25);
}

CATCH_TEST_CASE("the dynamic quantisation maps are bitsandbytes'", "[optim][8bit]") {
  torch::Tensor s = create_dynamic_map(true);
  torch::Tensor u = create_dynamic_map(false);
  CATCH_REQUIRE(s.numel() == 256);
  CATCH_REQUIRE(u.numel() == 256);
  CATCH_CHECK(torch::equal(s, std::get<0>(s.sort())));
  CATCH_CHECK(s.max().item<float>() == 1.0f);
  // The signed map has no -1: its most negative entry is the last fraction midpoint.
  CATCH_CHECK(s.min().item<float>() == Approx(-(0.1 + 0.9 * 63.5 / 64)).epsilon(1e-6));
  CATCH_CHECK(u.min().item<float>() == 0.0f);
  // Smallest non-zero magnitudes: 0.55e-6 (signed, one midpoint of [0.1, 1]) and 0.325e-6 (unsigned).
  CATCH_CHECK(s.abs().masked_select(s != 0).min().item<float>() == Approx(5.5e-7).epsilon(1e-5));
  CATCH_CHECK(u.masked_select(u != 0).min().item<float>() == Approx(3.25e-7).epsilon(1e-5));
  CATCH_CHECK((s == 0).sum().item<int64_t>() == 1);
  CATCH_CHECK((s < 0).sum().item<int64_t>() == 127);
}

CATCH_TEST_CASE("block-wise quantisation round trip", "[optim][8bit]") {
  torch::manual_seed(3);
  torch::Tensor x = torch::randn({1000}) * torch::linspace(0.01, 10, 1000);  // 4 blocks, last one partial
  torch::Tensor qmap = create_dynamic_map(true);
  auto [codes, absmax] = quantize_blockwise(x, qmap, 256);
  CATCH_CHECK(codes.scalar_type() == torch::kByte);
  CATCH_CHECK(codes.sizes() == x.sizes());
  CATCH_REQUIRE(absmax.numel() == 4);
  CATCH_CHECK(absmax[3].item<float>() == x.slice(0, 768).abs().max().item<float>());
  torch::Tensor back = dequantize_blockwise(codes, absmax, qmap, 256);
  // Each value lands on its nearest map entry: error at most half the local map spacing (< 4% of absmax).
  torch::Tensor err = (back - x).abs().view(-1);
  torch::Tensor scale = absmax.repeat_interleave(256).slice(0, 0, 1000);
  CATCH_CHECK((err / scale).max().item<float>() < 0.04f);
  // Zero blocks stay exactly zero.
  auto [zc, za] = quantize_blockwise(torch::zeros({300}), qmap, 256);
  CATCH_CHECK(dequantize_blockwise(zc, za, qmap, 256).abs().max().item<float>() == 0.0f);
}

CATCH_TEST_CASE("AdamW8bit tracks fp32 AdamW and stores a quarter of the state", "[optim][8bit]") {
  // W is 128 x 64 = 8192 elements: above min_8bit_size, so both moments are 8-bit.
  Regression problem(128, 64, 256, 4);
  torch::Tensor w32 = make_param({128, 64}, 5);
  torch::Tensor w8 = w32.detach().clone().requires_grad_(true);
  const double initial = problem.loss(w32).item<double>();
  AdamW fp32({w32});
  AdamW8bit q8({w8});
  const double lr = 1e-2;
  double loss32 = 0, loss8 = 0;
  for (int step = 0; step < 100; ++step) {
    loss32 = problem.step_grad(w32);
    loss8 = problem.step_grad(w8);
    fp32.step(lr);
    q8.step(lr);
    // The first update reads no stored state (only fresh fp32 moments), so it is exact.
    if (step == 0) CATCH_CHECK(bit_equal(w8.detach(), w32.detach()));
  }
  // Stated tolerance: after 100 steps (loss down ~25x) the 8-bit weights stay within 5% (relative
  // L2) of the fp32 run's and the final losses within 5% of each other (measured: 3.8% and 1.6%).
  const double rel = ((w8 - w32).norm() / w32.norm()).item<double>();
  CATCH_INFO("rel " << rel << " loss32 " << loss32 << " loss8 " << loss8 << " initial " << initial);
  CATCH_CHECK(rel < 0.05);
  CATCH_CHECK(loss8 < 0.1 * initial);
  CATCH_CHECK(std::abs(loss8 - loss32) < 0.05 * loss32);
  // The trajectories differ: the states really are quantised.
  CATCH_CHECK(rel > 0.0);

  // Memory: for a large tensor, 8-bit states are 2 bytes + 8/256 per value vs 8 bytes in fp32.
  torch::Tensor big32 = make_param({512, 512}, 6);
  torch::Tensor big8 = big32.detach().clone().requires_grad_(true);
  big32.mutable_grad() = torch::randn({512, 512});
  big8.mutable_grad() = big32.grad().clone();
  AdamW a({big32});
  AdamW8bit b({big8});
  a.step(1e-3);
  b.step(1e-3);
  const double ratio = static_cast<double>(b.state_bytes()) / static_cast<double>(a.state_bytes());
  CATCH_CHECK(ratio > 0.24);
  CATCH_CHECK(ratio < 0.27);
}

CATCH_TEST_CASE("AdamW8bit keeps fp32 states for small tensors", "[optim][8bit]") {
  torch::Tensor small = make_param({4, 1000}, 7);  // 4000 < 4096
  torch::Tensor large = make_param({4, 1024}, 8);  // 4096
  small.mutable_grad() = torch::randn({4, 1000});
  large.mutable_grad() = torch::randn({4, 1024});
  AdamW8bit opt({small, large});
  opt.step(1e-3);
  std::map<std::string, torch::Tensor> st;
  for (auto& [k, v] : opt.state_dict()) st[k] = v;
  CATCH_CHECK(st.at("0.exp_avg").scalar_type() == torch::kFloat);
  CATCH_CHECK(st.count("0.state1") == 0);
  CATCH_CHECK(st.at("1.state1").scalar_type() == torch::kByte);
  CATCH_CHECK(st.at("1.absmax1").numel() == 16);
  CATCH_CHECK(st.at("1.state2").scalar_type() == torch::kByte);
}

CATCH_TEST_CASE("Adafactor: factored update of a rank-1 gradient is lr * sign(g)", "[optim][adafactor]") {
  // With relative_step and scale_parameter off, step 1 has beta2t = 0, so V = row (x) col / mean(row)
  // reproduces g^2 exactly when g is an outer product; the update is g/|g| with RMS 1 (unclipped).
  torch::Tensor p = torch::zeros({3, 4}).requires_grad_(true);
  torch::Tensor g = torch::tensor({1.0f, -2.0f, 0.5f}).unsqueeze(1) * torch::tensor({3.0f, 1.0f, -1.0f, 2.0f}).unsqueeze(0);
  p.mutable_grad() = g.clone();
  Adafactor opt({p});
  opt.step(0.1);
  CATCH_CHECK(torch::allclose(p.detach(), -0.1 * g.sign(), 1e-5, 1e-6));
  std::map<std::string, torch::Tensor> st;
  for (auto& [k, v] : opt.state_dict()) st[k] = v;
  CATCH_CHECK(st.at("0.exp_avg_sq_row").sizes() == torch::IntArrayRef({3}));
  CATCH_CHECK(st.at("0.exp_avg_sq_col").sizes() == torch::IntArrayRef({4}));
  CATCH_CHECK(st.count("0.exp_avg") == 0);  // beta1 None

  // Clipping: a 1-D parameter whose gradient has one huge entry still moves by an RMS of at most lr.
  torch::Tensor b = torch::zeros({4}).requires_grad_(true);
  b.mutable_grad() = torch::tensor({1.0f, 1.0f, 1.0f, 1.0f});
  Adafactor opt_b({b});
  opt_b.step(0.1);
  CATCH_CHECK(torch::allclose(b.detach(), torch::full({4}, -0.1f), 1e-5, 1e-6));
}

CATCH_TEST_CASE("Adafactor learns the regression problem", "[optim][adafactor]") {
  Regression problem(32, 16, 128, 9);
  torch::Tensor w = make_param({32, 16}, 10);
  const double initial = problem.loss(w).item<double>();
  Adafactor opt({w}, AdafactorOptions{});
  double loss = 0;
  for (int step = 0; step < 100; ++step) {
    loss = problem.step_grad(w);
    opt.step(1e-2);
  }
  CATCH_CHECK(loss < 0.2 * initial);
}

CATCH_TEST_CASE("a failure inside step() leaves parameters and state untouched", "[optim]") {
  auto check = [](const std::string& name) {
    CATCH_INFO(name);
    torch::Tensor p0 = make_param({80, 80}, 11);  // 6400 elements: 8-bit states for adamw8bit
    torch::Tensor p1 = make_param({8}, 12);
    auto opt = make_optimizer(name, {p0, p1});
    p0.mutable_grad() = torch::randn({80, 80});
    p1.mutable_grad() = torch::randn({8});
    opt->step(1e-2);
    const torch::Tensor before0 = p0.detach().clone();
    const torch::Tensor before1 = p1.detach().clone();
    std::vector<std::pair<std::string, torch::Tensor>> state_before;
    for (auto& [k, v] : opt->state_dict()) state_before.emplace_back(k, v.clone());
    p0.mutable_grad() = torch::randn({80, 80});
    p1.mutable_grad() = torch::randn({8});
    opt->before_param_update = [](size_t i) {
      if (i == 1) throw std::runtime_error("simulated failure after parameter 0 was computed");
    };
    CATCH_CHECK_THROWS(opt->step(1e-2));
    CATCH_CHECK(bit_equal(p0.detach(), before0));
    CATCH_CHECK(bit_equal(p1.detach(), before1));
    auto state_after = opt->state_dict();
    CATCH_REQUIRE(state_after.size() == state_before.size());
    for (size_t i = 0; i < state_after.size(); ++i) {
      CATCH_CHECK(state_after[i].first == state_before[i].first);
      CATCH_CHECK(bit_equal(state_after[i].second, state_before[i].second));
    }
    CATCH_CHECK(opt->steps_taken() == 1);
    // The retry of the same step succeeds and changes both parameters.
    opt->before_param_update = nullptr;
    opt->step(1e-2);
    CATCH_CHECK_FALSE(bit_equal(p0.detach(), before0));
    CATCH_CHECK_FALSE(bit_equal(p1.detach(), before1));
  };
  check("adamw");
  check("adamw8bit");
  check("adafactor");
}

CATCH_TEST_CASE("optimizer state survives a safetensors round trip bit-identically", "[optim][resume]") {
  for (std::string name : {"adamw", "adamw8bit", "adafactor"}) {
    CATCH_INFO(name);
    Regression problem(96, 64, 128, 13);  // 6144 elements: 8-bit path
    torch::Tensor a = make_param({96, 64}, 14);
    auto opt_a = make_optimizer(name, {a}, name == "adafactor" ? OptimizerParams{{"beta1", {0.9}}} : OptimizerParams{});
    for (int i = 0; i < 5; ++i) {
      problem.step_grad(a);
      opt_a->step(1e-2);
    }
    const auto path = scratch_dir("optim") / (name + "_state.safetensors");
    lt::io::save_safetensors(path, opt_a->state_dict());
    torch::Tensor b = a.detach().clone().requires_grad_(true);
    auto opt_b = make_optimizer(name, {b}, name == "adafactor" ? OptimizerParams{{"beta1", {0.9}}} : OptimizerParams{});
    auto file = lt::io::SafetensorsFile::open(path);
    NamedTensors loaded;
    for (const auto& info : file->tensors()) loaded.emplace_back(info.name, file->load(info.name));
    opt_b->load_state_dict(loaded);
    CATCH_CHECK(opt_b->steps_taken() == 5);
    for (int i = 0; i < 5; ++i) {
      problem.step_grad(a);
      problem.step_grad(b);
      opt_a->step(1e-2);
      opt_b->step(1e-2);
    }
    CATCH_CHECK(bit_equal(a.detach(), b.detach()));
  }
}

CATCH_TEST_CASE("load_state_dict rejects mismatched state and changes nothing", "[optim][resume]") {
  torch::Tensor a = make_param({6, 5}, 15);
  a.mutable_grad() = torch::randn({6, 5});
  AdamW opt({a});
  opt.step(1e-2);
  NamedTensors bad = opt.state_dict();
  for (auto& [k, v] : bad) {
    if (k == "0.exp_avg") v = torch::zeros({5, 6});
  }
  bad.emplace_back("7.exp_avg", torch::zeros({1}));
  const torch::Tensor before = opt.state_dict()[1].second.clone();
  try {
    opt.load_state_dict(bad);
    CATCH_FAIL("expected an InputError");
  } catch (const lt::InputError& e) {
    const std::string msg = e.what();
    CATCH_CHECK(msg.find("'exp_avg' has shape") != std::string::npos);
    CATCH_CHECK(msg.find("unexpected entry '7.exp_avg'") != std::string::npos);
  }
  CATCH_CHECK(bit_equal(opt.state_dict()[1].second, before));
}

CATCH_TEST_CASE("make_optimizer reads AI Toolkit names and optimizer_params", "[optim]") {
  torch::Tensor p = make_param({3}, 16);
  auto opt = make_optimizer("AdamW8bit", {p}, {{"betas", {0.9, 0.99}}, {"weight_decay", {0.0}}});
  CATCH_CHECK(std::string(opt->name()) == "adamw8bit");
  auto* typed = dynamic_cast<AdamW8bit*>(opt.get());
  CATCH_REQUIRE(typed != nullptr);
  CATCH_CHECK(typed->options().beta2 == 0.99);
  CATCH_CHECK(typed->options().eps == 1e-6);  // AI Toolkit's Adam-family eps
  CATCH_CHECK_THROWS_WITH(make_optimizer("adamw9bit", {p}), Catch::Contains("did you mean 'adamw8bit'"));
  CATCH_CHECK_THROWS_WITH(make_optimizer("adamw", {p}, {{"weight_decy", {0.1}}}),
                          Catch::Contains("did you mean 'weight_decay'"));
  CATCH_CHECK_THROWS_AS(make_optimizer("adamw", {p}, {{"betas", {0.9}}}), lt::InputError);
}

CATCH_TEST_CASE("LR schedules follow diffusers' formulas", "[optim][schedule]") {
  LRSchedule s;
  s.lr = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.type = LRSchedulerType::Constant;
  CATCH_CHECK(s.lr_at(0) == 1.0);
  s.type = LRSchedulerType::ConstantWithWarmup;
  CATCH_CHECK(s.lr_at(0) == 0.0);
  CATCH_CHECK(s.lr_at(5) == Approx(0.5));
  CATCH_CHECK(s.lr_at(10) == 1.0);
  CATCH_CHECK(s.lr_at(1000) == 1.0);
  s.type = LRSchedulerType::Linear;
  CATCH_CHECK(s.lr_at(5) == Approx(0.5));
  CATCH_CHECK(s.lr_at(10) == Approx(1.0));
  CATCH_CHECK(s.lr_at(60) == Approx(0.5));
  CATCH_CHECK(s.lr_at(110) == 0.0);
  CATCH_CHECK(s.lr_at(200) == 0.0);
  s.type = LRSchedulerType::Cosine;
  CATCH_CHECK(s.lr_at(10) == Approx(1.0));
  CATCH_CHECK(s.lr_at(60) == Approx(0.5));
  CATCH_CHECK(s.lr_at(35) == Approx(0.5 * (1 + std::cos(M_PI * 0.25))));
  CATCH_CHECK(s.lr_at(110) == Approx(0.0).margin(1e-12));
  s.type = LRSchedulerType::CosineWithRestarts;
  s.num_cycles = 2;
  CATCH_CHECK(s.lr_at(59) < 0.01);
  CATCH_CHECK(s.lr_at(60) == Approx(1.0));  // restart half way
  CATCH_CHECK(s.lr_at(110) == 0.0);
  CATCH_CHECK(parse_lr_scheduler("cosine_with_restarts") == LRSchedulerType::CosineWithRestarts);
  CATCH_CHECK_THROWS_WITH(parse_lr_scheduler("cosin"), Catch::Contains("did you mean 'cosine'"));
}

CATCH_TEST_CASE("clip_grad_norm clips by the global 2-norm", "[optim]") {
  torch::Tensor a = torch::zeros({1}).requires_grad_(true);
  torch::Tensor b = torch::zeros({1}).requires_grad_(true);
  torch::Tensor c = torch::zeros({1}).requires_grad_(true);  // no grad: ignored
  a.mutable_grad() = torch::tensor({3.0f});
  b.mutable_grad() = torch::tensor({4.0f});
  CATCH_CHECK(clip_grad_norm({a, b, c}, 0.0) == Approx(5.0));  // 0 = measure only
  CATCH_CHECK(a.grad().item<float>() == 3.0f);
  CATCH_CHECK(clip_grad_norm({a, b, c}, 10.0) == Approx(5.0));  // under the limit: untouched
  CATCH_CHECK(a.grad().item<float>() == 3.0f);
  CATCH_CHECK(clip_grad_norm({a, b, c}, 1.0) == Approx(5.0));
  CATCH_CHECK(a.grad().item<float>() == Approx(0.6).epsilon(1e-5));
  CATCH_CHECK(b.grad().item<float>() == Approx(0.8).epsilon(1e-5));
  b.mutable_grad() = torch::tensor({std::nanf("")});
  CATCH_CHECK(std::isnan(clip_grad_norm({a, b}, 1.0)));
  CATCH_CHECK(a.grad().item<float>() == Approx(0.6).epsilon(1e-5));  // nothing scaled by nan
}

CATCH_TEST_CASE("per-parameter lr scales", "[optim]") {
  torch::Tensor a = torch::zeros({1}).requires_grad_(true);
  torch::Tensor b = torch::zeros({1}).requires_grad_(true);
  a.mutable_grad() = torch::ones({1});
  b.mutable_grad() = torch::ones({1});
  AdamW opt({a, b}, AdamWOptions{0.9, 0.999, 1e-8, 0.0});
  opt.set_lr_scales({1.0, 0.5});
  opt.step(0.1);  // Adam's first step moves by lr * sign(g)
  CATCH_CHECK(a.item<float>() == Approx(-0.1));
  CATCH_CHECK(b.item<float>() == Approx(-0.05));
  CATCH_CHECK_THROWS(opt.set_lr_scales({1.0}));
}
