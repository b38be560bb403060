#include "data_parallel.h"

#include <spdlog/spdlog.h>

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>

#include "loratrain/playbook/settings.h"
#include "loratrain/util/error.h"

namespace lt::train {

std::unique_ptr<DataParallel> DataParallel::from_env(const c10::Device& device) {
  const dist::DistEnv env = dist::read_dist_env();
  if (!env.distributed()) return nullptr;
  c10::Device rank_device = device;
  if (device.is_cuda()) rank_device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  return std::unique_ptr<DataParallel>(new DataParallel(dist::Group::open(env, rank_device, dist::group_options_from_env())));
}

data::Batch DataParallel::take(const data::Batch& global, BatchShard& shard) const {
  const int64_t n = static_cast<int64_t>(global.items.size());
  const int64_t begin = n * rank() / size();
  const int64_t end = n * (rank() + 1) / size();
  if (end <= begin) {
    throw InputError("a batch of " + std::to_string(n) + " rows cannot give each of " + std::to_string(size()) +
                                      " ranks a row: raise train.batch_size (it is per rank) or keep short batches padded");
  }
  data::Batch mine = global;
  mine.items.assign(global.items.begin() + begin, global.items.begin() + end);
  shard.begin = begin;
  shard.total = n;
  return mine;
}

double DataParallel::sum_gradients(const std::function<double()>& backward, const std::vector<at::Tensor>& params) {
  // Everything that needs memory happens before the agreement: a rank that fails here makes all
  // retry, and none is left waiting in the all-reduce below.
  std::exception_ptr failure;
  std::vector<at::Tensor> sums;
  dist::Packed packed;
  try {
    const double local_loss = backward();
    for (const auto& p : params) {
      if (!p.grad().defined()) const_cast<at::Tensor&>(p).mutable_grad() = at::zeros_like(p);
      sums.push_back(p.grad());
    }
    sums.push_back(at::full({1}, local_loss, sums.front().options().dtype(at::kDouble)));
    packed = group_->pack(sums);
  } catch (...) {
    failure = std::current_exception();
    if (!memory::is_memory_failure(failure)) throw;
  }
  agree(failure);
  group_->all_reduce_sum(packed);
  group_->unpack(packed, sums);
  return sums.back().item<double>();
}

int DataParallel::max_over_ranks(int value) {
  int out = 0;
  for (int v : group_->gather_codes(value)) out = std::max(out, v);
  return out;
}

void DataParallel::adopt_main_settings(memory::OomGuard& guard, playbook::MemorySettings& settings) {
  const nlohmann::json mine = settings;
  playbook::MemorySettings main = settings;
  playbook::from_json(nlohmann::json::parse(from_main(mine.dump())), main);
  if (main != settings) {
    spdlog::info("memory settings from rank 0: {}", playbook::summarize(main));
    guard.adopt(main);
    settings = main;
  }
}

void DataParallel::agree(std::exception_ptr failure) {
  int code = 0;
  if (failure) {
    code = 2;
    try {
      std::rethrow_exception(failure);
    } catch (const memory::PeerOutOfMemory&) {
      code = 1;
    } catch (...) {
    }
  }
  std::vector<int> codes = group_->gather_codes(code);
  std::vector<int> failed;
  bool any = false;
  for (int r = 0; r < size(); ++r) {
    any = any || codes[static_cast<size_t>(r)] != 0;
    if (codes[static_cast<size_t>(r)] == 2) failed.push_back(r);
  }
  if (!any) return;
  codes_ = codes;
  if (failure) std::rethrow_exception(failure);
  throw memory::PeerOutOfMemory(failed);
}

memory::Decision DataParallel::decide(const std::optional<memory::Decision>& own) {
  int leader = -1;
  for (int r = 0; r < size() && leader < 0; ++r) {
    if (r < static_cast<int>(codes_.size()) && codes_[static_cast<size_t>(r)] == 2) leader = r;
  }
  if (leader < 0) throw Error(ExitCode::kRuntime, "the ranks disagree about a failed attempt (no rank ran out of memory)");
  const std::string text = group_->share(leader == rank() && own ? memory::decision_to_text(*own) : std::string(), leader);
  if (leader != rank()) spdlog::info("oom-guard: following rank {}'s decision", leader);
  return memory::decision_from_text(text);
}

}  // namespace lt::train
