// Scheduler parity with diffusers 0.38: every case under <parity>/schedulers (tests/fixtures/parity
// or $LT_PARITY_DIR) is run as its meta.json `call` describes and compared within its tolerance
// ("float32 outputs to 1e-6 relative; int timesteps exactly"). A case of a class not implemented
// here is reported as skipped.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <regex>

#include "loratrain/io/safetensors.h"
#include "loratrain/sample/scheduler.h"
#include "test_support.h"

namespace fs = std::filesystem;
using namespace lt::sample;
using nlohmann::json;

using lt::test::read_json;

namespace {

constexpr double kRtol = 1e-6;

fs::path parity_dir() {
  if (const char* env = std::getenv("LT_PARITY_DIR"); env && *env) return fs::path(env);
  return lt::test::fixtures_dir() / "parity";
}

// Float tensors: |got - ref| <= rtol * |ref| elementwise, with an absolute floor of rtol times the
// tensor's largest magnitude (elements near zero carry the absolute error of their neighbours).
// Integer tensors: exact.
void compare(const std::string& what, const at::Tensor& got_in, const at::Tensor& ref) {
  CATCH_INFO(what);
  auto got = got_in.cpu();
  CATCH_REQUIRE(got.sizes() == ref.sizes());
  if (!at::isFloatingType(ref.scalar_type())) {
    CATCH_CHECK(torch::equal(got.to(at::kLong), ref.to(at::kLong)));
    return;
  }
  auto g = got.to(at::kDouble), r = ref.to(at::kDouble);
  const double scale = r.numel() ? r.abs().max().item<double>() : 0.0;
  auto diff = (g - r).abs();
  auto bound = kRtol * r.abs() + kRtol * scale;
  const double worst = (diff - bound).max().item<double>();
  CATCH_INFO("max abs diff " << diff.max().item<double>() << ", max |ref| " << scale);
  CATCH_CHECK(worst <= 0);
}

int64_t call_int(const std::string& call, const std::string& pattern) {
  std::smatch m;
  CATCH_REQUIRE(std::regex_search(call, m, std::regex(pattern)));
  return std::stoll(m[1].str());
}

void run_case(const fs::path& dir, const json& meta, int& run, std::vector<std::string>& skipped) {
  const std::string cls = meta.at("class").get<std::string>();
  const std::string call = meta.at("call").get<std::string>();
  const json config = read_json(dir / "config.json");
  auto io = lt::io::SafetensorsFile::open(dir / "io.safetensors");
  auto in = [&](const std::string& n) { return io->load(n); };
  CATCH_INFO("case " << dir.filename().string() << ": " << call);

  if (cls == "DDPMScheduler") {
    DDPMScheduler s(DDPMSchedulerConfig::from_json(config));
    compare("betas", s.betas(), in("out.betas"));
    compare("alphas_cumprod", s.alphas_cumprod(), in("out.alphas_cumprod"));
    compare("noisy_samples", s.add_noise(in("in.original_samples"), in("in.noise"), in("in.timesteps")),
            in("out.noisy_samples"));
    // The training-side schedule must be the same table.
    NoiseSchedule ns({s.config().schedule});
    compare("NoiseSchedule.add_noise", ns.add_noise(in("in.original_samples"), in("in.noise"), in("in.timesteps")),
            in("out.noisy_samples"));
  } else if (cls == "DDIMScheduler") {
    auto sched = make_scheduler(SamplerKind::kDDIM, config);
    auto& s = dynamic_cast<DDIMScheduler&>(*sched);
    s.set_timesteps(call_int(call, R"(set_timesteps\((\d+)\))"));
    compare("timesteps", s.timesteps(), in("out.timesteps"));
    compare("alphas_cumprod", s.alphas_cumprod(), in("out.alphas_cumprod"));
    auto o = s.step(in("in.model_output"), in("in.step_index").item<int64_t>(), in("in.sample"));
    compare("prev_sample", o.prev_sample, in("out.step.prev_sample"));
    compare("pred_original_sample", o.pred_original_sample, in("out.step.pred_original_sample"));
  } else if (cls == "EulerDiscreteScheduler") {
    auto sched = make_scheduler_from_config(config);
    auto& s = *sched;
    s.set_timesteps(call_int(call, R"(set_timesteps\((\d+)\))"));
    compare("timesteps", s.timesteps(), in("out.timesteps"));
    compare("sigmas", s.sigmas(), in("out.sigmas"));
    compare("init_noise_sigma", torch::tensor(static_cast<float>(s.init_noise_sigma())), in("out.init_noise_sigma"));
    const int64_t i = in("in.step_index").item<int64_t>();
    compare("scaled_model_input", s.scale_model_input(in("in.sample"), i), in("out.scaled_model_input"));
    auto o = s.step(in("in.model_output"), i, in("in.sample"));
    compare("prev_sample", o.prev_sample, in("out.step.prev_sample"));
    compare("pred_original_sample", o.pred_original_sample, in("out.step.pred_original_sample"));
  } else if (cls == "FlowMatchEulerDiscreteScheduler") {
    FlowMatchEulerDiscreteScheduler s(FlowMatchEulerDiscreteSchedulerConfig::from_json(config));
    if (io->contains("in.image_seq_len")) {
      // Flux pipeline: sigmas = linspace(1, 1/N, N), mu from the image sequence length.
      const int64_t n = call_int(call, R"(np\.linspace\(1\.0, 1/\d+, (\d+)\))");
      std::vector<double> sig;
      for (int64_t k = 0; k < n; ++k) sig.push_back(1.0 + static_cast<double>(k) * ((1.0 / n - 1.0) / (n - 1)));
      sig.back() = 1.0 / static_cast<double>(n);
      auto lens = in("in.image_seq_len");
      std::vector<float> mus;
      for (int64_t k = 0; k < lens.numel(); ++k) {
        const double mu = s.mu_for_image_seq_len(lens[k].item<int64_t>());
        mus.push_back(static_cast<float>(mu));
        s.set_timesteps(n, TimestepOptions{mu, sig});
        compare("seq" + std::to_string(k) + ".timesteps", s.timesteps(), in("out.seq" + std::to_string(k) + ".timesteps"));
        compare("seq" + std::to_string(k) + ".sigmas", s.sigmas(), in("out.seq" + std::to_string(k) + ".sigmas"));
      }
      compare("mu", torch::tensor(mus), in("out.mu"));
      auto o = s.step(in("in.model_output"), 0, in("in.sample"));
      compare("prev_sample", o.prev_sample, in("out.step.prev_sample"));
    } else {
      s.set_timesteps(call_int(call, R"(set_timesteps\((\d+)\))"));
      compare("timesteps", s.timesteps(), in("out.timesteps"));
      compare("sigmas", s.sigmas(), in("out.sigmas"));
      auto o = s.step(in("in.model_output"), in("in.step_index").item<int64_t>(), in("in.sample"));
      compare("prev_sample", o.prev_sample, in("out.step.prev_sample"));
    }
  } else {
    skipped.push_back(dir.filename().string() + " (" + cls + ")");
    return;
  }
  ++run;
}

}  // namespace

CATCH_TEST_CASE("scheduler parity with diffusers fixtures", "[sample][parity]") {
  const fs::path root = parity_dir() / "schedulers";
  if (!fs::exists(root)) {
    CATCH_WARN("no scheduler fixtures at " << root.string() << "; parity skipped");
    return;
  }
  std::vector<fs::path> cases;
  for (auto& e : fs::directory_iterator(root))
    if (e.is_directory() && fs::exists(e.path() / "meta.json")) cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());
  CATCH_REQUIRE(!cases.empty());
  int run = 0;
  std::vector<std::string> skipped;
  for (const auto& dir : cases) run_case(dir, read_json(dir / "meta.json"), run, skipped);
  for (const auto& s : skipped) CATCH_WARN("skipped scheduler case " << s);
  CATCH_CHECK(run + static_cast<int>(skipped.size()) == static_cast<int>(cases.size()));
  CATCH_CHECK(run > 0);
}
