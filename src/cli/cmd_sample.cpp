// lora-train sample [CONFIG.yaml] --lora FILE [--lora FILE ...] [--multiplier M ...] [--prompt TEXT ...]
//                   [--seed N] [--steps N] [--model PATH] [--output DIR] [--set KEY=VALUE ...]
#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"

namespace lt::cli {

void add_sample_command(CLI::App& app, Action& chosen) {
  auto* sub = app.add_subcommand(
      "sample", "Generate images with trained LoRA/LoKr/LoHa files, through the training previews' sampler");
  struct Args {
    std::string config;
    std::string model;
    std::vector<std::string> loras;
    std::vector<double> multipliers;
    std::vector<std::string> prompts;
    int64_t seed = 0;
    int64_t steps = 0;
    std::string output;
    std::vector<std::string> overrides;
  };
  auto args = std::make_shared<Args>();
  sub->add_option("config", args->config, "a run config: its model, sampler, size, guidance and prompts");
  sub->add_option("--model", args->model, "the base checkpoint, when no config is given");
  sub->add_option("--lora", args->loras, "an adapter file (repeatable: several are merged into the base)")->required();
  sub->add_option("--multiplier", args->multipliers,
                  "strength of each --lora, in the same order (one value: all of them; default: the config's "
                  "sample network_multiplier, else 1)");
  sub->add_option("--prompt", args->prompts, "a prompt (repeatable; replaces the config's sample prompts)");
  auto* seed = sub->add_option("--seed", args->seed, "the seed of the first prompt (the config's sample.seed otherwise)");
  auto* steps = sub->add_option("--steps", args->steps, "sampling steps")->check(CLI::PositiveNumber);
  sub->add_option("--output", args->output, "folder for the PNGs and the grid (default: <run folder>/samples_cli)");
  sub->add_option("--set", args->overrides, "override a config key, e.g. --set sample.sampler=ddim (repeatable)");
  sub->callback([&chosen, args, seed, steps] {
    chosen = [args, has_seed = seed->count() > 0, has_steps = steps->count() > 0] {
      train::configure_cpu_threads();
      train::SampleRequest request;
      if (!args->config.empty()) request.config_path = args->config;
      if (!args->model.empty()) request.model_path = args->model;
      if (!args->config.empty() && !args->model.empty()) {
        throw InputError("give a config or --model, not both (set model.name_or_path with --set to change the config's)");
      }
      if (args->multipliers.size() > 1 && args->multipliers.size() != args->loras.size()) {
        throw InputError("give one --multiplier per --lora (or a single one for all)");
      }
      for (size_t i = 0; i < args->loras.size(); ++i) {
        train::SampleLoRA lora;
        lora.path = args->loras[i];
        if (!args->multipliers.empty()) lora.multiplier = args->multipliers[args->multipliers.size() == 1 ? 0 : i];
        request.loras.push_back(lora);
      }
      request.multiplier_given = !args->multipliers.empty();
      request.prompts = args->prompts;
      if (has_seed) request.seed = args->seed;
      if (has_steps) request.steps = args->steps;
      if (!args->output.empty()) request.output_dir = args->output;
      request.overrides = args->overrides;
      train::run_sampling(request);
      return 0;
    };
  });
}

}  // namespace lt::cli
