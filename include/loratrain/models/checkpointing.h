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
// keep_results: results that fn's code offers with keep_for_recompute() during the forward are
// kept until the segment's backward and handed back by kept_result() during the recomputation,
// instead of being computed again (attention's output: L^2 work, L x C bytes).
std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                   bool keep_results = false);

// Convenience for a function with one output.
at::Tensor checkpoint(const std::function<at::Tensor(const std::vector<at::Tensor>&)>& fn,
                      const std::vector<at::Tensor>& inputs, bool keep_results = false);

// Inside the forward of a checkpoint(..., keep_results = true): keeps `result` for the
// recomputation (a no-op anywhere else). Calls must come in the same order in the recomputation,
// which runs the same code on the same inputs.
void keep_for_recompute(const at::Tensor& result);

// During the recomputation of such a checkpoint: the next kept result, in the order they were
// kept; undefined anywhere else (then the caller computes it).
at::Tensor kept_result();

}  // namespace lt::models
