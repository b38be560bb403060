// lora-train plan CONFIG.yaml [--set KEY=VALUE ...] [--vram 24GiB] [--fit FIXED.yaml] [--json]
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <torch/cuda.h>

#include <iostream>

#include "commands.h"
#include "loratrain/config/config.h"
#include "loratrain/memory/device_memory.h"
#include "loratrain/plan/plan.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::cli {

namespace {

struct Budget {
  std::optional<int64_t> bytes;
  std::string source;  // "--vram", "memory.simulate_vram", "free memory of cuda:0 (...)", ...
};

// --vram, else what `run` would have: the simulated VRAM or the CUDA device's free memory (under
// memory.vram_limit), else the host's available RAM on the CPU. None for a CUDA config on a
// machine without CUDA.
Budget find_budget(const config::ProcessConfig& p, const std::string& vram) {
  if (!vram.empty()) {
    auto bytes = parse_byte_size(vram);
    if (!bytes || *bytes <= 0) throw InputError("--vram '" + vram + "': expected a size such as 24GiB or 8000MiB");
    return {*bytes, "--vram"};
  }
  std::string device = to_lower(p.device);
  if (device == "auto") device = torch::cuda::is_available() ? "cuda" : "cpu";
  if (device != "cpu" && !torch::cuda::is_available()) return {std::nullopt, "device " + p.device + " is not available here"};
  memory::DeviceMemoryOptions options;
  options.device = device;
  options.simulate_vram = device == "cpu" ? p.memory.simulate_vram.bytes : 0;
  options.vram_limit = device == "cpu" ? 0 : p.memory.vram_limit.bytes;
  auto memory = memory::make_device_memory(options);
  const memory::FreeTotal ft = memory->free_and_total();
  return {ft.free, "free memory of " + memory->name()};
}

int plan_command(const std::string& config_path, const std::vector<std::string>& overrides, const std::string& vram,
                 const std::string& fit_path, bool json) {
  const config::JobConfig job = config::load_config(config_path, overrides);
  const config::ProcessConfig& p = config::the_process(job);
  std::optional<int> compute_bytes;
  // The trainer computes in fp32 on a CPU without bf16 instructions.
  const std::string dtype = config::canonical_dtype(p.train.dtype);
  if (to_lower(p.device) == "cpu" && dtype == "bf16" && train::cpu_bf16_instructions().empty()) compute_bytes = 4;
  const auto planner = plan::Planner::from_config(job, compute_bytes);
  const Budget budget = find_budget(p, vram);
  const plan::Prediction prediction = planner->predict(planner->configured());

  std::optional<plan::FitResult> fitted;
  if (!fit_path.empty()) {
    if (!budget.bytes) throw InputError("--fit needs a VRAM budget: " + budget.source + "; pass --vram");
    fitted = plan::fit(*planner, planner->configured(), *budget.bytes);
    if (fitted->fits) config::write_effective_yaml(playbook::config_with_settings(job, fitted->settings), fit_path);
  }
  const bool fits = fitted ? fitted->fits : (!budget.bytes || prediction.fits(*budget.bytes));

  if (json) {
    nlohmann::json j = plan::to_json(prediction, budget.bytes);
    j["family"] = planner->family();
    j["shapes"] = planner->shapes_source();
    if (fitted) {
      nlohmann::json changes = nlohmann::json::array();
      for (const auto& c : fitted->changes) {
        changes.push_back({{"action", c.kind}, {"description", c.description}, {"phase", playbook::to_string(c.phase)},
                           {"peak_before", c.peak_before}, {"peak_after", c.peak_after}});
      }
      nlohmann::json skipped = nlohmann::json::array();
      for (const auto& c : fitted->skipped) {
        skipped.push_back({{"action", c.kind}, {"description", c.description}, {"phase", playbook::to_string(c.phase)},
                           {"peak_bytes", c.peak_before}});
      }
      j["fit"] = {{"fits", fitted->fits}, {"changes", changes}, {"skipped", skipped}, {"prediction", plan::to_json(fitted->prediction, budget.bytes)}};
      if (fitted->fits) j["fit"]["config"] = fit_path;
    }
    std::cout << j.dump(2) << "\n";
  } else {
    std::cout << fmt::format("plan for {} ({})\n{}\n{}\n", config_path, planner->describe(), planner->shapes_source(),
                             plan::format_table(prediction, budget.bytes));
    if (budget.bytes) {
      std::cout << fmt::format("VRAM {} ({}): {}, predicted peak {}\n", format_bytes(*budget.bytes), budget.source,
                               prediction.fits(*budget.bytes) ? "fits" : "does NOT fit", format_bytes(prediction.peak()));
    } else {
      std::cout << fmt::format("no VRAM budget known ({}): pass --vram to check the fit\n", budget.source);
    }
    if (fitted) {
      for (const auto& c : fitted->changes) {
        std::cout << fmt::format("  change ({} predicted {} -> {}): {}\n", playbook::to_string(c.phase),
                                 format_bytes(c.peak_before), format_bytes(c.peak_after), c.description);
      }
      for (const auto& c : fitted->skipped) {
        std::cout << fmt::format("  skipped ({} predicted {} either way): {}\n", playbook::to_string(c.phase),
                                 format_bytes(c.peak_before), c.description);
      }
      if (fitted->fits) {
        std::cout << fmt::format("fits after {} change(s), predicted peak {}: written to {}\n", fitted->changes.size(),
                                 format_bytes(fitted->prediction.peak()), fit_path);
      } else {
        std::cout << fmt::format("does not fit even with every lever ({}); nothing written\n",
                                 summarize(fitted->settings));
      }
    }
  }
  return fits ? 0 : static_cast<int>(ExitCode::kOomExhausted);
}

}  // namespace

void add_plan_command(CLI::App& app, Action& chosen) {
  auto* sub = app.add_subcommand("plan", "Predict peak memory per phase for a config, without loading weights");
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string vram;
    std::string fit;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  sub->add_option("config", args->config, "the job config (YAML)")->required();
  sub->add_option("--set", args->overrides, "override a config key, e.g. --set train.batch_size=2 (repeatable)");
  sub->add_option("--vram", args->vram,
                  "the memory to fit in, e.g. 24GiB (default: the device's free memory; on the CPU the simulated VRAM, "
                  "else the available RAM)");
  sub->add_option("--fit", args->fit,
                  "apply the OOM guard's ladder in the planner until the config fits and write it here");
  sub->add_flag("--json", args->json, "print the prediction as JSON");
  sub->callback([&chosen, args] {
    chosen = [args] { return plan_command(args->config, args->overrides, args->vram, args->fit, args->json); };
  });
}

}  // namespace lt::cli
