#include "loratrain/optim/ema.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <optional>
#include <string>

#include "loratrain/util/error.h"

namespace lt::optim {

AdapterEMA::AdapterEMA(std::vector<at::Tensor> params, EMAOptions options)
    : params_(std::move(params)), options_(options) {
  TORCH_CHECK(options_.decay >= 0.0 && options_.decay <= 1.0, "EMA decay must be in [0, 1], got ", options_.decay);
  at::NoGradGuard no_grad;
  average_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(params_[i].defined() && params_[i].is_floating_point(), "EMA parameter ", i,
                " is not a floating-point tensor");
    average_.push_back(params_[i].detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true));
  }
}

void AdapterEMA::update() {
  TORCH_CHECK(!average_in_place(), "AdapterEMA::update() while the average is in place of the live weights");
  at::NoGradGuard no_grad;
  const double one_minus_decay = 1.0 - options_.decay;
  const bool changes_weights = options_.use_feedback || options_.param_multiplier != 1.0;
  std::vector<at::Tensor> new_average(params_.size()), new_weights(changes_weights ? params_.size() : 0);
  // Phase 1: every new value into fresh tensors, in toolkit/ema.py's order of operations.
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor weights = params_[i].detach().to(at::kFloat);  // no copy when already fp32
    at::Tensor tmp = average_[i] - weights;
    tmp.mul_(one_minus_decay);
    new_average[i] = average_[i] - tmp;
    if (!changes_weights) continue;
    at::Tensor w = weights;
    if (options_.use_feedback) w = w + tmp * 10;  // feedback is ten times the average's step
    if (options_.param_multiplier != 1.0) w = w * options_.param_multiplier;
    new_weights[i] = w;
  }
  // Phase 2: commit (handle swaps and same-shape copies: nothing allocates, nothing throws).
  for (size_t i = 0; i < params_.size(); ++i) {
    average_[i] = std::move(new_average[i]);
    if (changes_weights) params_[i].copy_(new_weights[i]);
  }
  ++updates_;
}

void AdapterEMA::swap_in_average() {
  TORCH_CHECK(!average_in_place(), "AdapterEMA::swap_in_average(): the average is already in place");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> live;
  live.reserve(params_.size());
  for (const auto& p : params_) live.push_back(p.detach().clone());  // all copies before any change
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(average_[i]);
  live_ = std::move(live);
}

void AdapterEMA::restore_live() {
  TORCH_CHECK(average_in_place(), "AdapterEMA::restore_live(): the live weights are already in place");
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(live_[i]);
  live_.clear();
}

AdapterEMA::AverageScope::AverageScope(AdapterEMA& ema) : ema_(ema), swapped_(!ema.average_in_place()) {
  if (swapped_) ema_.swap_in_average();
}

AdapterEMA::AverageScope::~AverageScope() {
  if (swapped_) ema_.restore_live();
}

int64_t AdapterEMA::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& a : average_) bytes += static_cast<int64_t>(a.nbytes());
  return bytes;
}

NamedTensors AdapterEMA::state_dict() const {
  NamedTensors out;
  for (size_t i = 0; i < average_.size(); ++i) out.emplace_back(std::to_string(i) + ".average", average_[i]);
  out.emplace_back("updates", at::scalar_tensor(updates_, at::kLong));
  return out;
}

void AdapterEMA::load_state_dict(const NamedTensors& state) {
  TORCH_CHECK(!average_in_place(), "AdapterEMA::load_state_dict() while the average is in place");
  std::vector<at::Tensor> loaded(params_.size());
  std::optional<int64_t> loaded_updates;
  std::vector<std::string> problems;
  for (const auto& [name, tensor] : state) {
    if (name == "updates") {
      if (tensor.numel() == 1 && tensor.scalar_type() == at::kLong) loaded_updates = tensor.item<int64_t>();
      else problems.push_back("'updates' is not one int64 value");
      continue;
    }
    const size_t dot = name.find('.');
    const std::string index = dot == std::string::npos ? "" : name.substr(0, dot);
    const bool numeric = !index.empty() && index.size() < 9 && index.find_first_not_of("0123456789") == std::string::npos;
    const size_t i = numeric ? std::stoul(index) : params_.size();
    if (i >= params_.size() || name.substr(dot + 1) != "average") {
      problems.push_back("unexpected entry '" + name + "'");
      continue;
    }
    if (tensor.sizes() != params_[i].sizes() || tensor.scalar_type() != at::kFloat) {
      problems.push_back("'" + name + "' is " + c10::str(tensor.sizes()) + " " + c10::toString(tensor.scalar_type()) +
                         ", expected " + c10::str(params_[i].sizes()) + " Float");
      continue;
    }
    loaded[i] = tensor.detach().to(params_[i].device(), at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!loaded[i].defined()) problems.push_back("missing '" + std::to_string(i) + ".average'");
  if (!loaded_updates) problems.push_back("missing 'updates'");
  if (!problems.empty()) {
    std::string msg = "EMA state does not match the adapter (" + std::to_string(params_.size()) + " tensors):";
    for (const auto& p : problems) msg += " " + p + ";";
    msg.pop_back();
    throw InputError(msg);
  }
  average_ = std::move(loaded);
  updates_ = *loaded_updates;
}

}  // namespace lt::optim
