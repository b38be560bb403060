// lora-train run config.yaml [--set KEY=VALUE ...] [--resume DIR] [--fresh] [--smoke [N] [--junit PATH]] [--nproc N]
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "commands.h"
#include "loratrain/dist/launch.h"
#include "loratrain/util/error.h"
#include "loratrain/train/smoke.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/cpu_features.h"

namespace lt::cli {

void passive_openmp_or_restart(char** argv) {
  // LibTorch 1.13 runs its own kernels (softmax, SiLU, GELU, GroupNorm, elementwise) in their AVX2
  // versions even on an AVX-512 CPU unless told otherwise; the AVX-512 versions measured the tiny
  // step 12% faster (0.64 -> 0.56 s, docs/benchmarks.md). Read at LibTorch's first kernel call, so
  // no restart is needed for it; the user's setting stands.
  if (util::cpu_has_avx512_core()) ::setenv("ATEN_CPU_CAPABILITY", "avx512", 0);
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;  // the user's choice stands (and no loop)
  ::setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  // OpenBLAS's idle threads poll (sched_yield) for 2^28 cycles, about 0.1 s, after every product;
  // 2^20 cycles (well under a millisecond) measured 1.71 instead of 2.06 s/step on the tiny bench,
  // system time 1.8 instead of 7.5 s. Read when OpenBLAS is loaded, like libgomp's policy.
  ::setenv("OPENBLAS_THREAD_TIMEOUT", "20", 0);
  ::execv("/proc/self/exe", argv);
  // Only reached when exec failed: train on with the spinning default.
  spdlog::warn("could not restart with OMP_WAIT_POLICY=PASSIVE ({}): CPU steps may be slower", std::strerror(errno));
}

void add_run_command(CLI::App& app, Action& chosen, char** argv) {
  auto* sub = app.add_subcommand("run", "Train a LoRA from an AI Toolkit-style YAML config, under the OOM guard");
  struct Args {
    std::string config;
    std::vector<std::string> overrides;
    std::string resume;
    bool fresh = false;
    std::string smoke_steps;  // empty: the default count
    std::string junit;
    int nproc = 0;
  };
  auto args = std::make_shared<Args>();
  sub->add_option("config", args->config, "the job config (YAML)")->required();
  sub->add_option("--set", args->overrides, "override a config key, e.g. --set train.batch_size=2 (repeatable)");
  sub->add_option("--resume", args->resume,
                  "resume from this run folder's saved state (default: the config's own run folder, when it has one)");
  sub->add_flag("--fresh", args->fresh, "start from step 0 even when the run folder holds a saved state");
  auto* smoke = sub->add_option("--smoke", args->smoke_steps,
                                 "smoke test for CI: N steps (default 10) at the largest resolution, one preview, one "
                                 "save into a temporary folder; exit 0 fits unchanged, 3 fits only after the guard "
                                 "changed something (fixed.yaml written)")
                     ->expected(0, 1);
  sub->add_option("--junit", args->junit, "with --smoke: write a JUnit XML file here")->needs(smoke);
  sub->add_option("--nproc", args->nproc,
                  "data parallel on this machine: start N ranks (one device each; train.batch_size is per rank) and "
                  "wait for them (docs/distributed.md)")
      ->check(CLI::Range(1, 1024));
  sub->callback([&chosen, args, argv, smoke] {
    const bool smoke_run = smoke->count() > 0;
    chosen = [args, argv, smoke_run] {
      if (args->nproc > 0) {
        if (smoke_run) throw InputError("--smoke runs one rank: it cannot be combined with --nproc");
        // The ranks run this same command line without --nproc.
        std::vector<std::string> rank_args;
        for (char** a = argv + 1; *a != nullptr; ++a) {
          const std::string arg = *a;
          if (arg == "--nproc") {
            if (*(a + 1) != nullptr) ++a;
            continue;
          }
          if (arg.rfind("--nproc=", 0) == 0) continue;
          rank_args.push_back(arg);
        }
        return dist::launch_local_ranks(args->nproc, rank_args);
      }
      passive_openmp_or_restart(argv);
      train::configure_cpu_threads();
      if (smoke_run) {
        if (!args->resume.empty()) throw InputError("--smoke runs in a temporary folder: it cannot --resume");
        train::SmokeRequest request;
        request.config_path = args->config;
        request.overrides = args->overrides;
        if (!args->smoke_steps.empty()) {
          const std::string& text = args->smoke_steps;
          const bool digits = text.size() <= 6 && text.find_first_not_of("0123456789") == std::string::npos;
          const int n = digits ? std::atoi(text.c_str()) : 0;
          if (n < 1) throw InputError("--smoke " + args->smoke_steps + ": expected a number of steps (at least 1)");
          request.steps = n;
        }
        if (!args->junit.empty()) request.junit = args->junit;
        return train::run_smoke(request).exit_code;
      }
      train::RunRequest request;
      request.config_path = args->config;
      request.overrides = args->overrides;
      if (!args->resume.empty()) request.resume = args->resume;
      request.fresh = args->fresh;
      return train::run_training(request).exit_code;
    };
  });
}

}  // namespace lt::cli
