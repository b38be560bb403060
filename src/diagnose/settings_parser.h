// Training settings a log shows: printed configs (YAML/JSON/TOML), command lines, argparse
// Namespace dumps, the trainers' own summary lines, and bucket listings.
#pragma once
#include <string_view>
#include <vector>

#include "loratrain/diagnose/diagnosis.h"

namespace lt::diagnose::detail {

enum class SettingId {
  kGradientCheckpointing, kBatchSize, kAccumulation, kRank, kResolution, kFrames, kPrecision, kOptimizer,
  kLowVram, kQuantize, kFp8Base, kBlocksToSwap, kDisableSampling, kSkipFirstSample, kSampleAtFirst,
  kSampleEvery, kSampleSteps, kSampleWidth, kSampleHeight, kMemoryEfficientAttention, kCacheLatents,
  kUse8bitAdam, kAttentionChunk, kVaeTiling,
};

struct SettingKey {
  const char* text;  // lowercase key as trainers spell it
  SettingId id;
};
const std::vector<SettingKey>& setting_keys();

// The value after the key at [pos, end) of the lowercase line, into `s` (whole-word keys only).
void parse_setting(Settings& s, SettingId id, std::string_view low, size_t pos, size_t end);

// Bucket lines: kohya "bucket 0: resolution (512, 768), count: 10", musubi "(960, 544, 45)", AI
// Toolkit "832x480x41f: 12 files" / "1024x1024: 20 files".
void parse_bucket_line(Settings& s, std::string_view low);

// A bucket WxH counts as the square side of the same area (832x1216 is a 1024 bucket).
void add_bucket(Settings& s, int width, int height);

}  // namespace lt::diagnose::detail
