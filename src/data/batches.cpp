#include "loratrain/data/batches.h"

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "loratrain/data/rng.h"
#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::data {

namespace {
// Stream tags, so the order draws and the caption draws never share a random sequence.
constexpr uint64_t kOrderStream = 0x4f52444552ull;    // "ORDER"
constexpr uint64_t kCaptionStream = 0x4341505431ull;  // "CAPT1"
}  // namespace

std::vector<std::string> Batch::captions() const {
  std::vector<std::string> out;
  out.reserve(items.size());
  for (const BatchItem& i : items) out.push_back(i.caption);
  return out;
}

BatchIterator::BatchIterator(const Dataset& dataset, BucketPlan plan, BatchOptions options)
    : dataset_(&dataset), plan_(std::move(plan)), options_(options) {
  if (options_.batch_size < 1)
    throw InputError("batch_size must be at least 1, got " + std::to_string(options_.batch_size));
  if (plan_.entries().empty()) throw InputError("the bucket plan has no images");
  if (plan_.image_count() != dataset.size())
    throw Error(ExitCode::kRuntime, "BatchIterator: bucket plan made for " +
                                        std::to_string(plan_.image_count()) +
                                        " images, dataset has " + std::to_string(dataset.size()));
}

int64_t BatchIterator::batches_per_epoch() const {
  int64_t n = 0;
  const auto b = static_cast<size_t>(options_.batch_size);
  for (const Bucket& bucket : plan_.buckets())
    n += static_cast<int64_t>((bucket.entries.size() + b - 1) / b);
  return n;
}

const BatchIterator::EpochOrder& BatchIterator::order_for(int64_t epoch) const {
  if (cached_.epoch == epoch) return cached_;
  EpochOrder order;
  order.epoch = epoch;
  Rng rng(mix_seed({options_.seed, static_cast<uint64_t>(epoch), kOrderStream}));
  const auto bs = static_cast<size_t>(options_.batch_size);
  for (const Bucket& bucket : plan_.buckets()) {
    std::vector<size_t> entries = bucket.entries;
    rng.shuffle(entries);
    for (size_t start = 0; start < entries.size(); start += bs) {
      const size_t end = std::min(start + bs, entries.size());
      std::vector<size_t> batch(entries.begin() + start, entries.begin() + end);
      if (options_.pad_short_batches) {
        const size_t have = batch.size();
        for (size_t i = 0; batch.size() < bs; ++i) batch.push_back(batch[i % have]);
      }
      order.batches.push_back(std::move(batch));
    }
  }
  rng.shuffle(order.batches);
  cached_ = std::move(order);
  return cached_;
}

void BatchIterator::seek(BatchPosition position) {
  if (position.epoch < 0 || position.index < 0 || position.index >= batches_per_epoch())
    throw Error(ExitCode::kRuntime, "data position out of range: epoch " +
                                        std::to_string(position.epoch) + ", batch " +
                                        std::to_string(position.index) + " of " +
                                        std::to_string(batches_per_epoch()));
  position_ = position;
}

Batch BatchIterator::current() const { return at(position_); }

Batch BatchIterator::at(BatchPosition position) const {
  const EpochOrder& order = order_for(position.epoch);
  const std::vector<size_t>& ids = order.batches.at(static_cast<size_t>(position.index));
  Batch batch;
  batch.position = position;
  const BucketEntry& first = plan_.entries().at(ids.front());
  batch.resolution = first.resolution;
  batch.size = first.placement.bucket();
  for (size_t slot = 0; slot < ids.size(); ++slot) {
    const BucketEntry& e = plan_.entries().at(ids[slot]);
    BatchItem item;
    item.entry = ids[slot];
    item.image = e.image;
    item.flip_x = e.flip_x;
    item.placement = e.placement;
    Rng rng(mix_seed({options_.seed, static_cast<uint64_t>(position.epoch),
                      static_cast<uint64_t>(position.index), slot, kCaptionStream}));
    item.caption = dataset_->caption(e.image, rng);
    batch.items.push_back(std::move(item));
  }
  return batch;
}

void BatchIterator::advance() {
  if (++position_.index >= batches_per_epoch()) {
    position_.index = 0;
    ++position_.epoch;
  }
}

Batch BatchIterator::next() {
  Batch b = current();
  advance();
  return b;
}

at::Tensor BatchIterator::load_pixels(const Batch& batch) const {
  std::vector<at::Tensor> images;
  images.reserve(batch.items.size());
  for (const BatchItem& item : batch.items)
    images.push_back(dataset_->load_tensor(item.image, item.placement, item.flip_x));
  return torch::stack(images);  // [B, 3, H, W]
}

at::Tensor BatchIterator::load_clip_pixels(const Batch& batch, int num_frames) const {
  std::vector<at::Tensor> clips;
  clips.reserve(batch.items.size());
  for (const BatchItem& item : batch.items)
    clips.push_back(dataset_->load_clip_tensor(item.image, item.placement, item.flip_x, num_frames));
  return torch::stack(clips);  // [B, 3, F, H, W]
}

std::optional<ResolutionDrop> BatchIterator::drop_largest_resolution(int fallback_resolution) {
  auto drop = plan_.drop_largest_resolution(fallback_resolution);
  if (drop) {
    cached_ = EpochOrder{};
    position_.index = std::min(position_.index, batches_per_epoch() - 1);
  }
  return drop;
}

void BatchIterator::set_batch_size(int batch_size) {
  if (batch_size < 1)
    throw InputError("batch_size must be at least 1, got " + std::to_string(batch_size));
  if (batch_size == options_.batch_size) return;
  const int64_t consumed = position_.index * options_.batch_size;
  options_.batch_size = batch_size;
  cached_ = EpochOrder{};
  position_.index = std::min(consumed / batch_size, batches_per_epoch() - 1);
}

namespace {
std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}
}  // namespace

std::string BatchIterator::state_json() const {
  nlohmann::json j;
  j["epoch"] = position_.epoch;
  j["index"] = position_.index;
  j["seed"] = options_.seed;
  j["batch_size"] = options_.batch_size;
  j["plan"] = hex64(plan_.fingerprint());
  return j.dump();
}

void BatchIterator::restore_state(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    throw InputError(std::string("data position: not valid JSON: ") + printable(e.what()));
  }
  try {
    const auto seed = j.at("seed").get<uint64_t>();
    const auto batch_size = j.at("batch_size").get<int>();
    BatchPosition p{j.at("epoch").get<int64_t>(), j.at("index").get<int64_t>()};
    if (p.epoch < 0 || p.index < 0) throw InputError("data position: negative epoch or index");
    if (seed != options_.seed || batch_size != options_.batch_size) {
      spdlog::warn("resume: the data position was saved with seed {} and batch_size {}, the run "
                   "uses seed {} and batch_size {}; the data order cannot match the original run",
                   seed, batch_size, options_.seed, options_.batch_size);
      if (batch_size > 0) p.index = p.index * batch_size / options_.batch_size;
    } else if (j.at("plan").get<std::string>() != hex64(plan_.fingerprint())) {
      spdlog::warn("resume: the dataset or its buckets changed since the checkpoint; the data "
                   "order continues from epoch {} batch {} but cannot match the original run",
                   p.epoch, p.index);
    }
    p.index = std::min(p.index, batches_per_epoch() - 1);
    seek(p);
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("data position: ") + printable(e.what()));
  }
}

}  // namespace lt::data
