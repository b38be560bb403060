#include "loratrain/optim/optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::optim {

namespace {

int64_t next_step(const std::map<std::string, at::Tensor>& state) {
  auto it = state.find("step");
  return it == state.end() ? 1 : it->second.item<int64_t>() + 1;
}

at::Tensor step_tensor(int64_t step) { return torch::tensor(step, torch::kLong); }

at::Tensor state_or_zeros(const std::map<std::string, at::Tensor>& state, const std::string& key,
                          at::IntArrayRef shape, const at::TensorOptions& options) {
  auto it = state.find(key);
  return it == state.end() ? torch::zeros(shape, options) : it->second;
}

// The AdamW update of torch.optim.AdamW (single-tensor path), into fresh tensors. `p` is already a
// private copy of the parameter; exp_avg/exp_avg_sq are not modified.
void adamw_math(at::Tensor& p, const at::Tensor& grad, const at::Tensor& exp_avg, const at::Tensor& exp_avg_sq,
                int64_t step, double lr, double beta1, double beta2, double eps, double weight_decay,
                at::Tensor& new_exp_avg, at::Tensor& new_exp_avg_sq) {
  if (weight_decay != 0.0) p.mul_(1.0 - lr * weight_decay);
  new_exp_avg = exp_avg.mul(beta1).add_(grad, 1.0 - beta1);
  new_exp_avg_sq = exp_avg_sq.mul(beta2).addcmul_(grad, grad, 1.0 - beta2);
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  at::Tensor denom = (new_exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(eps);
  p.addcdiv_(new_exp_avg, denom, -lr / bias_correction1);
}

at::Tensor private_copy(const at::Tensor& t, at::ScalarType dtype) {
  return t.to(dtype, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Optimizer: the two-phase step

Optimizer::Optimizer(std::vector<at::Tensor> params)
    : params_(std::move(params)), state_(params_.size()), lr_scales_(params_.size(), 1.0) {
  for (size_t i = 0; i < params_.size(); ++i) {
    TORCH_CHECK(params_[i].defined(), "optimizer parameter ", i, " is undefined");
    TORCH_CHECK(params_[i].is_floating_point(), "optimizer parameter ", i, " is not floating point");
  }
}

void Optimizer::set_lr_scales(std::vector<double> scales) {
  TORCH_CHECK(scales.size() == params_.size(), "set_lr_scales: ", scales.size(), " factors for ", params_.size(),
              " parameters");
  lr_scales_ = std::move(scales);
}

void Optimizer::step(double lr) {
  torch::NoGradGuard no_grad;
  struct Pending {
    size_t index;
    at::Tensor new_param;
    ParamState new_state;
  };
  std::vector<Pending> pending;
  pending.reserve(params_.size());
  // Phase 1: compute everything into fresh tensors. Any throw here leaves no trace.
  for (size_t i = 0; i < params_.size(); ++i) {
    const at::Tensor& param = params_[i];
    const at::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    if (before_param_update) before_param_update(i);
    Pending p{i, {}, {}};
    compute_update(param, grad, state_[i], lr * lr_scales_[i], p.new_param, p.new_state);
    TORCH_CHECK(p.new_param.sizes() == param.sizes(), name(), ": update of parameter ", i, " has the wrong shape");
    if (p.new_param.scalar_type() != param.scalar_type() || p.new_param.device() != param.device())
      p.new_param = p.new_param.to(param.options());
    pending.push_back(std::move(p));
  }
  // Phase 2: commit. copy_ between same-shaped tensors on one device writes in place; swapping
  // the state maps moves handles only.
  for (Pending& p : pending) {
    params_[p.index].copy_(p.new_param);
    state_[p.index].swap(p.new_state);
  }
  ++steps_taken_;
}

void Optimizer::zero_grad() {
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad() = at::Tensor();
  }
}

NamedTensors Optimizer::state_dict() const {
  NamedTensors out;
  for (size_t i = 0; i < state_.size(); ++i) {
    for (const auto& [key, tensor] : state_[i]) out.emplace_back(std::to_string(i) + "." + key, tensor);
  }
  out.emplace_back("steps_taken", step_tensor(steps_taken_));
  return out;
}

void Optimizer::load_state_dict(const NamedTensors& entries) {
  std::vector<ParamState> loaded(params_.size());
  std::vector<std::string> problems;
  std::optional<int64_t> steps;
  for (const auto& [key, tensor] : entries) {
    if (key == "steps_taken") {
      steps = tensor.item<int64_t>();
      continue;
    }
    size_t dot = key.find('.');
    size_t index = 0;
    bool ok = dot != std::string::npos && dot > 0;
    for (size_t c = 0; ok && c < dot; ++c) ok = std::isdigit(static_cast<unsigned char>(key[c])) != 0;
    if (ok) index = std::stoul(key.substr(0, dot));
    if (!ok || index >= params_.size()) {
      problems.push_back("unexpected entry '" + key + "'");
      continue;
    }
    at::Tensor t = tensor.clone();
    if (key.substr(dot + 1) != "step") t = t.to(params_[index].device());
    loaded[index][key.substr(dot + 1)] = t;
  }
  // The freshly made states of a one-step run are the reference for names, shapes and dtypes.
  for (size_t i = 0; i < params_.size(); ++i) {
    if (loaded[i].empty()) continue;
    if (!loaded[i].count("step")) {
      problems.push_back("parameter " + std::to_string(i) + ": no 'step'");
      continue;
    }
    at::Tensor probe_param = params_[i].detach();
    at::Tensor probe_grad = torch::zeros_like(probe_param);
    at::Tensor new_param;
    ParamState expected;
    {
      torch::NoGradGuard no_grad;
      compute_update(probe_param, probe_grad, {}, 0.0, new_param, expected);
    }
    for (const auto& [key, ref] : expected) {
      auto it = loaded[i].find(key);
      if (it == loaded[i].end()) {
        problems.push_back("parameter " + std::to_string(i) + ": missing '" + key + "'");
      } else if (it->second.sizes() != ref.sizes() || it->second.scalar_type() != ref.scalar_type()) {
        problems.push_back("parameter " + std::to_string(i) + ": '" + key + "' has shape " +
                           c10::str(it->second.sizes()) + " " + c10::toString(it->second.scalar_type()) +
                           ", expected " + c10::str(ref.sizes()) + " " + c10::toString(ref.scalar_type()));
      }
    }
    for (const auto& [key, t] : loaded[i]) {
      if (!expected.count(key)) problems.push_back("parameter " + std::to_string(i) + ": unexpected '" + key + "'");
    }
  }
  if (!steps) problems.push_back("no 'steps_taken'");
  if (!problems.empty()) {
    std::string msg = std::string(name()) + " state does not match the parameters (" +
                      std::to_string(problems.size()) + " problem(s)):";
    for (const auto& p : problems) msg += "\n  " + p;
    throw InputError(msg);
  }
  state_ = std::move(loaded);
  steps_taken_ = *steps;
}

int64_t Optimizer::state_bytes() const {
  int64_t total = 0;
  for (const auto& st : state_) {
    for (const auto& [key, t] : st) total += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return total;
}

// ---------------------------------------------------------------------------------------------
// AdamW

AdamW::AdamW(std::vector<at::Tensor> params, AdamWOptions options)
    : Optimizer(std::move(params)), options_(options) {}

void AdamW::compute_update(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, double lr,
                           at::Tensor& new_param, ParamState& new_state) {
  const int64_t step = next_step(state);
  at::Tensor exp_avg = state_or_zeros(state, "exp_avg", param.sizes(), param.options());
  at::Tensor exp_avg_sq = state_or_zeros(state, "exp_avg_sq", param.sizes(), param.options());
  new_param = private_copy(param, param.scalar_type());
  at::Tensor m, v;
  adamw_math(new_param, grad, exp_avg, exp_avg_sq, step, lr, options_.beta1, options_.beta2, options_.eps,
             options_.weight_decay, m, v);
  new_state["step"] = step_tensor(step);
  new_state["exp_avg"] = m;
  new_state["exp_avg_sq"] = v;
}

// ---------------------------------------------------------------------------------------------
// AdamW8bit

at::Tensor create_dynamic_map(bool is_signed) {
  // Exponent i (0..6) contributes the midpoints of an evenly spaced fraction grid on [0.1, 1],
  // scaled by 10^(i-6): 2^i of them (mirrored for the sign) or 2^(i+1) unsigned; plus 0 and 1.
  constexpr int kMaxExponentBits = 7;
  constexpr int kNonSignBits = 7;
  std::vector<at::Tensor> parts;
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int64_t fraction_items = is_signed ? (int64_t{1} << (i + kNonSignBits - kMaxExponentBits)) + 1
                                             : (int64_t{1} << (i + kNonSignBits - kMaxExponentBits + 1)) + 1;
    at::Tensor boundaries = torch::linspace(0.1, 1.0, fraction_items, torch::kFloat);
    at::Tensor means = (boundaries.slice(0, 0, -1) + boundaries.slice(0, 1)) / 2.0;
    const double scale = std::pow(10.0, -(kMaxExponentBits - 1) + i);
    parts.push_back(means * scale);
    if (is_signed) parts.push_back(means * -scale);
  }
  parts.push_back(torch::tensor({0.0f, 1.0f}));
  at::Tensor data = torch::cat(parts);
  TORCH_CHECK(data.numel() == 256, "dynamic map has ", data.numel(), " entries");
  return std::get<0>(data.sort());
}

std::pair<at::Tensor, at::Tensor> quantize_blockwise(const at::Tensor& x, const at::Tensor& qmap, int64_t block) {
  const int64_t n = x.numel();
  const int64_t blocks = (n + block - 1) / block;
  at::Tensor flat = x.reshape(-1).to(at::kFloat);
  if (blocks * block != n) flat = torch::constant_pad_nd(flat, {0, blocks * block - n}, 0.0);
  at::Tensor b = flat.view({blocks, block});
  at::Tensor absmax = b.abs().amax(1);
  at::Tensor divisor = torch::where(absmax == 0, torch::ones_like(absmax), absmax);
  at::Tensor scaled = b / divisor.unsqueeze(1);
  // Nearest map entry: the map is sorted, so the index is the count of midpoints below the value.
  at::Tensor midpoints = (qmap.slice(0, 0, -1) + qmap.slice(0, 1)) / 2.0;
  at::Tensor codes = torch::bucketize(scaled, midpoints.to(scaled.device())).to(at::kByte);
  codes = codes.view(-1).slice(0, 0, n).reshape(x.sizes()).contiguous();
  return {codes, absmax};
}

at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& qmap,
                                int64_t block) {
  const int64_t n = codes.numel();
  const int64_t blocks = absmax.numel();
  at::Tensor values = qmap.to(codes.device()).index_select(0, codes.reshape(-1).to(at::kLong));
  if (blocks * block != n) values = torch::constant_pad_nd(values, {0, blocks * block - n}, 0.0);
  values = values.view({blocks, block}) * absmax.unsqueeze(1);
  return values.view(-1).slice(0, 0, n).reshape(codes.sizes());
}

AdamW8bit::AdamW8bit(std::vector<at::Tensor> params, AdamW8bitOptions options)
    : Optimizer(std::move(params)),
      options_(options),
      qmap_signed_(create_dynamic_map(true)),
      qmap_unsigned_(create_dynamic_map(false)) {}

void AdamW8bit::compute_update(const at::Tensor& param, const at::Tensor& grad, const ParamState& state, double lr,
                               at::Tensor& new_param, ParamState& new_state) {
  const auto& o = options_;
  const int64_t step = next_step(state);
  new_state["step"] = step_tensor(step);
  at::Tensor g = grad.to(at::kFloat);
  new_param = private_copy(param, at::kFloat);
  const auto f32 = param.options().dtype(at::kFloat);
  if (param.numel() < o.min_8bit_size) {
    // Small tensors (biases, norms, low-rank LoRA factors) keep 32-bit states, as bitsandbytes does.
    at::Tensor m, v;
    adamw_math(new_param, g, state_or_zeros(state, "exp_avg", param.sizes(), f32),
               state_or_zeros(state, "exp_avg_sq", param.sizes(), f32), step, lr, o.beta1, o.beta2, o.eps,
               o.weight_decay, m, v);
    new_state["exp_avg"] = m;
    new_state["exp_avg_sq"] = v;
    return;
  }
  const int64_t blocks = (param.numel() + o.block_size - 1) / o.block_size;
  at::Tensor m, v;
  if (state.count("state1")) {
    m = dequantize_blockwise(state.at("state1"), state.at("absmax1"), qmap_signed_, o.block_size);
    v = dequantize_blockwise(state.at("state2"), state.at("absmax2"), qmap_unsigned_, o.block_size);
  } else {
    m = torch::zeros(param.sizes(), f32);
    v = torch::zeros(param.sizes(), f32);
  }
  at::Tensor new_m, new_v;
  adamw_math(new_param, g, m, v, step, lr, o.beta1, o.beta2, o.eps, o.weight_decay, new_m, new_v);
  auto [codes1, absmax1] = quantize_blockwise(new_m, qmap_signed_, o.block_size);
  auto [codes2, absmax2] = quantize_blockwise(new_v, qmap_unsigned_, o.block_size);
  TORCH_CHECK(absmax1.numel() == blocks && absmax2.numel() == blocks);
  new_state["state1"] = codes1;
  new_state["absmax1"] = absmax1;
  new_state["state2"] = codes2;
  new_state["absmax2"] = absmax2;
}

// ---------------------------------------------------------------------------------------------
// Adafactor

Adafactor::Adafactor(std::vector<at::Tensor> params, AdafactorOptions options)
    : Optimizer(std::move(params)), options_(options) {}

void Adafactor::compute_update(const at::Tensor& param, const at::Tensor& grad, const ParamState& state,
                               double lr, at::Tensor& new_param, ParamState& new_state) {
  const auto& o = options_;
  const int64_t step = next_step(state);
  new_state["step"] = step_tensor(step);
  at::Tensor g = grad.to(at::kFloat);
  at::Tensor p = private_copy(param, at::kFloat);
  const double sqrt_numel = std::sqrt(static_cast<double>(param.numel()));
  const auto f32 = param.options().dtype(at::kFloat);

  double rel_step = lr;
  if (o.relative_step) {
    const double min_step = o.warmup_init ? 1e-6 * static_cast<double>(step) : 1e-2;
    rel_step = std::min(min_step, 1.0 / std::sqrt(static_cast<double>(step)));
  }
  double param_scale = 1.0;
  if (o.scale_parameter) param_scale = std::max(o.eps2, p.norm().item<double>() / sqrt_numel);
  const double alpha = param_scale * rel_step;
  const double beta2t = 1.0 - std::pow(static_cast<double>(step), o.decay_rate);

  at::Tensor sq = g * g + o.eps1;
  at::Tensor update;
  if (param.dim() >= 2) {
    // Factored second moment: row means [.., n] and column means [.., m] of grad^2.
    std::vector<int64_t> row_shape(param.sizes().begin(), param.sizes().end() - 1);
    std::vector<int64_t> col_shape(param.sizes().begin(), param.sizes().end() - 2);
    col_shape.push_back(param.size(-1));
    at::Tensor row = state_or_zeros(state, "exp_avg_sq_row", row_shape, f32).mul(beta2t).add_(sq.mean(-1), 1.0 - beta2t);
    at::Tensor col = state_or_zeros(state, "exp_avg_sq_col", col_shape, f32).mul(beta2t).add_(sq.mean(-2), 1.0 - beta2t);
    at::Tensor r_factor = (row / row.mean(-1, /*keepdim=*/true)).rsqrt_().unsqueeze(-1);
    at::Tensor c_factor = col.unsqueeze(-2).rsqrt();
    update = (r_factor * c_factor).mul_(g);
    new_state["exp_avg_sq_row"] = row;
    new_state["exp_avg_sq_col"] = col;
  } else {
    at::Tensor v = state_or_zeros(state, "exp_avg_sq", param.sizes(), f32).mul(beta2t).add_(sq, 1.0 - beta2t);
    update = v.rsqrt().mul_(g);
    new_state["exp_avg_sq"] = v;
  }
  update.div_((update.norm() / sqrt_numel / o.clip_threshold).clamp_(1.0));
  update.mul_(alpha);
  if (o.beta1 > 0.0) {
    at::Tensor m = state_or_zeros(state, "exp_avg", param.sizes(), f32).mul(o.beta1).add_(update, 1.0 - o.beta1);
    new_state["exp_avg"] = m;
    update = m;
  }
  if (o.weight_decay != 0.0) p.add_(p, -o.weight_decay * alpha);
  p.sub_(update);
  new_param = p;
}

// ---------------------------------------------------------------------------------------------
// Factory and gradient clipping

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

class ParamReader {
 public:
  ParamReader(std::string optimizer, const OptimizerParams& params, std::vector<std::string> known)
      : optimizer_(std::move(optimizer)), params_(params), known_(std::move(known)) {
    for (const auto& [key, values] : params_) {
      if (std::find(known_.begin(), known_.end(), key) == known_.end()) {
        std::string msg = "optimizer_params: '" + key + "' is not a parameter of " + optimizer_;
        if (auto m = closest_match(key, known_)) msg += " (did you mean '" + *m + "'?)";
        throw InputError(msg);
      }
    }
  }
  void scalar(const std::string& key, double& out) const {
    auto it = params_.find(key);
    if (it == params_.end()) return;
    if (it->second.size() != 1) throw InputError("optimizer_params." + key + " takes one value");
    out = it->second[0];
  }
  void flag(const std::string& key, bool& out) const {
    double v = out ? 1.0 : 0.0;
    scalar(key, v);
    out = v != 0.0;
  }
  void pair(const std::string& key, double& a, double& b) const {
    auto it = params_.find(key);
    if (it == params_.end()) return;
    if (it->second.size() != 2) throw InputError("optimizer_params." + key + " takes two values");
    a = it->second[0];
    b = it->second[1];
  }

 private:
  std::string optimizer_;
  const OptimizerParams& params_;
  std::vector<std::string> known_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const std::string& name, std::vector<at::Tensor> params,
                                          const OptimizerParams& optimizer_params) {
  const std::string n = lower(name);
  if (n == "adamw") {
    ParamReader r("adamw", optimizer_params, {"betas", "eps", "weight_decay"});
    AdamWOptions o;
    r.pair("betas", o.beta1, o.beta2);
    r.scalar("eps", o.eps);
    r.scalar("weight_decay", o.weight_decay);
    return std::make_unique<AdamW>(std::move(params), o);
  }
  if (n == "adamw8bit") {
    ParamReader r("adamw8bit", optimizer_params, {"betas", "eps", "weight_decay", "min_8bit_size"});
    AdamW8bitOptions o;
    r.pair("betas", o.beta1, o.beta2);
    r.scalar("eps", o.eps);
    r.scalar("weight_decay", o.weight_decay);
    double min_size = static_cast<double>(o.min_8bit_size);
    r.scalar("min_8bit_size", min_size);
    o.min_8bit_size = static_cast<int64_t>(min_size);
    return std::make_unique<AdamW8bit>(std::move(params), o);
  }
  if (n == "adafactor") {
    ParamReader r("adafactor", optimizer_params,
                  {"eps", "clip_threshold", "decay_rate", "beta1", "weight_decay", "scale_parameter",
                   "relative_step", "warmup_init"});
    AdafactorOptions o;
    r.pair("eps", o.eps1, o.eps2);
    r.scalar("clip_threshold", o.clip_threshold);
    r.scalar("decay_rate", o.decay_rate);
    r.scalar("beta1", o.beta1);
    r.scalar("weight_decay", o.weight_decay);
    r.flag("scale_parameter", o.scale_parameter);
    r.flag("relative_step", o.relative_step);
    r.flag("warmup_init", o.warmup_init);
    return std::make_unique<Adafactor>(std::move(params), o);
  }
  const std::vector<std::string> names = {"adamw", "adamw8bit", "adafactor"};
  std::string msg = "optimizer '" + name + "' is not supported (adamw, adamw8bit, adafactor)";
  if (auto m = closest_match(n, names)) msg += "; did you mean '" + *m + "'?";
  throw InputError(msg);
}

double clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  if (grads.empty()) return 0.0;
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(g.norm(2).to(at::kFloat));
  at::Tensor total = torch::stack(norms).norm(2);
  const double total_value = total.item<double>();
  if (max_norm > 0.0 && std::isfinite(total_value)) {
    at::Tensor coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    for (auto& g : grads) g.mul_(coef.to(g.scalar_type()));
  }
  return total_value;
}

}  // namespace lt::optim
