// DDPM, DDIM, Euler, flow-matching Euler and flow UniPC schedulers (see scheduler.h). Timestep and sigma
// tables are computed the way diffusers computes them: numpy float64 where it uses numpy (with
// numpy's linspace/arange/interp/round semantics), float32 where it uses torch or float32 arrays,
// so the tables match the reference bit for bit or to the last float32 ulp.
#include "loratrain/sample/scheduler.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::sample {

using nlohmann::json;

// ---- numpy semantics ----
namespace {

// np.linspace(start, stop, num) in float64: i * step + start, last element exactly stop.
std::vector<double> np_linspace(double start, double stop, int64_t num) {
  std::vector<double> y(static_cast<size_t>(std::max<int64_t>(num, 0)));
  if (num <= 0) return y;
  const int64_t div = num - 1;
  const double delta = stop - start;
  if (div > 0) {
    const double step = delta / static_cast<double>(div);
    for (int64_t i = 0; i < num; ++i) {
      double v = step == 0 ? static_cast<double>(i) / static_cast<double>(div) * delta
                           : static_cast<double>(i) * step;
      y[static_cast<size_t>(i)] = v + start;
    }
    y.back() = stop;
  } else {
    y[0] = start;
  }
  return y;
}

// np.arange(start, stop, step) for floats: length ceil((stop - start) / step); element i >= 2 is
// start + i * ((start + step) - start), numpy's DOUBLE_fill.
std::vector<double> np_arange(double start, double stop, double step) {
  const double len_f = std::ceil((stop - start) / step);
  std::vector<double> y;
  if (!(len_f > 0)) return y;
  const auto len = static_cast<size_t>(len_f);
  y.resize(len);
  y[0] = start;
  if (len > 1) y[1] = start + step;
  const double delta = y.size() > 1 ? y[1] - start : 0.0;
  for (size_t i = 2; i < len; ++i) y[i] = start + static_cast<double>(i) * delta;
  return y;
}

// np.round: half to even (the default floating-point rounding mode).
double np_round(double v) { return std::nearbyint(v); }

// np.interp(x, arange(len(fp)), fp) in float64, with numpy's exact-knot shortcuts.
double np_interp_unit_grid(double x, const std::vector<double>& fp) {
  const auto n = static_cast<int64_t>(fp.size());
  if (x < 0) return fp.front();
  if (x >= static_cast<double>(n - 1)) return fp.back();
  const auto j = static_cast<int64_t>(std::floor(x));
  if (static_cast<double>(j) == x) return fp[static_cast<size_t>(j)];
  // slope over a unit knot spacing: (fp[j+1] - fp[j]) / (xp[j+1] - xp[j]) with xp[j+1] - xp[j] = 1
  const double slope = fp[static_cast<size_t>(j + 1)] - fp[static_cast<size_t>(j)];
  return slope * (x - static_cast<double>(j)) + fp[static_cast<size_t>(j)];
}

float to_f32(double v) { return static_cast<float>(v); }

std::vector<double> tensor_to_doubles(const at::Tensor& t) {
  auto c = t.to(at::kDouble).contiguous();
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

at::Tensor f32_tensor(const std::vector<double>& v) {
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = to_f32(v[i]);
  return torch::tensor(f, torch::kFloat32);
}

// Training-timestep positions of `n` inference steps (diffusers set_timesteps spacing), as the
// doubles numpy produces before the final cast. `round_linspace`: DDPM/DDIM round linspace
// spacing to integers, Euler keeps the fractions.
std::vector<double> spaced_timesteps(TimestepSpacing spacing, int64_t T, int64_t n, int64_t steps_offset,
                                     bool round_linspace) {
  std::vector<double> ts;
  switch (spacing) {
    case TimestepSpacing::kLinspace: {
      ts = np_linspace(0, static_cast<double>(T - 1), n);
      if (round_linspace) {
        for (auto& v : ts) v = np_round(v);
      } else {
        for (auto& v : ts) v = to_f32(v);  // np.linspace(..., dtype=float32)
      }
      std::reverse(ts.begin(), ts.end());
      break;
    }
    case TimestepSpacing::kLeading: {
      const int64_t ratio = T / n;
      for (int64_t i = n - 1; i >= 0; --i) ts.push_back(static_cast<double>(i * ratio + steps_offset));
      break;
    }
    case TimestepSpacing::kTrailing: {
      const double ratio = static_cast<double>(T) / static_cast<double>(n);
      for (double v : np_arange(static_cast<double>(T), 0.0, -ratio)) ts.push_back(np_round(v) - 1);
      break;
    }
  }
  return ts;
}

// ---- config reading ----

// Reads known keys of a diffusers scheduler config; null means "class default", keys of other
// classes are ignored (diffusers from_config), a wrong type is an error naming the key.
class ConfigReader {
 public:
  explicit ConfigReader(const json& j) : j_(j) {
    if (!j_.is_object() && !j_.is_null()) throw InputError("scheduler config must be a JSON object");
  }
  const json* find(const char* key) const {
    if (!j_.is_object()) return nullptr;
    auto it = j_.find(key);
    if (it == j_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  void get(const char* key, double& out) const {
    if (auto* v = find(key)) {
      if (!v->is_number()) fail(key, "a number", *v);
      out = v->get<double>();
    }
  }
  void get(const char* key, std::optional<double>& out) const {
    if (auto* v = find(key)) {
      if (!v->is_number()) fail(key, "a number", *v);
      out = v->get<double>();
    }
  }
  void get(const char* key, int64_t& out) const {
    if (auto* v = find(key)) {
      if (v->is_number_integer()) {
        out = v->get<int64_t>();
      } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>()) {
        out = static_cast<int64_t>(v->get<double>());
      } else {
        fail(key, "an integer", *v);
      }
    }
  }
  void get(const char* key, bool& out) const {
    if (auto* v = find(key)) {
      if (!v->is_boolean()) fail(key, "true or false", *v);
      out = v->get<bool>();
    }
  }
  void get(const char* key, std::string& out) const {
    if (auto* v = find(key)) {
      if (!v->is_string()) fail(key, "a string", *v);
      out = v->get<std::string>();
    }
  }
  void get(const char* key, std::vector<double>& out) const {
    if (auto* v = find(key)) {
      if (!v->is_array()) fail(key, "a list of numbers", *v);
      out.clear();
      for (auto& e : *v) {
        if (!e.is_number()) fail(key, "a list of numbers", *v);
        out.push_back(e.get<double>());
      }
    }
  }
  void get(const char* key, std::vector<int64_t>& out) const {
    if (auto* v = find(key)) {
      if (!v->is_array()) fail(key, "a list of integers", *v);
      out.clear();
      for (auto& e : *v) {
        if (!e.is_number_integer()) fail(key, "a list of integers", *v);
        out.push_back(e.get<int64_t>());
      }
    }
  }
  void get(const char* key, BetaSchedule& out) const {
    std::string s;
    get(key, s);
    if (!s.empty()) out = beta_schedule_from_string(s);
  }
  void get(const char* key, PredictionType& out) const {
    std::string s;
    get(key, s);
    if (!s.empty()) out = prediction_type_from_string(s);
  }
  void get(const char* key, TimestepSpacing& out) const {
    std::string s;
    get(key, s);
    if (!s.empty()) out = timestep_spacing_from_string(s);
  }
  // A feature this project does not implement: fine at its default, an error otherwise.
  void require_default(const char* key, const json& default_value, const char* why) const {
    if (auto* v = find(key); v && *v != default_value)
      throw InputError(std::string("scheduler config: ") + key + " = " + v->dump() + " is not supported (" + why + ")");
  }
  void schedule(NoiseScheduleConfig& s, std::vector<double>& trained_betas) const {
    get("num_train_timesteps", s.num_train_timesteps);
    get("beta_start", s.beta_start);
    get("beta_end", s.beta_end);
    get("beta_schedule", s.beta_schedule);
    get("rescale_betas_zero_snr", s.rescale_betas_zero_snr);
    get("trained_betas", trained_betas);
    if (s.num_train_timesteps < 2) throw InputError("scheduler config: num_train_timesteps must be >= 2");
  }

 private:
  [[noreturn]] static void fail(const char* key, const char* expected, const json& got) {
    throw InputError(std::string("scheduler config: '") + key + "' must be " + expected + ", got " + got.dump());
  }
  const json& j_;
};

void write_schedule(json& j, const NoiseScheduleConfig& s, const std::vector<double>& trained_betas) {
  j["num_train_timesteps"] = s.num_train_timesteps;
  j["beta_start"] = s.beta_start;
  j["beta_end"] = s.beta_end;
  j["beta_schedule"] = to_string(s.beta_schedule);
  j["rescale_betas_zero_snr"] = s.rescale_betas_zero_snr;
  j["trained_betas"] = trained_betas.empty() ? json(nullptr) : json(trained_betas);
}

at::Tensor betas_for(const NoiseScheduleConfig& s, const std::vector<double>& trained_betas) {
  if (trained_betas.empty()) return make_betas(s);
  if (static_cast<int64_t>(trained_betas.size()) != s.num_train_timesteps)
    throw InputError("scheduler config: trained_betas has " + std::to_string(trained_betas.size()) +
                     " values, num_train_timesteps is " + std::to_string(s.num_train_timesteps));
  auto b = f32_tensor(trained_betas);
  return s.rescale_betas_zero_snr ? rescale_zero_terminal_snr(b) : b;
}

// diffusers _threshold_sample (Imagen dynamic thresholding) on a [B, ...] x0 estimate.
at::Tensor threshold_sample(const at::Tensor& sample, double ratio, double max_value) {
  auto dtype = sample.scalar_type();
  auto x = sample.to(at::kFloat).reshape({sample.size(0), -1});
  auto s = torch::quantile(x.abs(), ratio, 1).clamp(1.0, max_value).unsqueeze(1);
  x = torch::clamp(x, -s, s) / s;
  return x.reshape(sample.sizes()).to(dtype);
}

at::Tensor clip_or_threshold(at::Tensor x0, bool thresholding, double ratio, double max_value, bool clip,
                             double range) {
  if (thresholding) return threshold_sample(x0, ratio, max_value);
  if (clip) return x0.clamp(-range, range);
  return x0;
}

void reject_timestep_options(const TimestepOptions& o, const char* cls) {
  if (o.mu || !o.sigmas.empty())
    throw InputError(std::string(cls) + " takes neither mu nor custom sigmas (flow matching only)");
}

float item_f(const at::Tensor& t, int64_t i) { return t.data_ptr<float>()[i]; }

}  // namespace

TimestepSpacing timestep_spacing_from_string(std::string_view name) {
  if (name == "linspace") return TimestepSpacing::kLinspace;
  if (name == "leading") return TimestepSpacing::kLeading;
  if (name == "trailing") return TimestepSpacing::kTrailing;
  throw InputError("unsupported timestep_spacing '" + std::string(name) + "' (supported: linspace, leading, trailing)");
}

const char* to_string(TimestepSpacing s) {
  switch (s) {
    case TimestepSpacing::kLinspace: return "linspace";
    case TimestepSpacing::kLeading: return "leading";
    case TimestepSpacing::kTrailing: return "trailing";
  }
  return "?";
}

// ---- Scheduler ----

at::Tensor Scheduler::scale_model_input(const at::Tensor& sample, int64_t step_index) const {
  check_step_index(step_index);
  return sample;
}

int64_t Scheduler::index_for_timestep(double t) const {
  TORCH_CHECK(timesteps_.defined(), "set_timesteps() has not been called");
  auto ts = tensor_to_doubles(timesteps_);
  std::vector<int64_t> hits;
  for (size_t i = 0; i < ts.size(); ++i)
    if (ts[i] == t) hits.push_back(static_cast<int64_t>(i));
  TORCH_CHECK(!hits.empty(), "timestep ", t, " is not in the schedule");
  return hits.size() > 1 ? hits[1] : hits[0];
}

void Scheduler::check_step_index(int64_t step_index) const {
  TORCH_CHECK(timesteps_.defined(), class_name(), ": set_timesteps() has not been called");
  TORCH_CHECK(step_index >= 0 && step_index < timesteps_.size(0), class_name(), ": step index ", step_index,
              " outside [0, ", timesteps_.size(0), ")");
}

// ---- DDPM ----

DDPMSchedulerConfig DDPMSchedulerConfig::from_json(const json& j) {
  DDPMSchedulerConfig c;
  ConfigReader r(j);
  r.schedule(c.schedule, c.trained_betas);
  std::string variance = "fixed_small";
  r.get("variance_type", variance);
  if (variance == "fixed_small") c.variance_type = VarianceType::kFixedSmall;
  else if (variance == "fixed_small_log") c.variance_type = VarianceType::kFixedSmallLog;
  else if (variance == "fixed_large") c.variance_type = VarianceType::kFixedLarge;
  else
    throw InputError("scheduler config: variance_type '" + variance +
                     "' is not supported (fixed_small, fixed_small_log, fixed_large)");
  r.get("clip_sample", c.clip_sample);
  r.get("clip_sample_range", c.clip_sample_range);
  r.get("prediction_type", c.prediction_type);
  r.get("thresholding", c.thresholding);
  r.get("dynamic_thresholding_ratio", c.dynamic_thresholding_ratio);
  r.get("sample_max_value", c.sample_max_value);
  r.get("timestep_spacing", c.timestep_spacing);
  r.get("steps_offset", c.steps_offset);
  return c;
}

json DDPMSchedulerConfig::to_json() const {
  json j;
  j["_class_name"] = "DDPMScheduler";
  write_schedule(j, schedule, trained_betas);
  static const char* kVariance[] = {"fixed_small", "fixed_small_log", "fixed_large"};
  j["variance_type"] = kVariance[static_cast<int>(variance_type)];
  j["clip_sample"] = clip_sample;
  j["clip_sample_range"] = clip_sample_range;
  j["prediction_type"] = to_string(prediction_type);
  j["thresholding"] = thresholding;
  j["dynamic_thresholding_ratio"] = dynamic_thresholding_ratio;
  j["sample_max_value"] = sample_max_value;
  j["timestep_spacing"] = to_string(timestep_spacing);
  j["steps_offset"] = steps_offset;
  return j;
}

DDPMScheduler::DDPMScheduler(const DDPMSchedulerConfig& config) : config_(config) {
  set_prediction_type(config_.prediction_type);
  betas_ = betas_for(config_.schedule, config_.trained_betas);
  alphas_ = 1.0 - betas_;
  alphas_cumprod_ = torch::cumprod(alphas_, 0);
}

void DDPMScheduler::set_prediction_type(PredictionType p) {
  if (p == PredictionType::kFlow) throw InputError("DDPMScheduler cannot sample a flow-matching model");
  config_.prediction_type = p;
}

at::Tensor DDPMScheduler::add_noise(const at::Tensor& x0, const at::Tensor& noise, const at::Tensor& timesteps) const {
  auto ac = alphas_cumprod_.to(x0.device()).to(x0.scalar_type());
  auto a = ac.index({timesteps.to(x0.device()).to(at::kLong)}).flatten();
  while (a.dim() < x0.dim()) a = a.unsqueeze(-1);
  return a.pow(0.5) * x0 + (1 - a).pow(0.5) * noise;
}

void DDPMScheduler::set_timesteps(int64_t n, const TimestepOptions& options) {
  reject_timestep_options(options, class_name());
  const int64_t T = config_.schedule.num_train_timesteps;
  if (n < 1 || n > T)
    throw InputError("DDPMScheduler: num_inference_steps " + std::to_string(n) + " must be in [1, " +
                     std::to_string(T) + "]");
  auto ts = spaced_timesteps(config_.timestep_spacing, T, n, config_.steps_offset, true);
  std::vector<int64_t> v;
  for (double t : ts) v.push_back(static_cast<int64_t>(t));
  timesteps_ = torch::tensor(v, torch::kLong);
}

StepOutput DDPMScheduler::step(const at::Tensor& model_output, int64_t i, const at::Tensor& sample,
                               at::Generator* generator) const {
  check_step_index(i);
  const int64_t t = timesteps_[i].item<int64_t>();
  const int64_t prev_t = i + 1 < timesteps_.size(0) ? timesteps_[i + 1].item<int64_t>() : -1;
  TORCH_CHECK(t >= 0 && t < config_.schedule.num_train_timesteps, "timestep ", t, " outside the training schedule");
  // float32 scalars, computed like diffusers' 0-d float32 tensors.
  const float alpha_prod_t = item_f(alphas_cumprod_, t);
  const float alpha_prod_t_prev = prev_t >= 0 ? item_f(alphas_cumprod_, prev_t) : 1.0f;
  const float beta_prod_t = 1.0f - alpha_prod_t;
  const float beta_prod_t_prev = 1.0f - alpha_prod_t_prev;
  const float current_alpha_t = alpha_prod_t / alpha_prod_t_prev;
  const float current_beta_t = 1.0f - current_alpha_t;

  at::Tensor x0;
  switch (config_.prediction_type) {
    case PredictionType::kEpsilon:
      x0 = (sample - std::sqrt(beta_prod_t) * model_output) / std::sqrt(alpha_prod_t);
      break;
    case PredictionType::kSample: x0 = model_output; break;
    case PredictionType::kVPrediction:
      x0 = std::sqrt(alpha_prod_t) * sample - std::sqrt(beta_prod_t) * model_output;
      break;
    case PredictionType::kFlow: TORCH_CHECK(false, "unreachable");
  }
  x0 = clip_or_threshold(x0, config_.thresholding, config_.dynamic_thresholding_ratio, config_.sample_max_value,
                         config_.clip_sample, config_.clip_sample_range);

  // Posterior mean, formula (7) of Ho et al. 2020.
  const float x0_coeff = (std::sqrt(alpha_prod_t_prev) * current_beta_t) / beta_prod_t;
  const float xt_coeff = std::sqrt(current_alpha_t) * beta_prod_t_prev / beta_prod_t;
  auto prev = x0_coeff * x0 + xt_coeff * sample;

  if (t > 0) {
    TORCH_CHECK(generator != nullptr, "DDPMScheduler::step needs a generator for its noise");
    auto noise = randn(model_output.sizes(), *generator, model_output.scalar_type(), model_output.device());
    float variance = std::max((1.0f - alpha_prod_t_prev) / (1.0f - alpha_prod_t) * current_beta_t, 1e-20f);
    switch (config_.variance_type) {
      case VarianceType::kFixedSmall: prev = prev + std::sqrt(variance) * noise; break;
      case VarianceType::kFixedSmallLog:
        // diffusers: exp(0.5 * log(var)) is used as the standard deviation directly.
        prev = prev + std::exp(0.5f * std::log(variance)) * noise;
        break;
      case VarianceType::kFixedLarge: prev = prev + std::sqrt(current_beta_t) * noise; break;
    }
  }
  return {prev, x0};
}

json DDPMScheduler::config_json() const { return config_.to_json(); }

// ---- DDIM ----

DDIMSchedulerConfig DDIMSchedulerConfig::from_json(const json& j) {
  DDIMSchedulerConfig c;
  ConfigReader r(j);
  r.schedule(c.schedule, c.trained_betas);
  r.get("clip_sample", c.clip_sample);
  r.get("clip_sample_range", c.clip_sample_range);
  r.get("set_alpha_to_one", c.set_alpha_to_one);
  r.get("steps_offset", c.steps_offset);
  r.get("prediction_type", c.prediction_type);
  r.get("thresholding", c.thresholding);
  r.get("dynamic_thresholding_ratio", c.dynamic_thresholding_ratio);
  r.get("sample_max_value", c.sample_max_value);
  r.get("timestep_spacing", c.timestep_spacing);
  return c;
}

json DDIMSchedulerConfig::to_json() const {
  json j;
  j["_class_name"] = "DDIMScheduler";
  write_schedule(j, schedule, trained_betas);
  j["clip_sample"] = clip_sample;
  j["clip_sample_range"] = clip_sample_range;
  j["set_alpha_to_one"] = set_alpha_to_one;
  j["steps_offset"] = steps_offset;
  j["prediction_type"] = to_string(prediction_type);
  j["thresholding"] = thresholding;
  j["dynamic_thresholding_ratio"] = dynamic_thresholding_ratio;
  j["sample_max_value"] = sample_max_value;
  j["timestep_spacing"] = to_string(timestep_spacing);
  return j;
}

DDIMScheduler::DDIMScheduler(const DDIMSchedulerConfig& config) : config_(config) {
  set_prediction_type(config_.prediction_type);
  auto betas = betas_for(config_.schedule, config_.trained_betas);
  alphas_cumprod_ = torch::cumprod(1.0 - betas, 0);
  // The "previous" alpha-bar of the last step: 1 (fully clean) or SD's abar_0.
  final_alpha_cumprod_ = config_.set_alpha_to_one ? 1.0f : item_f(alphas_cumprod_, 0);
}

void DDIMScheduler::set_prediction_type(PredictionType p) {
  if (p == PredictionType::kFlow) throw InputError("DDIMScheduler cannot sample a flow-matching model");
  config_.prediction_type = p;
}

void DDIMScheduler::set_timesteps(int64_t n, const TimestepOptions& options) {
  reject_timestep_options(options, class_name());
  const int64_t T = config_.schedule.num_train_timesteps;
  if (n < 1 || n > T)
    throw InputError("DDIMScheduler: num_inference_steps " + std::to_string(n) + " must be in [1, " +
                     std::to_string(T) + "]");
  auto ts = spaced_timesteps(config_.timestep_spacing, T, n, config_.steps_offset, true);
  std::vector<int64_t> v;
  for (double t : ts) v.push_back(static_cast<int64_t>(t));
  timesteps_ = torch::tensor(v, torch::kLong);
}

StepOutput DDIMScheduler::step(const at::Tensor& model_output, int64_t i, const at::Tensor& sample,
                               at::Generator* generator) const {
  check_step_index(i);
  const int64_t T = config_.schedule.num_train_timesteps;
  const int64_t t = timesteps_[i].item<int64_t>();
  // DDIM steps a fixed stride back, whatever the spacing (diffusers).
  const int64_t prev_t = t - T / timesteps_.size(0);
  TORCH_CHECK(t >= 0 && t < T, "timestep ", t, " outside the training schedule");
  const float alpha_prod_t = item_f(alphas_cumprod_, t);
  const float alpha_prod_t_prev = prev_t >= 0 ? item_f(alphas_cumprod_, prev_t) : final_alpha_cumprod_;
  const float beta_prod_t = 1.0f - alpha_prod_t;

  at::Tensor x0, eps;
  switch (config_.prediction_type) {
    case PredictionType::kEpsilon:
      x0 = (sample - std::sqrt(beta_prod_t) * model_output) / std::sqrt(alpha_prod_t);
      eps = model_output;
      break;
    case PredictionType::kSample:
      x0 = model_output;
      eps = (sample - std::sqrt(alpha_prod_t) * x0) / std::sqrt(beta_prod_t);
      break;
    case PredictionType::kVPrediction:
      x0 = std::sqrt(alpha_prod_t) * sample - std::sqrt(beta_prod_t) * model_output;
      eps = std::sqrt(alpha_prod_t) * model_output + std::sqrt(beta_prod_t) * sample;
      break;
    case PredictionType::kFlow: TORCH_CHECK(false, "unreachable");
  }
  x0 = clip_or_threshold(x0, config_.thresholding, config_.dynamic_thresholding_ratio, config_.sample_max_value,
                         config_.clip_sample, config_.clip_sample_range);

  // sigma_t of formula (16) of Song et al. 2021, scaled by eta.
  const float beta_prod_t_prev = 1.0f - alpha_prod_t_prev;
  const float variance = (beta_prod_t_prev / beta_prod_t) * (1.0f - alpha_prod_t / alpha_prod_t_prev);
  const float std_dev_t = static_cast<float>(eta_) * std::sqrt(variance);
  auto direction = std::sqrt(1.0f - alpha_prod_t_prev - std_dev_t * std_dev_t) * eps;
  auto prev = std::sqrt(alpha_prod_t_prev) * x0 + direction;
  if (eta_ > 0) {
    TORCH_CHECK(generator != nullptr, "DDIMScheduler::step with eta > 0 needs a generator");
    prev = prev + std_dev_t * randn(model_output.sizes(), *generator, model_output.scalar_type(), model_output.device());
  }
  return {prev, x0};
}

json DDIMScheduler::config_json() const { return config_.to_json(); }

// ---- Euler ----

EulerDiscreteSchedulerConfig EulerDiscreteSchedulerConfig::from_json(const json& j) {
  EulerDiscreteSchedulerConfig c;
  ConfigReader r(j);
  r.schedule(c.schedule, c.trained_betas);
  r.get("prediction_type", c.prediction_type);
  r.get("interpolation_type", c.interpolation_type);
  r.get("use_karras_sigmas", c.use_karras_sigmas);
  r.get("use_exponential_sigmas", c.use_exponential_sigmas);
  r.require_default("use_beta_sigmas", false, "beta sigmas need scipy's beta.ppf");
  r.get("sigma_min", c.sigma_min);
  r.get("sigma_max", c.sigma_max);
  r.get("timestep_spacing", c.timestep_spacing);
  r.get("timestep_type", c.timestep_type);
  r.get("steps_offset", c.steps_offset);
  r.get("final_sigmas_type", c.final_sigmas_type);
  if (c.interpolation_type != "linear" && c.interpolation_type != "log_linear")
    throw InputError("scheduler config: interpolation_type '" + c.interpolation_type +
                     "' is not supported (linear, log_linear)");
  if (c.timestep_type != "discrete" && c.timestep_type != "continuous")
    throw InputError("scheduler config: timestep_type '" + c.timestep_type + "' must be discrete or continuous");
  if (c.final_sigmas_type != "zero" && c.final_sigmas_type != "sigma_min")
    throw InputError("scheduler config: final_sigmas_type '" + c.final_sigmas_type + "' must be zero or sigma_min");
  if (c.use_karras_sigmas && c.use_exponential_sigmas)
    throw InputError("scheduler config: only one of use_karras_sigmas and use_exponential_sigmas can be true");
  return c;
}

json EulerDiscreteSchedulerConfig::to_json() const {
  json j;
  j["_class_name"] = "EulerDiscreteScheduler";
  write_schedule(j, schedule, trained_betas);
  j["prediction_type"] = to_string(prediction_type);
  j["interpolation_type"] = interpolation_type;
  j["use_karras_sigmas"] = use_karras_sigmas;
  j["use_exponential_sigmas"] = use_exponential_sigmas;
  j["use_beta_sigmas"] = false;
  j["sigma_min"] = sigma_min ? json(*sigma_min) : json(nullptr);
  j["sigma_max"] = sigma_max ? json(*sigma_max) : json(nullptr);
  j["timestep_spacing"] = to_string(timestep_spacing);
  j["timestep_type"] = timestep_type;
  j["steps_offset"] = steps_offset;
  j["final_sigmas_type"] = final_sigmas_type;
  return j;
}

EulerDiscreteScheduler::EulerDiscreteScheduler(const EulerDiscreteSchedulerConfig& config) : config_(config) {
  set_prediction_type(config_.prediction_type);
  auto betas = betas_for(config_.schedule, config_.trained_betas);
  alphas_cumprod_ = torch::cumprod(1.0 - betas, 0);
  // Zero terminal SNR would make the last sigma infinite; diffusers pins abar_T to 2^-24.
  if (config_.schedule.rescale_betas_zero_snr) alphas_cumprod_[-1] = std::pow(2.0, -24);
  // Training schedule before set_timesteps: all T sigmas, descending, then 0.
  const int64_t T = config_.schedule.num_train_timesteps;
  auto sig = ((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5).flip(0);
  sigmas_ = torch::cat({sig, torch::zeros({1}, torch::kFloat32)});
  auto ts = np_linspace(0, static_cast<double>(T - 1), T);
  std::reverse(ts.begin(), ts.end());
  timesteps_ = f32_tensor(ts);
  if (config_.timestep_type == "continuous" && config_.prediction_type == PredictionType::kVPrediction)
    timesteps_ = 0.25 * sig.log();
}

void EulerDiscreteScheduler::set_prediction_type(PredictionType p) {
  if (p == PredictionType::kFlow) throw InputError("EulerDiscreteScheduler cannot sample a flow-matching model");
  config_.prediction_type = p;
}

void EulerDiscreteScheduler::set_timesteps(int64_t n, const TimestepOptions& options) {
  reject_timestep_options(options, class_name());
  const int64_t T = config_.schedule.num_train_timesteps;
  if (n < 1 || n > T)
    throw InputError("EulerDiscreteScheduler: num_inference_steps " + std::to_string(n) + " must be in [1, " +
                     std::to_string(T) + "]");
  // Timesteps as float32 numpy values.
  std::vector<double> ts = spaced_timesteps(config_.timestep_spacing, T, n, config_.steps_offset, false);
  for (auto& t : ts) t = to_f32(t);

  // Training sigmas (float32, ascending in t) and their float32 logs.
  auto train_sigmas_t = ((1 - alphas_cumprod_) / alphas_cumprod_).pow(0.5);
  std::vector<double> train_sigmas = tensor_to_doubles(train_sigmas_t);
  std::vector<float> log_sigmas(train_sigmas.size());
  for (size_t k = 0; k < train_sigmas.size(); ++k) log_sigmas[k] = std::log(to_f32(train_sigmas[k]));

  std::vector<double> sigmas;
  if (config_.interpolation_type == "linear") {
    for (double t : ts) sigmas.push_back(np_interp_unit_grid(t, train_sigmas));
  } else {
    // log_linear: torch.linspace(log sigma_min, log sigma_max, n + 1).exp() in float32.
    auto l = torch::linspace(static_cast<double>(log_sigmas.back()), static_cast<double>(log_sigmas.front()), n + 1,
                             torch::kFloat32)
                 .exp();
    sigmas = tensor_to_doubles(l);
  }

  // numpy _sigma_to_t: piecewise-linear inverse of log sigma, in float32 like the reference.
  auto sigma_to_t = [&](double sigma) {
    const float log_sigma = to_f32(std::log(std::max(sigma, 1e-10)));
    const auto m = static_cast<int64_t>(log_sigmas.size());
    int64_t low = 0;
    for (int64_t k = 0; k < m; ++k)
      if (log_sigma - log_sigmas[static_cast<size_t>(k)] >= 0) low = k;
    low = std::min(low, m - 2);
    const float lo = log_sigmas[static_cast<size_t>(low)], hi = log_sigmas[static_cast<size_t>(low + 1)];
    float w = (lo - log_sigma) / (lo - hi);
    w = std::min(std::max(w, 0.0f), 1.0f);
    return static_cast<double>(1.0f - w) * static_cast<double>(low) + static_cast<double>(w) * static_cast<double>(low + 1);
  };

  if (config_.use_karras_sigmas || config_.use_exponential_sigmas) {
    const double smin = config_.sigma_min.value_or(sigmas.back());
    const double smax = config_.sigma_max.value_or(sigmas.front());
    std::vector<double> out;
    if (config_.use_karras_sigmas) {
      // Karras et al. 2022 (eq. 5), rho = 7.
      const double rho = 7.0;
      const double min_inv = std::pow(smin, 1 / rho), max_inv = std::pow(smax, 1 / rho);
      for (double r : np_linspace(0, 1, n)) out.push_back(std::pow(max_inv + r * (min_inv - max_inv), rho));
    } else {
      for (double v : np_linspace(std::log(smax), std::log(smin), n)) out.push_back(std::exp(v));
    }
    sigmas = out;
    ts.clear();
    for (double s : sigmas) ts.push_back(to_f32(sigma_to_t(s)));
  }
  const double sigma_last = config_.final_sigmas_type == "sigma_min" ? train_sigmas.front() : 0.0;
  sigmas.push_back(sigma_last);
  sigmas_ = f32_tensor(sigmas);
  if (config_.timestep_type == "continuous" && config_.prediction_type == PredictionType::kVPrediction)
    timesteps_ = 0.25 * sigmas_.slice(0, 0, -1).log();
  else
    timesteps_ = f32_tensor(ts);
}

double EulerDiscreteScheduler::init_noise_sigma() const {
  const float max_sigma = sigmas_.max().item<float>();
  if (config_.timestep_spacing == TimestepSpacing::kLinspace || config_.timestep_spacing == TimestepSpacing::kTrailing)
    return max_sigma;
  return std::sqrt(max_sigma * max_sigma + 1.0f);
}

at::Tensor EulerDiscreteScheduler::scale_model_input(const at::Tensor& sample, int64_t i) const {
  check_step_index(i);
  const float sigma = item_f(sigmas_, i);
  return sample / std::sqrt(sigma * sigma + 1.0f);
}

StepOutput EulerDiscreteScheduler::step(const at::Tensor& model_output, int64_t i, const at::Tensor& sample_in,
                                        at::Generator* /*generator*/) const {
  check_step_index(i);
  auto sample = sample_in.to(at::kFloat);
  const float sigma = item_f(sigmas_, i);
  const float sigma_hat = sigma;  // s_churn = 0: no noise is added back
  at::Tensor x0;
  switch (config_.prediction_type) {
    case PredictionType::kSample: x0 = model_output; break;
    case PredictionType::kEpsilon: x0 = sample - sigma_hat * model_output; break;
    case PredictionType::kVPrediction:
      x0 = model_output * (-sigma / std::sqrt(sigma * sigma + 1.0f)) + (sample / (sigma * sigma + 1.0f));
      break;
    case PredictionType::kFlow: TORCH_CHECK(false, "unreachable");
  }
  // The probability-flow ODE derivative, one Euler step to the next sigma.
  auto derivative = (sample - x0) / sigma_hat;
  const float dt = item_f(sigmas_, i + 1) - sigma_hat;
  auto prev = (sample + derivative * dt).to(model_output.scalar_type());
  return {prev, x0};
}

json EulerDiscreteScheduler::config_json() const { return config_.to_json(); }

// ---- Flow matching ----

FlowMatchEulerDiscreteSchedulerConfig FlowMatchEulerDiscreteSchedulerConfig::from_json(const json& j) {
  FlowMatchEulerDiscreteSchedulerConfig c;
  ConfigReader r(j);
  r.get("num_train_timesteps", c.num_train_timesteps);
  r.get("shift", c.shift);
  r.get("use_dynamic_shifting", c.use_dynamic_shifting);
  r.get("base_shift", c.base_shift);
  r.get("max_shift", c.max_shift);
  r.get("base_image_seq_len", c.base_image_seq_len);
  r.get("max_image_seq_len", c.max_image_seq_len);
  r.get("invert_sigmas", c.invert_sigmas);
  r.get("shift_terminal", c.shift_terminal);
  r.get("use_karras_sigmas", c.use_karras_sigmas);
  r.get("use_exponential_sigmas", c.use_exponential_sigmas);
  r.require_default("use_beta_sigmas", false, "beta sigmas need scipy's beta.ppf");
  r.get("time_shift_type", c.time_shift_type);
  r.get("stochastic_sampling", c.stochastic_sampling);
  if (c.time_shift_type != "exponential" && c.time_shift_type != "linear")
    throw InputError("scheduler config: time_shift_type must be 'exponential' or 'linear'");
  if (c.use_karras_sigmas && c.use_exponential_sigmas)
    throw InputError("scheduler config: only one of use_karras_sigmas and use_exponential_sigmas can be true");
  if (c.num_train_timesteps < 2) throw InputError("scheduler config: num_train_timesteps must be >= 2");
  return c;
}

json FlowMatchEulerDiscreteSchedulerConfig::to_json() const {
  json j;
  j["_class_name"] = "FlowMatchEulerDiscreteScheduler";
  j["num_train_timesteps"] = num_train_timesteps;
  j["shift"] = shift;
  j["use_dynamic_shifting"] = use_dynamic_shifting;
  j["base_shift"] = base_shift;
  j["max_shift"] = max_shift;
  j["base_image_seq_len"] = base_image_seq_len;
  j["max_image_seq_len"] = max_image_seq_len;
  j["invert_sigmas"] = invert_sigmas;
  j["shift_terminal"] = shift_terminal ? json(*shift_terminal) : json(nullptr);
  j["use_karras_sigmas"] = use_karras_sigmas;
  j["use_exponential_sigmas"] = use_exponential_sigmas;
  j["use_beta_sigmas"] = false;
  j["time_shift_type"] = time_shift_type;
  j["stochastic_sampling"] = stochastic_sampling;
  return j;
}

double calculate_shift(int64_t image_seq_len, int64_t base_seq_len, int64_t max_seq_len, double base_shift,
                       double max_shift) {
  const double m = (max_shift - base_shift) / static_cast<double>(max_seq_len - base_seq_len);
  const double b = base_shift - m * static_cast<double>(base_seq_len);
  return static_cast<double>(image_seq_len) * m + b;
}

FlowMatchEulerDiscreteScheduler::FlowMatchEulerDiscreteScheduler(const FlowMatchEulerDiscreteSchedulerConfig& config)
    : config_(config) {
  // Training schedule: sigma = t / T for t = T..1 (float32), statically shifted unless dynamic.
  const int64_t T = config_.num_train_timesteps;
  const auto grid = np_linspace(1, static_cast<double>(T), T);
  std::vector<float> sig(static_cast<size_t>(T));
  const float shift = to_f32(config_.shift), shift_m1 = to_f32(config_.shift - 1);
  for (int64_t k = 0; k < T; ++k) {
    float s = to_f32(grid[static_cast<size_t>(T - 1 - k)]) / static_cast<float>(T);
    if (!config_.use_dynamic_shifting) s = shift * s / (1.0f + shift_m1 * s);
    sig[static_cast<size_t>(k)] = s;
  }
  sigmas_ = torch::tensor(sig, torch::kFloat32);
  timesteps_ = sigmas_ * static_cast<double>(T);
  sigma_min_ = sig.back();
  sigma_max_ = sig.front();
}

void FlowMatchEulerDiscreteScheduler::set_prediction_type(PredictionType p) {
  if (p != PredictionType::kFlow)
    throw InputError(std::string("FlowMatchEulerDiscreteScheduler samples flow-matching models only, not ") +
                     to_string(p));
}

double FlowMatchEulerDiscreteScheduler::mu_for_image_seq_len(int64_t image_seq_len) const {
  return calculate_shift(image_seq_len, config_.base_image_seq_len, config_.max_image_seq_len, config_.base_shift,
                         config_.max_shift);
}

at::Tensor FlowMatchEulerDiscreteScheduler::scale_noise(const at::Tensor& x0, const at::Tensor& noise,
                                                        const at::Tensor& sigma) {
  auto s = sigma.to(x0.device()).to(x0.scalar_type()).flatten();
  while (s.dim() < x0.dim()) s = s.unsqueeze(-1);
  return s * noise + (1.0 - s) * x0;
}

namespace {

// The sigma transforms of set_timesteps, in float64 (numpy default) or float32 (when the caller's
// sigmas were cast to a float32 array), like the reference.
template <typename Real>
std::vector<double> flow_shift_sigmas(const FlowMatchEulerDiscreteSchedulerConfig& c, std::vector<double> in,
                                      std::optional<double> mu) {
  std::vector<Real> s(in.begin(), in.end());
  if (c.use_dynamic_shifting) {
    const Real e = c.time_shift_type == "exponential" ? static_cast<Real>(std::exp(*mu)) : static_cast<Real>(*mu);
    // (1/t - 1)^1: the exponent (sigma = 1.0) leaves the value unchanged.
    for (auto& t : s) t = e / (e + (static_cast<Real>(1) / t - static_cast<Real>(1)));
  } else {
    const Real shift = static_cast<Real>(c.shift), shift_m1 = static_cast<Real>(c.shift - 1);
    for (auto& t : s) t = shift * t / (static_cast<Real>(1) + shift_m1 * t);
  }
  if (c.shift_terminal && *c.shift_terminal != 0 && !s.empty()) {
    // Stretch so that the last sigma lands on shift_terminal.
    const Real scale = (static_cast<Real>(1) - s.back()) / static_cast<Real>(1 - *c.shift_terminal);
    for (auto& t : s) t = static_cast<Real>(1) - ((static_cast<Real>(1) - t) / scale);
  }
  return std::vector<double>(s.begin(), s.end());
}

}  // namespace

void FlowMatchEulerDiscreteScheduler::set_timesteps(int64_t n, const TimestepOptions& options) {
  const auto& c = config_;
  if (c.use_dynamic_shifting && !options.mu)
    throw InputError("FlowMatchEulerDiscreteScheduler: use_dynamic_shifting needs mu (from the image sequence length)");
  const double T = static_cast<double>(c.num_train_timesteps);
  std::vector<double> sig;
  if (options.sigmas.empty()) {
    if (n < 1) throw InputError("FlowMatchEulerDiscreteScheduler: num_inference_steps must be >= 1");
    for (double t : np_linspace(sigma_max_ * T, sigma_min_ * T, n)) sig.push_back(t / T);
    sig = flow_shift_sigmas<double>(c, sig, options.mu);
  } else {
    if (n > 0 && static_cast<int64_t>(options.sigmas.size()) != n)
      throw InputError("FlowMatchEulerDiscreteScheduler: " + std::to_string(options.sigmas.size()) +
                       " sigmas given for " + std::to_string(n) + " steps");
    for (double s : options.sigmas) sig.push_back(to_f32(s));
    sig = flow_shift_sigmas<float>(c, sig, options.mu);
  }
  const auto steps = static_cast<int64_t>(sig.size());
  if (c.use_karras_sigmas || c.use_exponential_sigmas) {
    const double smin = sig.back(), smax = sig.front();
    std::vector<double> out;
    if (c.use_karras_sigmas) {
      const double rho = 7.0;
      const double min_inv = std::pow(smin, 1 / rho), max_inv = std::pow(smax, 1 / rho);
      for (double r : np_linspace(0, 1, steps)) out.push_back(std::pow(max_inv + r * (min_inv - max_inv), rho));
    } else {
      for (double v : np_linspace(std::log(smax), std::log(smin), steps)) out.push_back(std::exp(v));
    }
    sig = out;
  }
  auto s = f32_tensor(sig);
  if (c.invert_sigmas) {
    s = 1.0 - s;
    timesteps_ = s * T;
    sigmas_ = torch::cat({s, torch::ones({1}, torch::kFloat32)});
  } else {
    timesteps_ = s * T;
    sigmas_ = torch::cat({s, torch::zeros({1}, torch::kFloat32)});
  }
}

StepOutput FlowMatchEulerDiscreteScheduler::step(const at::Tensor& model_output, int64_t i, const at::Tensor& sample_in,
                                                 at::Generator* generator) const {
  check_step_index(i);
  auto sample = sample_in.to(at::kFloat);
  const float sigma = item_f(sigmas_, i), sigma_next = item_f(sigmas_, i + 1);
  at::Tensor prev;
  if (config_.stochastic_sampling) {
    TORCH_CHECK(generator != nullptr, "stochastic flow sampling needs a generator");
    auto x0 = sample - sigma * model_output;
    auto noise = randn(sample.sizes(), *generator, sample.scalar_type(), sample.device());
    prev = (1.0f - sigma_next) * x0 + sigma_next * noise;
  } else {
    // x_{next} = x + (sigma_next - sigma) * v, v = noise - x0.
    prev = sample + (sigma_next - sigma) * model_output;
  }
  return {prev.to(model_output.scalar_type()), at::Tensor()};
}

json FlowMatchEulerDiscreteScheduler::config_json() const { return config_.to_json(); }

// ---- UniPC multistep, flow sigmas ----

UniPCMultistepSchedulerConfig UniPCMultistepSchedulerConfig::from_json(const json& j) {
  UniPCMultistepSchedulerConfig c;
  ConfigReader r(j);
  r.get("num_train_timesteps", c.num_train_timesteps);
  r.get("solver_order", c.solver_order);
  r.get("flow_shift", c.flow_shift);
  r.get("solver_type", c.solver_type);
  r.get("lower_order_final", c.lower_order_final);
  r.get("final_sigmas_type", c.final_sigmas_type);
  r.get("disable_corrector", c.disable_corrector);
  const char* flow_only = "lora-train's UniPC samples flow-matching models (Wan) only";
  if (const json* v = r.find("use_flow_sigmas"); !v || *v != json(true))
    throw InputError(std::string("scheduler config: UniPCMultistepScheduler needs use_flow_sigmas: true (") + flow_only + ")");
  if (const json* v = r.find("prediction_type"); !v || *v != json("flow_prediction"))
    throw InputError(std::string("scheduler config: UniPCMultistepScheduler needs prediction_type: flow_prediction (") +
                     flow_only + ")");
  r.require_default("predict_x0", true, "UniPC's flow_prediction predicts x0");
  r.require_default("use_dynamic_shifting", false, "a static flow_shift only");
  r.require_default("shift_terminal", nullptr, "a static flow_shift only");
  r.require_default("thresholding", false, "dynamic thresholding is for pixel-space models");
  r.require_default("solver_p", nullptr, "the B(h) predictor only");
  for (const char* key : {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas"})
    r.require_default(key, false, "flow sigmas only");
  if (c.solver_type == "midpoint" || c.solver_type == "heun" || c.solver_type == "logrho") c.solver_type = "bh2";
  if (c.solver_type != "bh1" && c.solver_type != "bh2")
    throw InputError("scheduler config: solver_type must be bh1 or bh2, got '" + c.solver_type + "'");
  if (c.final_sigmas_type != "zero" && c.final_sigmas_type != "sigma_min")
    throw InputError("scheduler config: final_sigmas_type must be zero or sigma_min, got '" + c.final_sigmas_type + "'");
  if (c.solver_order < 1 || c.solver_order > 3) throw InputError("scheduler config: solver_order must be 1, 2 or 3");
  if (c.num_train_timesteps < 2) throw InputError("scheduler config: num_train_timesteps must be >= 2");
  if (!(c.flow_shift > 0)) throw InputError("scheduler config: flow_shift must be > 0");
  return c;
}

json UniPCMultistepSchedulerConfig::to_json() const {
  json j;
  j["_class_name"] = "UniPCMultistepScheduler";
  j["num_train_timesteps"] = num_train_timesteps;
  j["solver_order"] = solver_order;
  j["prediction_type"] = "flow_prediction";
  j["predict_x0"] = true;
  j["use_flow_sigmas"] = true;
  j["flow_shift"] = flow_shift;
  j["solver_type"] = solver_type;
  j["lower_order_final"] = lower_order_final;
  j["final_sigmas_type"] = final_sigmas_type;
  j["disable_corrector"] = disable_corrector;
  j["use_dynamic_shifting"] = false;
  return j;
}

UniPCMultistepScheduler::UniPCMultistepScheduler(const UniPCMultistepSchedulerConfig& config) : config_(config) {}

void UniPCMultistepScheduler::set_prediction_type(PredictionType p) {
  if (p != PredictionType::kFlow)
    throw InputError(std::string("UniPCMultistepScheduler (flow sigmas) samples flow-matching models only, not ") +
                     to_string(p));
}

void UniPCMultistepScheduler::set_timesteps(int64_t n, const TimestepOptions& options) {
  if (options.mu) throw InputError("UniPCMultistepScheduler: dynamic shifting (mu) is not supported");
  const double T = static_cast<double>(config_.num_train_timesteps);
  // numpy float64: linspace(1, 1/T, N + 1)[:-1], shifted; the first sigma kept just below 1 so
  // that log(alpha) stays finite.
  std::vector<double> sig = options.sigmas;
  if (sig.empty()) {
    if (n < 1) throw InputError("UniPCMultistepScheduler: num_inference_steps must be >= 1");
    sig = np_linspace(1, 1 / T, n + 1);
    sig.pop_back();
  }
  const double shift = config_.flow_shift;
  for (auto& v : sig) v = shift * v / (1 + (shift - 1) * v);
  if (std::fabs(sig[0] - 1) < 1e-6) sig[0] -= 1e-6;
  std::vector<int64_t> ts;
  for (double v : sig) ts.push_back(static_cast<int64_t>(v * T));  // astype(int64): truncation
  const double last = config_.final_sigmas_type == "zero" ? 0.0 : sig.back();
  sig.push_back(last);
  sigmas_ = f32_tensor(sig);
  timesteps_ = torch::tensor(ts, torch::kInt64);
  model_outputs_.clear();
  last_sample_ = at::Tensor();
  lower_order_nums_ = 0;
  this_order_ = 0;
  next_step_ = 0;
}

at::Tensor UniPCMultistepScheduler::lambda(int64_t k) const {
  const at::Tensor sigma = sigmas_[k];
  return at::log(1 - sigma) - at::log(sigma);
}

namespace {

// The B(h) coefficients of a UniPC update from step size h (float32 0-dim tensors, as the
// reference): h_phi_1 = expm1(-h), B_h, and the right-hand side b of the order conditions.
struct UniCoefficients {
  at::Tensor h_phi_1, B_h, R, b;
};

UniCoefficients uni_coefficients(const at::Tensor& h, const std::vector<at::Tensor>& rks_in, int64_t order,
                                 const std::string& solver_type) {
  std::vector<at::Tensor> rks = rks_in;
  rks.push_back(torch::ones({}, h.options()));
  const at::Tensor r = torch::stack(rks);
  const at::Tensor hh = -h;  // predict_x0
  UniCoefficients c;
  c.h_phi_1 = torch::expm1(hh);
  at::Tensor h_phi_k = c.h_phi_1 / hh - 1;
  int64_t factorial = 1;
  c.B_h = solver_type == "bh1" ? hh : torch::expm1(hh);
  std::vector<at::Tensor> R, b;
  for (int64_t k = 1; k <= order; ++k) {
    R.push_back(torch::pow(r, k - 1));
    b.push_back(h_phi_k * static_cast<double>(factorial) / c.B_h);
    factorial *= k + 1;
    h_phi_k = h_phi_k / hh - 1.0 / static_cast<double>(factorial);
  }
  c.R = torch::stack(R);
  c.b = torch::stack(b);
  return c;
}

// sum_k rho[k] * D[k] (the reference's einsum "k,bkc...->bc...").
at::Tensor weighted_sum(const at::Tensor& rho, const std::vector<at::Tensor>& D) {
  at::Tensor out = rho[0] * D[0];
  for (size_t k = 1; k < D.size(); ++k) out = out + rho[static_cast<int64_t>(k)] * D[k];
  return out;
}

}  // namespace

at::Tensor UniPCMultistepScheduler::predictor(const at::Tensor& x, int64_t i, int64_t order) const {
  const auto device = x.device();
  const at::Tensor& m0 = model_outputs_.back();
  const at::Tensor sigma_t = sigmas_[i + 1].to(device), sigma_s0 = sigmas_[i].to(device);
  const at::Tensor alpha_t = 1 - sigma_t;
  const at::Tensor lambda_s0 = lambda(i).to(device);
  const at::Tensor h = lambda(i + 1).to(device) - lambda_s0;
  std::vector<at::Tensor> rks, D1s;
  for (int64_t k = 1; k < order; ++k) {
    const at::Tensor rk = (lambda(i - k).to(device) - lambda_s0) / h;
    rks.push_back(rk);
    D1s.push_back((model_outputs_[model_outputs_.size() - 1 - static_cast<size_t>(k)] - m0) / rk);
  }
  const UniCoefficients c = uni_coefficients(h, rks, order, config_.solver_type);
  at::Tensor x_t = sigma_t / sigma_s0 * x - alpha_t * c.h_phi_1 * m0;
  if (!D1s.empty()) {
    // Order 2 uses rho = 0.5, as the reference does, rather than solving the 1x1 system.
    const at::Tensor rhos = order == 2 ? torch::full({1}, 0.5, x.options())
                                       : at::linalg_solve(c.R.slice(0, 0, -1).slice(1, 0, -1), c.b.slice(0, 0, -1))
                                             .to(x.scalar_type());
    x_t = x_t - alpha_t * c.B_h * weighted_sum(rhos, D1s);
  }
  return x_t.to(x.scalar_type());
}

at::Tensor UniPCMultistepScheduler::corrector(const at::Tensor& model_t, const at::Tensor& x, const at::Tensor& this_sample,
                                              int64_t i, int64_t order) const {
  const auto device = this_sample.device();
  const at::Tensor& m0 = model_outputs_.back();
  const at::Tensor sigma_t = sigmas_[i].to(device), sigma_s0 = sigmas_[i - 1].to(device);
  const at::Tensor alpha_t = 1 - sigma_t;
  const at::Tensor lambda_s0 = lambda(i - 1).to(device);
  const at::Tensor h = lambda(i).to(device) - lambda_s0;
  std::vector<at::Tensor> rks, D1s;
  for (int64_t k = 1; k < order; ++k) {
    const at::Tensor rk = (lambda(i - (k + 1)).to(device) - lambda_s0) / h;
    rks.push_back(rk);
    D1s.push_back((model_outputs_[model_outputs_.size() - 1 - static_cast<size_t>(k)] - m0) / rk);
  }
  const UniCoefficients c = uni_coefficients(h, rks, order, config_.solver_type);
  const at::Tensor rhos =
      order == 1 ? torch::full({1}, 0.5, x.options()) : at::linalg_solve(c.R, c.b).to(x.scalar_type());
  at::Tensor correction = rhos[-1] * (model_t - m0);
  if (!D1s.empty()) correction = weighted_sum(rhos.slice(0, 0, -1), D1s) + correction;
  const at::Tensor x_t = sigma_t / sigma_s0 * x - alpha_t * c.h_phi_1 * m0 - alpha_t * c.B_h * correction;
  return x_t.to(x.scalar_type());
}

StepOutput UniPCMultistepScheduler::step(const at::Tensor& model_output, int64_t i, const at::Tensor& sample_in,
                                         at::Generator*) const {
  check_step_index(i);
  TORCH_CHECK(i == next_step_, "UniPCMultistepScheduler: step ", i, " out of order (the multistep history expects step ",
              next_step_, "; call set_timesteps() to start again)");
  at::Tensor sample = sample_in.to(at::kFloat);
  // flow_prediction with predict_x0: the model's x0 estimate.
  const at::Tensor model_x0 = sample - sigmas_[i].to(sample.device()) * model_output.to(at::kFloat);
  const bool disabled = std::find(config_.disable_corrector.begin(), config_.disable_corrector.end(), i - 1) !=
                        config_.disable_corrector.end();
  if (i > 0 && !disabled && last_sample_.defined()) {
    sample = corrector(model_x0, last_sample_, sample, i, this_order_);
  }
  model_outputs_.push_back(model_x0);
  if (static_cast<int64_t>(model_outputs_.size()) > config_.solver_order) model_outputs_.erase(model_outputs_.begin());
  const int64_t n = timesteps_.size(0);
  const int64_t order = config_.lower_order_final ? std::min(config_.solver_order, n - i) : config_.solver_order;
  this_order_ = std::min(order, lower_order_nums_ + 1);  // warm-up: one more previous output per step
  last_sample_ = sample;
  at::Tensor prev = predictor(sample, i, this_order_);
  if (lower_order_nums_ < config_.solver_order) ++lower_order_nums_;
  next_step_ = i + 1;
  return {prev.to(model_output.scalar_type()), model_x0};
}

json UniPCMultistepScheduler::config_json() const { return config_.to_json(); }

// ---- Construction ----

SamplerKind sampler_kind_from_name(std::string_view raw) {
  const std::string name = to_lower(trim(raw));
  if (name == "ddpm" || name == "ddpmscheduler") return SamplerKind::kDDPM;
  if (name == "ddim" || name == "ddimscheduler") return SamplerKind::kDDIM;
  if (name == "euler" || name == "k_euler" || name == "eulerdiscretescheduler") return SamplerKind::kEuler;
  if (name == "flowmatch" || name == "flow_match" || name == "flowmatch_euler" ||
      name == "flowmatcheulerdiscretescheduler")
    return SamplerKind::kFlowMatch;
  if (name == "unipc" || name == "unipcmultistepscheduler") return SamplerKind::kUniPC;
  static const std::vector<std::string> kKnownElsewhere = {
      "euler_a", "k_euler_a", "pndm", "lms", "k_lms", "heun", "k_heun", "dpm_2", "k_dpm_2", "dpm_2_a", "k_dpm_2_a",
      "dpmsolver", "dpmsolver++", "k_dpmsolver", "k_dpmsolver++", "dpmsingle", "k_dpmsingle", "lcm", "custom_lcm",
      "mean_flow", "dpm++", "dpm++_2m", "dpmsolver++_2m", "euler_ancestral", "pndmscheduler"};
  const std::string supported = "supported: ddpm, ddim, euler, flowmatch, unipc";
  for (const auto& k : kKnownElsewhere)
    if (name == k) throw InputError("sampler '" + std::string(raw) + "' is not implemented in lora-train (" + supported + ")");
  std::string msg = "unknown sampler '" + std::string(raw) + "' (" + supported + ")";
  if (auto m = closest_match(name, {"ddpm", "ddim", "euler", "flowmatch", "unipc"})) msg += "; did you mean '" + *m + "'?";
  throw InputError(msg);
}

const char* to_string(SamplerKind k) {
  switch (k) {
    case SamplerKind::kDDPM: return "ddpm";
    case SamplerKind::kDDIM: return "ddim";
    case SamplerKind::kEuler: return "euler";
    case SamplerKind::kFlowMatch: return "flowmatch";
    case SamplerKind::kUniPC: return "unipc";
  }
  return "?";
}

std::unique_ptr<Scheduler> make_scheduler(SamplerKind kind, const json& config) {
  switch (kind) {
    case SamplerKind::kDDPM: return std::make_unique<DDPMScheduler>(DDPMSchedulerConfig::from_json(config));
    case SamplerKind::kDDIM: return std::make_unique<DDIMScheduler>(DDIMSchedulerConfig::from_json(config));
    case SamplerKind::kEuler:
      return std::make_unique<EulerDiscreteScheduler>(EulerDiscreteSchedulerConfig::from_json(config));
    case SamplerKind::kFlowMatch:
      return std::make_unique<FlowMatchEulerDiscreteScheduler>(FlowMatchEulerDiscreteSchedulerConfig::from_json(config));
    case SamplerKind::kUniPC:
      return std::make_unique<UniPCMultistepScheduler>(UniPCMultistepSchedulerConfig::from_json(config));
  }
  throw InputError("unknown sampler kind");
}

std::unique_ptr<Scheduler> make_scheduler_from_config(const json& config) {
  if (!config.is_object() || !config.contains("_class_name") || !config["_class_name"].is_string())
    throw InputError("scheduler config has no _class_name; name the sampler explicitly");
  return make_scheduler(sampler_kind_from_name(config["_class_name"].get<std::string>()), config);
}

std::unique_ptr<Scheduler> load_scheduler(const std::filesystem::path& path, std::optional<SamplerKind> kind) {
  std::ifstream in(path);
  if (!in) throw InputError("cannot open scheduler config " + path.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw InputError(path.string() + ": invalid JSON: " + printable(e.what()));
  }
  try {
    return kind ? make_scheduler(*kind, j) : make_scheduler_from_config(j);
  } catch (const InputError& e) {
    throw InputError(path.string() + ": " + printable(e.what()));
  }
}

json default_scheduler_config(std::string_view family) {
  const std::string f = to_lower(family);
  // SD 1.x/2.x/XL share the latent-diffusion schedule; the reference repos ship it with
  // steps_offset 1, leading spacing and set_alpha_to_one false.
  auto ldm = [](const char* cls, const char* prediction) {
    return json{{"_class_name", cls},
                {"num_train_timesteps", 1000},
                {"beta_start", 0.00085},
                {"beta_end", 0.012},
                {"beta_schedule", "scaled_linear"},
                {"clip_sample", false},
                {"set_alpha_to_one", false},
                {"steps_offset", 1},
                {"timestep_spacing", "leading"},
                {"prediction_type", prediction},
                {"interpolation_type", "linear"},
                {"use_karras_sigmas", false}};
  };
  if (f == "sd15" || f == "sd1" || f == "sd") return ldm("DDIMScheduler", "epsilon");
  if (f == "sd15_v" || f == "sd2_v" || f == "sd2") return ldm("DDIMScheduler", "v_prediction");
  if (f == "sdxl") return ldm("EulerDiscreteScheduler", "epsilon");
  if (f == "flux" || f == "flux_dev")
    return json{{"_class_name", "FlowMatchEulerDiscreteScheduler"}, {"num_train_timesteps", 1000},
                {"shift", 3.0},          {"use_dynamic_shifting", true},
                {"base_shift", 0.5},     {"max_shift", 1.15},
                {"base_image_seq_len", 256}, {"max_image_seq_len", 4096}};
  if (f == "flux_schnell")
    return json{{"_class_name", "FlowMatchEulerDiscreteScheduler"}, {"num_train_timesteps", 1000},
                {"shift", 1.0}, {"use_dynamic_shifting", false}};
  if (f == "wan" || f == "wan21") {
    // Wan-AI/Wan2.1-T2V-*-Diffusers' UniPCMultistepScheduler (flow sigmas shifted by 3.0), with
    // the flow-match Euler keys of AI Toolkit's Wan 2.1 scheduler (shift 3.0) beside it: each
    // class reads its own keys, so both samplers build from this one config.
    return json{{"_class_name", "UniPCMultistepScheduler"}, {"num_train_timesteps", 1000},
                {"solver_order", 2}, {"prediction_type", "flow_prediction"},
                {"predict_x0", true}, {"solver_type", "bh2"},
                {"lower_order_final", true}, {"final_sigmas_type", "zero"},
                {"use_flow_sigmas", true}, {"flow_shift", 3.0},
                {"shift", 3.0}, {"use_dynamic_shifting", false}};
  }
  throw InputError("no default scheduler for model family '" + std::string(family) +
                   "' (sd15, sd15_v, sdxl, flux, flux_schnell, wan)");
}

}  // namespace lt::sample
