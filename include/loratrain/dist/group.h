// The ranks of a data-parallel run, on LibTorch's c10d: a TCP store for the rendezvous and small
// messages, Gloo for CPU tensors and NCCL for CUDA tensors (builds with USE_C10D_NCCL; untested,
// see docs/distributed.md), and a heartbeat that names a rank that is lost. The c10d headers stay
// in src/dist: this header only needs tensors.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loratrain/dist/launch.h"

namespace lt::dist {

struct GroupOptions {
  double rendezvous_seconds = 300;  // for every rank to reach the store (LT_DIST_RENDEZVOUS_TIMEOUT)
  double collective_seconds = 1800; // a collective waits this long for a slow rank (LT_DIST_TIMEOUT)
  double heartbeat_seconds = 10;    // a rank silent this long is lost (LT_DIST_HEARTBEAT_TIMEOUT)
  int64_t bucket_bytes = 25 << 20;  // gradients are packed into flat buffers of about this size
};
// The defaults above with the environment's overrides.
GroupOptions group_options_from_env();

struct Packed {
  std::vector<at::Tensor> buffers;                  // one flat buffer per bucket
  std::vector<std::pair<size_t, size_t>> ranges;    // the tensors [first, last) in each
};

class Group {
 public:
  // Rendezvous at env.master_addr:env.master_port (rank 0 serves the store unless torchrun's
  // agent does), then one collective backend for `device`: Gloo for the CPU, NCCL for CUDA.
  // lt::Error (environment) when the others do not arrive in time.
  static std::unique_ptr<Group> open(const DistEnv& env, const c10::Device& device, const GroupOptions& options);
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const;
  int size() const;

  // Sums tensors over the ranks: pack() copies them (any shapes and dtypes, this rank's device)
  // into flat buffers of about bucket_bytes (the only step that allocates), all_reduce_sum() sums
  // the buffers in place, one all-reduce each, and unpack() copies the sums back.
  Packed pack(const std::vector<at::Tensor>& tensors) const;
  void all_reduce_sum(Packed& packed);
  void unpack(const Packed& packed, const std::vector<at::Tensor>& tensors) const;
  // Every rank's `code` (a small all-reduce): element r is rank r's.
  std::vector<int> gather_codes(int code);
  // Rank `from`'s text on every rank, through the store (rank `from` passes it, the others "").
  std::string share(const std::string& text, int from);
  void barrier();
  // The orderly end: every rank arrives, the heartbeats stop, then the store may go.
  void finish();

  // Turns a failed collective into one message that names the lost rank when the heartbeat
  // knows it (waiting up to heartbeat_seconds for it to go quiet).
  [[noreturn]] void fail(const std::string& during, const std::exception& error);

  struct Impl;

 private:
  explicit Group(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lt::dist
