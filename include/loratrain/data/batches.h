// Batches by bucket: every batch holds entries of one bucket (one resolution set, one size), so
// images stack into [B, 3, H, W] without padding. Per epoch, each bucket's entries are shuffled,
// cut into batches (AI Toolkit pads a short last batch by repeating its own items, kohya keeps it
// short), and the batches of all buckets and resolution sets are shuffled together (AI Toolkit's
// DataLoader(shuffle=True) over the concatenated per-resolution datasets; kohya shuffles the
// bucket batch indices with random.seed(seed + epoch)).
//
// The order is a pure function of (seed, epoch, plan): a BatchPosition {epoch, index} fully
// determines the batch, its items and its captions' random draws, so resume restores the data
// order exactly and the OOM guard can ask for the same batch again.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "loratrain/data/buckets.h"
#include "loratrain/data/dataset.h"

namespace lt::data {

struct BatchOptions {
  int batch_size = 1;
  uint64_t seed = 42;
  bool pad_short_batches = true;  // AI Toolkit; false = kohya (the last batch may be short)
};

struct BatchPosition {
  int64_t epoch = 0;  // 0-based
  int64_t index = 0;  // batch within the epoch
  bool operator==(const BatchPosition& o) const { return epoch == o.epoch && index == o.index; }
};

struct BatchItem {
  size_t entry = 0;  // index into BucketPlan::entries()
  size_t image = 0;  // index into Dataset::images()
  bool flip_x = false;
  Placement placement;
  std::string caption;  // processed (trigger, dropout, tags)
};

struct Batch {
  BatchPosition position;
  int resolution = 0;
  Size size;  // bucket width x height (pixels)
  std::vector<BatchItem> items;
  std::vector<std::string> captions() const;
};

class BatchIterator {
 public:
  // `dataset` must outlive the iterator; the plan is copied (drop_largest_resolution changes it).
  BatchIterator(const Dataset& dataset, BucketPlan plan, BatchOptions options);

  const BucketPlan& plan() const { return plan_; }
  const BatchOptions& options() const { return options_; }
  int64_t batches_per_epoch() const;

  const BatchPosition& position() const { return position_; }
  // Moves to `position`; throws lt::Error when index is not below batches_per_epoch().
  void seek(BatchPosition position);

  // The batch at the current position; calling it again gives the identical batch.
  Batch current() const;
  // The batch at `position` (what current() gives there), the position left as it is.
  Batch at(BatchPosition position) const;
  void advance();  // to the next batch, rolling over into the next epoch
  Batch next();    // current(), then advance()

  // Pixels [B, 3, H, W] float32 in [-1, 1] for the batch (decoded, resized, flipped, cropped).
  at::Tensor load_pixels(const Batch& batch) const;
  // Video dataset: [B, 3, F, H, W] (Dataset::load_clip_tensor; F = 1 in a bucket of images).
  at::Tensor load_clip_pixels(const Batch& batch, int num_frames) const;

  // Forwards to BucketPlan::drop_largest_resolution. The current epoch's order is recomputed for
  // the new plan; the position is kept (clamped into the epoch).
  std::optional<ResolutionDrop> drop_largest_resolution(int fallback_resolution = 0);

  // A new batch size (the OOM guard's "batch_size: 1"): the epoch's order is rebuilt and the index
  // scaled so about the same share of the epoch counts as done.
  void set_batch_size(int batch_size);

  // {"epoch":..,"index":..,"seed":..,"batch_size":..,"plan":"<fingerprint hex>"}. With the same
  // seed, batch size and plan the position is restored exactly. Otherwise (config or dataset
  // changed) a warning says the order cannot match and the position is mapped as well as it can.
  // lt::InputError for text that is not such a state.
  std::string state_json() const;
  void restore_state(const std::string& json);

 private:
  struct EpochOrder {
    int64_t epoch = -1;
    std::vector<std::vector<size_t>> batches;  // entry indices
  };
  const EpochOrder& order_for(int64_t epoch) const;

  const Dataset* dataset_;
  BucketPlan plan_;
  BatchOptions options_;
  BatchPosition position_;
  mutable EpochOrder cached_;
};

}  // namespace lt::data
