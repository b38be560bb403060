// Data-parallel training, the trainer's side (docs/distributed.md). train.batch_size is per device,
// as in kohya and accelerate: each step every rank draws the same global batch of batch_size x
// world_size rows from the same seeded iterator and trains on its own contiguous rows; the noise
// of the whole global batch is drawn on every rank, so rank r's rows get the draws one device
// would give them. Gradients and the loss are summed over the ranks after each rank scaled its
// loss by its share of the rows, which makes them the global batch's mean.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loratrain/data/batches.h"
#include "loratrain/dist/group.h"
#include "loratrain/memory/guard.h"
#include "loratrain/train/objective.h"

namespace lt::train {

class DataParallel : public memory::RankAgreement {
 public:
  // nullptr when the environment (RANK, WORLD_SIZE, ...) asks for one rank.
  static std::unique_ptr<DataParallel> from_env(const c10::Device& device);

  int rank() const { return group_->rank(); }
  int size() const { return group_->size(); }
  bool is_main() const { return rank() == 0; }

  // This rank's rows of a global batch, and where they sit in it.
  data::Batch take(const data::Batch& global, BatchShard& shard) const;
  // Runs `backward` (this rank's forward and backward; returns its loss), agrees with the other
  // ranks that every one went through (an OOM on any rank: this throws, and every rank retries),
  // then sums the gradients of `params` (undefined ones count as zero) and the loss over the ranks.
  double sum_gradients(const std::function<double()>& backward, const std::vector<at::Tensor>& params);

  // The OOM guard's agreement (memory::RankAgreement).
  void agree(std::exception_ptr failure) override;
  memory::Decision decide(const std::optional<memory::Decision>& own) override;

  // The largest of every rank's `value`.
  int max_over_ranks(int value);
  // Rank 0's memory settings (the planner's choice on its device) on every rank.
  void adopt_main_settings(memory::OomGuard& guard, playbook::MemorySettings& settings);
  // Rank 0's text on every rank.
  std::string from_main(const std::string& text) { return group_->share(text, 0); }
  void barrier() { group_->barrier(); }
  void finish() { group_->finish(); }

 private:
  explicit DataParallel(std::unique_ptr<dist::Group> group) : group_(std::move(group)) {}
  std::unique_ptr<dist::Group> group_;
  std::vector<int> codes_;  // the last failed agreement: 2 ran out of memory, 1 followed, 0 fine
};

}  // namespace lt::train
