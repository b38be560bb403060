// One rank of the data-parallel tests: `lt-dist-rank CONFIG [--set K=V ...] [--oom-at-step N
// --oom-rank R --oom-count K] [--die-at-step N --die-rank R] [--stop-after N]`, run with the torchrun-style
// environment (RANK, WORLD_SIZE, ...) or without it (one rank). It trains as `lora-train run`
// does; the options inject the test's fault through the trainer's step hook: K simulated-VRAM
// allocation failures at the start of step N on rank R, or rank R killing itself (SIGKILL) there;
// --stop-after N stops after N steps as Ctrl-C would (exit 130, state saved).
#include <signal.h>

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "loratrain/dist/launch.h"
#include "loratrain/memory/budget_allocator.h"
#include "loratrain/memory/device_memory.h"
#include "loratrain/train/trainer.h"
#include "loratrain/util/error.h"
#include "loratrain/util/log.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: lt-dist-rank CONFIG [options]\n");
    return 2;
  }
  lt::train::RunRequest request;
  request.config_path = argv[1];
  int64_t oom_step = -1, die_step = -1;
  int oom_rank = 0, oom_count = 1, die_rank = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string value = argv[i + 1];
    if (key == "--set") request.overrides.push_back(value);
    else if (key == "--oom-at-step") oom_step = std::stoll(value);
    else if (key == "--oom-rank") oom_rank = std::stoi(value);
    else if (key == "--oom-count") oom_count = std::stoi(value);
    else if (key == "--die-at-step") die_step = std::stoll(value);
    else if (key == "--die-rank") die_rank = std::stoi(value);
    else if (key == "--stop-after") request.stop_after_steps = std::stoll(value);
    else {
      std::fprintf(stderr, "unknown option %s\n", key.c_str());
      return 2;
    }
  }
  try {
    lt::log::init("info");
    lt::train::configure_cpu_threads();
    const int rank = lt::dist::read_dist_env().rank;
    request.on_step_start = [&](int64_t step, lt::memory::DeviceMemory& memory) {
      if (step == oom_step && rank == oom_rank) {
        auto* cpu = dynamic_cast<lt::memory::CpuMemory*>(&memory);
        if (cpu == nullptr) throw lt::Error(lt::ExitCode::kRuntime, "--oom-at-step needs simulated VRAM");
        // Activations, not the few bytes of bookkeeping: the failures land in forward/backward.
        cpu->allocator().fail_next_allocations(oom_count, 64 * 1024);
      }
      if (step == die_step && rank == die_rank) ::raise(SIGKILL);
    };
    return lt::train::run_training(request).exit_code;
  } catch (const lt::Error& e) {
    spdlog::error("{}", e.what());
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
}
