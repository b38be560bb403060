#include "loratrain/models/checkpointing.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <mutex>

namespace lt::models {

namespace {

// What the backward needs besides the saved inputs: the function, which positions of its input list
// were undefined (they are not autograd inputs) and the CPU RNG state at forward time.
struct CheckpointState : torch::CustomClassHolder {
  CheckpointFn fn;
  std::vector<bool> defined;
  at::Tensor rng_state;
  bool keep_results = false;
  std::vector<at::Tensor> kept;  // keep_for_recompute() results of the forward, in order
};

// The checkpoint whose forward keeps results (recording) or whose recomputation hands them back
// (replaying) on this thread; null outside both. Autograd runs a CPU backward on the thread that
// called it, so a thread-local reaches the code of fn.
struct KeptResults {
  CheckpointState* state = nullptr;
  bool replaying = false;
  size_t next = 0;
};
thread_local KeptResults* t_kept = nullptr;

class ScopedKeptResults {
 public:
  ScopedKeptResults(CheckpointState* state, bool replaying) : previous_(t_kept) {
    current_.state = state;
    current_.replaying = replaying;
    t_kept = state->keep_results ? &current_ : nullptr;
  }
  ~ScopedKeptResults() { t_kept = previous_; }
  ScopedKeptResults(const ScopedKeptResults&) = delete;
  ScopedKeptResults& operator=(const ScopedKeptResults&) = delete;

 private:
  KeptResults current_;
  KeptResults* previous_;
};

std::vector<at::Tensor> expand(const std::vector<bool>& defined, const std::vector<at::Tensor>& present) {
  std::vector<at::Tensor> full;
  size_t next = 0;
  for (bool d : defined) full.push_back(d ? present.at(next++) : at::Tensor());
  return full;
}

// Puts the CPU generator into `state` for its lifetime and restores what was there before, so the
// recomputation replays the forward's dropout masks without disturbing the training RNG stream.
class ScopedCpuRngState {
 public:
  explicit ScopedCpuRngState(const at::Tensor& state) : gen_(at::detail::getDefaultCPUGenerator()) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    saved_ = gen_.get_state();
    gen_.set_state(state);
  }
  ~ScopedCpuRngState() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(saved_);
  }
  ScopedCpuRngState(const ScopedCpuRngState&) = delete;
  ScopedCpuRngState& operator=(const ScopedCpuRngState&) = delete;

 private:
  at::Generator gen_;
  at::Tensor saved_;
};

class CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
 public:
  // inputs: the defined inputs of the wrapped function followed by one grad-requiring dummy, so the
  // outputs require grad even when only parameters (e.g. LoRA adapters) do.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                c10::intrusive_ptr<CheckpointState> state,
                                                at::TensorList inputs) {
    {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      state->rng_state = gen.get_state();
    }
    std::vector<at::Tensor> all(inputs.begin(), inputs.end());
    ctx->save_for_backward(all);
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    all.pop_back();  // the dummy
    // Grad mode is already off here (Function::apply), so nothing of fn's graph is kept.
    ScopedKeptResults keep(state.get(), /*replaying=*/false);
    return state->fn(expand(state->defined, all));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> detached;
    detached.reserve(saved.size());
    for (size_t i = 0; i + 1 < saved.size(); ++i) {
      at::Tensor d = saved[i].detach();
      d.requires_grad_(saved[i].requires_grad());
      detached.push_back(d);
    }
    std::vector<at::Tensor> outputs;
    {
      ScopedCpuRngState rng(state->rng_state);
      ScopedKeptResults replay(state.get(), /*replaying=*/true);
      torch::AutoGradMode enable(true);
      outputs = state->fn(expand(state->defined, detached));
    }
    state->kept.clear();  // what was not handed back (none, normally) goes now
    torch::autograd::variable_list roots, grads;
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        grads.push_back(grad_outputs[i]);
      }
    }
    // A full backward (not grad() w.r.t. a fixed list): every leaf reached accumulates its .grad.
    if (!roots.empty()) torch::autograd::backward(roots, grads);

    torch::autograd::variable_list result;
    result.emplace_back();  // the state argument
    for (auto& d : detached) result.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    result.emplace_back();  // the dummy
    return result;
  }
};

}  // namespace

void keep_for_recompute(const at::Tensor& result) {
  if (t_kept != nullptr && !t_kept->replaying) t_kept->state->kept.push_back(result);
}

at::Tensor kept_result() {
  if (t_kept == nullptr || !t_kept->replaying || t_kept->next >= t_kept->state->kept.size()) return at::Tensor();
  // Handed over, not copied: the recomputed graph owns it from here and frees it after backward.
  return std::move(t_kept->state->kept[t_kept->next++]);
}

std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs, bool keep_results) {
  if (!torch::GradMode::is_enabled()) return fn(inputs);
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->keep_results = keep_results;
  std::vector<at::Tensor> present;
  for (const auto& t : inputs) {
    state->defined.push_back(t.defined());
    if (t.defined()) present.push_back(t);
  }
  present.push_back(torch::empty({0}, torch::TensorOptions().requires_grad(true)));
  return CheckpointFunction::apply(state, at::TensorList(present));
}

at::Tensor checkpoint(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                      const std::vector<at::Tensor>& inputs, bool keep_results) {
  return checkpoint([fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in)}; },
                    inputs, keep_results)
      .at(0);
}

}  // namespace lt::models
