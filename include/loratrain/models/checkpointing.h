// Gradient checkpointing for LibTorch 1.13, which has no torch.utils.checkpoint in C++.
// Mirrors torch.utils.checkpoint(use_reentrant=True): the forward runs without building a graph
// and keeps only the inputs; backward re-runs the function with grad enabled (and the CPU RNG
// state of the forward, so dropout masks repeat) and back-propagates through the recomputed graph.
// Because that inner backward is a full torch::autograd::backward, every leaf the recomputed graph
// reaches gets its .grad accumulated: module parameters and LoRA adapter parameters alike, even
// though adapters live outside the module tree and no input requires grad.
#pragma once
#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace lt::models {

using CheckpointFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs fn(inputs) so that its activations are recomputed in backward. inputs may contain undefined
// tensors (passed through as such). Outside grad mode this is just fn(inputs).
std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs);

// Convenience for a function with one output.
at::Tensor checkpoint(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                      const std::vector<at::Tensor>& inputs);

}  // namespace lt::models
