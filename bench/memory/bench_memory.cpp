// Prints ratios measured in one run: allocator overhead, guard overhead per step, OOM-to-retry time.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>

#include "loratrain/memory/budget_allocator.h"
#include "loratrain/memory/guard.h"

using namespace lt::memory;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double alloc_loop(int n, int64_t bytes) {
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    auto t = torch::empty({bytes}, torch::kUInt8);
  }
  return seconds_since(t0) / n;
}

// A small MLP training step: forward, backward, SGD update.
struct Mlp {
  torch::Tensor w1 = torch::randn({512, 1024}).requires_grad_();
  torch::Tensor w2 = torch::randn({1024, 512}).requires_grad_();
  void step(const torch::Tensor& x) {
    auto loss = torch::relu(x.matmul(w1)).matmul(w2).pow(2).mean();
    loss.backward();
    torch::NoGradGuard g;
    w1.sub_(w1.grad() * 1e-4);
    w2.sub_(w2.grad() * 1e-4);
    w1.mutable_grad().zero_();
    w2.mutable_grad().zero_();
  }
};

}  // namespace

int main(int argc, char** argv) {
  // --tuned: glibc malloc tuned as the trainer does at start (tune_host_allocator).
  if (argc > 1 && std::string(argv[1]) == "--tuned") std::printf("tune_host_allocator: %d\n", tune_host_allocator());
  torch::manual_seed(0);
  const int kAllocs = 200000;
  const double plain_small = alloc_loop(kAllocs, 4096);
  const double plain_big = alloc_loop(2000, 8 << 20);
  double counted_small = 0, counted_big = 0;
  {
    CpuMemory mem(int64_t(8) << 30);
    counted_small = alloc_loop(kAllocs, 4096);
    counted_big = alloc_loop(2000, 8 << 20);
  }
  std::printf("allocator: 4 KiB alloc+free %.0f ns plain, %.0f ns budgeted (x%.2f)\n", plain_small * 1e9,
              counted_small * 1e9, counted_small / plain_small);
  std::printf("allocator: 8 MiB alloc+free %.0f ns plain, %.0f ns budgeted (x%.2f)\n", plain_big * 1e9,
              counted_big * 1e9, counted_big / plain_big);

  CpuMemory mem(int64_t(8) << 30);
  Mlp mlp;
  const auto x = torch::randn({256, 512});
  const int kSteps = 60;
  for (int i = 0; i < 5; ++i) mlp.step(x);  // warm-up
  auto t0 = Clock::now();
  for (int i = 0; i < kSteps; ++i) mlp.step(x);
  const double bare = seconds_since(t0) / kSteps;

  MemorySettings s;
  s.resolutions = {512};
  OomGuard guard(mem, {}, s);
  t0 = Clock::now();
  for (int64_t i = 1; i <= kSteps; ++i) {
    auto scope = guard.enter(Phase::train_step, {i, 512, 512, 1, 1, 512});
    mlp.step(x);
    guard.step_completed(i);
  }
  const double guarded = seconds_since(t0) / kSteps;
  // The guard's own cost, isolated: enter/exit + step bookkeeping with an empty body.
  t0 = Clock::now();
  const int kEmpty = 100000;
  for (int64_t i = 1; i <= kEmpty; ++i) {
    auto scope = guard.enter(Phase::train_step, {i, 512, 512, 1, 1, 512});
    guard.step_completed(i);
  }
  const double per_scope = seconds_since(t0) / kEmpty;
  std::printf("guard: step %.2f ms bare, %.2f ms guarded (noise included); scope+bookkeeping "
              "%.0f ns = %.5f%% of a step\n",
              bare * 1e3, guarded * 1e3, per_scope * 1e9, 100.0 * per_scope / bare);

  // OOM -> retried step: the step needs 1 GiB more than the budget allows, fails at its last
  // allocation, the guard decides, the retry (with the new settings) starts.
  CpuMemory small(int64_t(1) << 30);
  OomGuard g2(small, {}, [] {
    MemorySettings m;
    m.batch_size = 4;
    m.resolutions = {512};
    return m;
  }());
  double oom_to_retry = 0;
  Clock::time_point failing_alloc{};  // just before the allocation that failed
  for (bool done = false; !done;) {
    try {
      if (failing_alloc != Clock::time_point()) {
        oom_to_retry = std::max(oom_to_retry, seconds_since(failing_alloc));
      }
      auto scope = g2.enter(Phase::train_step, {1, 512, 512, 1, g2.settings().batch_size, 512});
      std::vector<torch::Tensor> acts;
      const int n = g2.settings().gradient_checkpointing ? 2 : 8;
      for (int l = 0; l < n; ++l) {
        failing_alloc = Clock::now();
        acts.push_back(torch::ones({g2.settings().batch_size, 1024, 1024, 16}));  // 64 MiB per sample
      }
      done = true;
    } catch (...) {
      auto d = g2.recover(std::current_exception());
      if (!d.retry()) {
        std::printf("unexpected give-up: %s\n", d.message.c_str());
        return 1;
      }
    }
  }
  if (g2.attempts().empty()) {
    std::printf("no OOM happened: the scenario needs a smaller budget\n");
    return 1;
  }
  std::printf("guard: %zu OOM(s) recovered, longest OOM-to-retry %.2f ms (recover() %.2f ms)\n",
              g2.attempts().size(), oom_to_retry * 1e3, g2.attempts().front().recover_seconds * 1e3);
  return 0;
}
