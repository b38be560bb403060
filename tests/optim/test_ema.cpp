// The adapter EMA: AI Toolkit's update rule to the bit, the average swapped in and out without
// disturbing the live weights, and the resumable state.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstring>

#include "loratrain/io/safetensors.h"
#include "loratrain/optim/ema.h"
#include "loratrain/optim/optimizer.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

using namespace lt::optim;

namespace {

// Same shape, dtype and bytes (so -0.0 and 0.0 differ, unlike ==).
bool same_bits(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  const torch::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

torch::Tensor leaf(std::vector<float> values) {
  return torch::tensor(values, torch::kFloat).requires_grad_(true);
}

// What an optimizer step does to a parameter: an in-place write under no_grad.
void set_weights(torch::Tensor& p, const torch::Tensor& values) {
  torch::NoGradGuard no_grad;
  p.copy_(values);
}

}  // namespace

CATCH_TEST_CASE("EMA update: values by hand, from the first step, no warm-up", "[optim][ema]") {
  // decay 0.75: 1 - decay = 0.25 is exact, so every value below is exact in fp32.
  torch::Tensor p = leaf({1.0f, -2.0f});
  AdapterEMA ema({p}, EMAOptions{0.75});
  CATCH_CHECK(same_bits(ema.average()[0], torch::tensor({1.0f, -2.0f})));  // starts at the weights
  set_weights(p, torch::tensor({3.0f, 2.0f}));
  ema.update();  // tmp = (avg - w) * 0.25 = [-0.5, -1]; avg -= tmp
  CATCH_CHECK(same_bits(ema.average()[0], torch::tensor({1.5f, -1.0f})));
  ema.update();  // tmp = [-0.375, -0.75]
  CATCH_CHECK(same_bits(ema.average()[0], torch::tensor({1.875f, -0.25f})));
  CATCH_CHECK(same_bits(p.detach(), torch::tensor({3.0f, 2.0f})));  // the live weights are untouched
  CATCH_CHECK(ema.updates() == 2);

  // decay 0 follows the weights, decay 1 never moves.
  torch::Tensor q = leaf({4.0f});
  AdapterEMA follow({q}, EMAOptions{0.0}), frozen({q}, EMAOptions{1.0});
  set_weights(q, torch::tensor({7.0f}));
  follow.update();
  frozen.update();
  CATCH_CHECK(follow.average()[0].item<float>() == 7.0f);
  CATCH_CHECK(frozen.average()[0].item<float>() == 4.0f);
}

CATCH_TEST_CASE("EMA update matches toolkit/ema.py's fp32 arithmetic bit for bit", "[optim][ema]") {
  // toolkit/ema.py: tmp = shadow - param; tmp.mul_(1 - decay); shadow.sub_(tmp), all in fp32
  // (the Python float 1 - decay rounded to fp32 by the kernel). Written out per element here.
  torch::manual_seed(3);
  torch::Tensor a = (torch::randn({64, 8}) * 0.1).requires_grad_(true);
  torch::Tensor b = (torch::randn({8}) * 0.1).requires_grad_(true);
  const double decay = 0.99;
  AdapterEMA ema({a, b}, EMAOptions{decay});
  std::vector<std::vector<float>> expected;
  for (const auto& t : {a, b}) {
    const torch::Tensor c = t.detach().contiguous();
    expected.emplace_back(c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  const float one_minus_decay = static_cast<float>(1.0 - decay);
  for (int step = 0; step < 20; ++step) {
    set_weights(a, a.detach() + torch::randn({64, 8}) * 0.01);
    set_weights(b, b.detach() + torch::randn({8}) * 0.01);
    ema.update();
    int which = 0;
    for (const auto& t : {a, b}) {
      const torch::Tensor w = t.detach().contiguous();
      const float* wp = w.data_ptr<float>();
      for (size_t k = 0; k < expected[which].size(); ++k) {
        float tmp = expected[which][k] - wp[k];
        tmp = tmp * one_minus_decay;
        expected[which][k] = expected[which][k] - tmp;
      }
      ++which;
    }
  }
  CATCH_CHECK(same_bits(ema.average()[0], torch::tensor(expected[0]).reshape({64, 8})));
  CATCH_CHECK(same_bits(ema.average()[1], torch::tensor(expected[1])));
  CATCH_CHECK_FALSE(same_bits(ema.average()[0], a.detach()));  // it lags the weights
}

CATCH_TEST_CASE("EMA feedback and param_multiplier change the live weights as AI Toolkit does", "[optim][ema]") {
  torch::Tensor p = leaf({1.0f});
  AdapterEMA ema({p}, EMAOptions{0.75, /*use_feedback=*/true, /*param_multiplier=*/0.5});
  set_weights(p, torch::tensor({3.0f}));
  ema.update();
  // tmp = (1 - 3) * 0.25 = -0.5; average = 1.5; weights = (3 + 10 * -0.5) * 0.5 = -1
  CATCH_CHECK(ema.average()[0].item<float>() == 1.5f);
  CATCH_CHECK(p.item<float>() == -1.0f);
  CATCH_CHECK(p.requires_grad());
}

CATCH_TEST_CASE("the average goes in for saving and previews and the live weights come back bit-identical",
                "[optim][ema]") {
  torch::manual_seed(5);
  torch::Tensor a = (torch::randn({16, 4}) * 0.1).requires_grad_(true);
  torch::Tensor b = torch::randn({4}).to(torch::kBFloat16).requires_grad_(true);  // a non-fp32 adapter
  {
    torch::NoGradGuard no_grad;
    a.view(-1)[0] = -0.0f;  // a value == cannot tell from 0.0
  }
  AdapterEMA ema({a, b}, EMAOptions{0.9});
  for (int i = 0; i < 3; ++i) {
    set_weights(a, a.detach() * 1.1);
    set_weights(b, b.detach() * 1.1);
    ema.update();
  }
  const torch::Tensor a_live = a.detach().clone(), b_live = b.detach().clone();
  void* const a_storage = a.data_ptr();
  {
    AdapterEMA::AverageScope scope(ema);
    CATCH_CHECK(ema.average_in_place());
    CATCH_CHECK(same_bits(a.detach(), ema.average()[0]));
    CATCH_CHECK(same_bits(b.detach(), ema.average()[1].to(torch::kBFloat16)));  // rounded into bf16
    CATCH_CHECK(a.data_ptr() == a_storage);  // the same tensors the optimizer holds
    {
      AdapterEMA::AverageScope nested(ema);  // already in place: does nothing
      CATCH_CHECK(ema.average_in_place());
    }
    CATCH_CHECK(ema.average_in_place());
    CATCH_CHECK_THROWS(ema.update());  // training never runs on the average
  }
  CATCH_CHECK_FALSE(ema.average_in_place());
  CATCH_CHECK(same_bits(a.detach(), a_live));
  CATCH_CHECK(same_bits(b.detach(), b_live));
  CATCH_CHECK(std::signbit(a.detach().view(-1)[0].item<float>()));
  CATCH_CHECK(a.requires_grad());

  // The plain functions do the same; misuse is caught.
  ema.swap_in_average();
  CATCH_CHECK_THROWS(ema.swap_in_average());
  ema.restore_live();
  CATCH_CHECK_THROWS(ema.restore_live());
  CATCH_CHECK(same_bits(a.detach(), a_live));
  CATCH_CHECK(ema.state_bytes() == (64 + 4) * 4);  // one fp32 copy of the adapter
}

CATCH_TEST_CASE("EMA state survives a safetensors round trip and training continues identically",
                "[optim][ema][resume]") {
  torch::manual_seed(7);
  torch::Tensor a = (torch::randn({32, 8}) * 0.1).requires_grad_(true);
  torch::Tensor x = torch::randn({64, 32}), y = torch::randn({64, 8});
  auto train_step = [&](torch::Tensor& w, AdamW& opt, AdapterEMA& ema) {
    w.mutable_grad() = torch::Tensor();
    (x.matmul(w) - y).pow(2).mean().backward();
    opt.step(1e-2);
    ema.update();
  };
  AdamW opt_a({a});
  AdapterEMA ema_a({a}, EMAOptions{0.95});
  for (int i = 0; i < 5; ++i) train_step(a, opt_a, ema_a);

  const auto path = lt::test::scratch_dir("optim_ema") / "ema_state.safetensors";
  lt::io::save_safetensors(path, ema_a.state_dict());
  torch::Tensor b = a.detach().clone().requires_grad_(true);  // the live weights come from the adapter file
  AdamW opt_b({b});
  opt_b.load_state_dict(opt_a.state_dict());
  AdapterEMA ema_b({b}, EMAOptions{0.95});
  auto file = lt::io::SafetensorsFile::open(path);
  NamedTensors loaded;
  for (const auto& info : file->tensors()) loaded.emplace_back(info.name, file->load(info.name));
  ema_b.load_state_dict(loaded);
  CATCH_CHECK(ema_b.updates() == 5);
  CATCH_CHECK(same_bits(ema_b.average()[0], ema_a.average()[0]));

  for (int i = 0; i < 5; ++i) {
    train_step(a, opt_a, ema_a);
    train_step(b, opt_b, ema_b);
  }
  CATCH_CHECK(same_bits(a.detach(), b.detach()));
  CATCH_CHECK(same_bits(ema_a.average()[0], ema_b.average()[0]));
  CATCH_CHECK_FALSE(same_bits(ema_a.average()[0], a.detach()));  // the average lags the weights
}

CATCH_TEST_CASE("EMA load_state_dict rejects a state that does not match and changes nothing",
                "[optim][ema][resume]") {
  torch::Tensor a = leaf({1.0f, 2.0f}), b = leaf({3.0f});
  AdapterEMA ema({a, b}, EMAOptions{0.5});
  const torch::Tensor before = ema.average()[0].clone();
  NamedTensors bad = {{"0.average", torch::zeros({3})},
                      {"5.average", torch::zeros({1})},
                      {"updates", torch::scalar_tensor(2.0)}};
  try {
    ema.load_state_dict(bad);
    CATCH_FAIL("expected an InputError");
  } catch (const lt::InputError& e) {
    const std::string msg = e.what();
    CATCH_INFO(msg);
    CATCH_CHECK(msg.find("'0.average' is [3] Float, expected [2] Float") != std::string::npos);
    CATCH_CHECK(msg.find("unexpected entry '5.average'") != std::string::npos);
    CATCH_CHECK(msg.find("missing '1.average'") != std::string::npos);
    CATCH_CHECK(msg.find("'updates' is not one int64 value") != std::string::npos);
  }
  CATCH_CHECK(same_bits(ema.average()[0], before));
  CATCH_CHECK(ema.updates() == 0);
}
