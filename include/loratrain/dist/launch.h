// Data-parallel launch: the torchrun-style environment a rank reads, and `lora-train run --nproc N`,
// which starts N local ranks of itself with that environment. No LibTorch here.
#pragma once
#include <string>
#include <vector>

namespace lt::dist {

// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT as torchrun, accelerate and the SLURM
// wrappers set them. A run without WORLD_SIZE (or with WORLD_SIZE=1) trains on one device.
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent already serves the store on MASTER_PORT,
  // so rank 0 connects to it instead of serving one.
  bool agent_store = false;
  bool distributed() const { return world_size > 1; }
};

// Reads the environment; lt::InputError (exit 2) for a malformed or inconsistent value.
DistEnv read_dist_env();

// A TCP port on the loopback interface that was free a moment ago (for local launches).
int free_local_port();

// Starts `nproc` copies of this program (/proc/self/exe) with `args` (argv without the program and
// without --nproc) and RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT set, waits for all of
// them, forwards SIGINT/SIGTERM to each, and returns 0 when every rank exited 0, else the first
// failing rank's exit code (128 + signal for a rank ended by a signal). A rank that is still
// running `grace_seconds` after another failed is stopped with SIGTERM (then SIGKILL).
int launch_local_ranks(int nproc, const std::vector<std::string>& args, int grace_seconds = 60);

}  // namespace lt::dist
