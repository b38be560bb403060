#include "settings_parser.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "text.h"

namespace lt::diagnose::detail {

const std::vector<SettingKey>& setting_keys() {
  using I = SettingId;
  static const std::vector<SettingKey> table = {
      {"gradient_checkpointing", I::kGradientCheckpointing}, {"activation_checkpointing", I::kGradientCheckpointing},
      {"gradient checkpointing", I::kGradientCheckpointing}, {"grad_checkpointing", I::kGradientCheckpointing},
      {"gradient-checkpointing", I::kGradientCheckpointing},
      {"batch_size", I::kBatchSize}, {"train_batch_size", I::kBatchSize}, {"micro_batch_size_per_gpu", I::kBatchSize},
      {"batch size per device", I::kBatchSize}, {"batch size:", I::kBatchSize}, {"batch-size", I::kBatchSize},
      {"gradient_accumulation_steps", I::kAccumulation}, {"gradient_accumulation", I::kAccumulation},
      {"gradient accumulation steps", I::kAccumulation}, {"grad_accum", I::kAccumulation},
      {"network_dim", I::kRank}, {"lora_rank", I::kRank}, {"network_rank", I::kRank}, {"base dim (rank)", I::kRank},
      {"linear", I::kRank}, {"rank", I::kRank}, {"lora_dim", I::kRank},
      {"resolution", I::kResolution}, {"resolutions", I::kResolution},
      {"num_frames", I::kFrames}, {"target_frames", I::kFrames}, {"frame_buckets", I::kFrames},
      {"video_length", I::kFrames}, {"max_frames", I::kFrames}, {"frame_count", I::kFrames},
      {"mixed_precision", I::kPrecision}, {"dtype", I::kPrecision}, {"train_dtype", I::kPrecision},
      {"transformer_dtype", I::kPrecision}, {"weight_dtype", I::kPrecision},
      {"optimizer_type", I::kOptimizer}, {"optimizer", I::kOptimizer},
      {"low_vram", I::kLowVram}, {"lowvram", I::kLowVram},
      {"quantize", I::kQuantize}, {"base_model_precision", I::kQuantize},
      {"fp8_base", I::kFp8Base}, {"fp8_scaled", I::kFp8Base},
      {"blocks_to_swap", I::kBlocksToSwap},
      {"disable_sampling", I::kDisableSampling},
      {"skip_first_sample", I::kSkipFirstSample},
      {"sample_at_first", I::kSampleAtFirst},
      {"sample_every", I::kSampleEvery}, {"sample_every_n_steps", I::kSampleEvery}, {"validation_steps", I::kSampleEvery},
      {"sample_steps", I::kSampleSteps},
      {"width", I::kSampleWidth}, {"sample_width", I::kSampleWidth},
      {"height", I::kSampleHeight}, {"sample_height", I::kSampleHeight},
      {"xformers", I::kMemoryEfficientAttention}, {"sdpa", I::kMemoryEfficientAttention},
      {"mem_eff_attn", I::kMemoryEfficientAttention}, {"flash_attn", I::kMemoryEfficientAttention},
      {"sage_attn", I::kMemoryEfficientAttention},
      {"cache_latents", I::kCacheLatents},
      {"use_8bit_adam", I::kUse8bitAdam}, {"use 8-bit adamw", I::kUse8bitAdam},
      // lora-train memory.attention_chunk / memory.vae_tiling; musubi-tuner --vae_tiling (cache_latents.py,
      // hv_train_network.py); SimpleTuner --vae_enable_tiling; diffusers' CogVideoX scripts --enable_tiling.
      {"attention_chunk", I::kAttentionChunk},
      {"vae_tiling", I::kVaeTiling}, {"vae_enable_tiling", I::kVaeTiling}, {"enable_tiling", I::kVaeTiling},
  };
  return table;
}

namespace {

struct Value {
  std::string token;      // first token, lowercase, quotes stripped ("list" for a list value)
  std::vector<int> ints;  // all integers of a list/tuple value, or the single int
  bool flag = false;      // "--key" with no value: a switch that is on
};

// The value after a key ending at `end`. `loose`: the separator may come a little later
// ("batch size per device / バッチサイズ: 1").
Value value_after(std::string_view low, size_t key_pos, size_t end, bool loose) {
  Value v;
  const bool dashed = key_pos >= 2 && low[key_pos - 1] == '-' && low[key_pos - 2] == '-';
  size_t i = end;
  if (i < low.size() && (low[i] == '"' || low[i] == '\'')) ++i;  // a JSON key's closing quote
  const size_t sep_start = i;
  while (i < low.size() && low[i] == ' ') ++i;
  bool had_sep = false;
  if (i < low.size() && (low[i] == ':' || low[i] == '=')) {
    had_sep = true;
    ++i;
  } else if (loose) {
    const size_t lim = std::min(low.size(), i + 40);
    for (size_t k = i; k < lim; ++k)
      if (low[k] == ':' || low[k] == '=') {
        had_sep = true;
        i = k + 1;
        break;
      }
  }
  if (!had_sep && !dashed) return v;  // a bare word followed by a space is not a key
  if (!had_sep) i = sep_start;
  while (i < low.size() && low[i] == ' ') ++i;
  if (dashed && !had_sep && (i >= low.size() || (i + 1 < low.size() && low[i] == '-' && low[i + 1] == '-'))) {
    v.flag = true;
    v.token = "true";
    return v;
  }
  if (i >= low.size()) return v;
  if (low[i] == '[' || low[i] == '(') {
    const char close = low[i] == '[' ? ']' : ')';
    size_t k = i + 1;
    const size_t lim = std::min(low.size(), i + 200);
    while (k < lim && low[k] != close) {
      if (is_digit(low[k]) && !is_word(low[k - 1])) {
        int64_t n = 0;
        while (k < low.size() && is_digit(low[k]) && n < 1000000) n = n * 10 + (low[k++] - '0');
        if (k < low.size() && low[k] == '.') {  // a float in the list: not a resolution
          while (k < low.size() && (is_digit(low[k]) || low[k] == '.')) ++k;
          continue;
        }
        v.ints.push_back(static_cast<int>(n));
      } else {
        ++k;
      }
    }
    v.token = "list";
    return v;
  }
  size_t q = i;
  if (low[q] == '"' || low[q] == '\'') ++q;
  size_t e = q;
  while (e < low.size() && low[e] != ' ' && low[e] != ',' && low[e] != '"' && low[e] != '\'' && low[e] != ')' &&
         low[e] != '}' && low[e] != ']' && low[e] != ';' && low[e] != '|')
    ++e;
  v.token = std::string(low.substr(q, e - q));
  if (!v.token.empty() && is_digit(v.token[0])) {
    // "1024,1024" (kohya --resolution) and "512x768" count as lists.
    int64_t n = 0;
    size_t k = q;
    while (k < low.size() && is_digit(low[k]) && n < 1000000) n = n * 10 + (low[k++] - '0');
    v.ints.push_back(static_cast<int>(n));
    if (k < low.size() && (low[k] == ',' || low[k] == 'x') && k + 1 < low.size() && is_digit(low[k + 1])) {
      ++k;
      int64_t m = 0;
      while (k < low.size() && is_digit(low[k]) && m < 1000000) m = m * 10 + (low[k++] - '0');
      v.ints.push_back(static_cast<int>(m));
    }
  }
  return v;
}

std::optional<bool> as_bool(const Value& v) {
  const std::string& t = v.token;
  if (v.flag) return true;
  if (t == "true" || t == "yes" || t == "on" || t == "1" || t == "enabled" || t == "cpu_offloaded") return true;
  if (t == "false" || t == "no" || t == "off" || t == "0" || t == "none" || t == "disabled" || t == "null") return false;
  return std::nullopt;
}

std::optional<int> max_int(const Value& v) {
  if (v.ints.empty()) return std::nullopt;
  return *std::max_element(v.ints.begin(), v.ints.end());
}

std::optional<int> int_in(const Value& v, int lo, int hi) {
  auto n = max_int(v);
  if (n && *n >= lo && *n <= hi) return n;
  return std::nullopt;
}

// A short word value (precision, optimizer name), not a list or a path.
std::optional<std::string> word_value(const Value& v, size_t max_len) {
  const std::string& t = v.token;
  if (t.empty() || t == "list" || t.size() >= max_len || !is_alpha(t[0])) return std::nullopt;
  for (char c : t)
    if (c <= 0x20 || c >= 0x7F) return std::nullopt;
  return t;
}

void add_resolutions(Settings& s, const std::vector<int>& values) {
  for (int r : values) {
    if (r < 64 || r > 16384) continue;
    if (std::find(s.resolutions.begin(), s.resolutions.end(), r) == s.resolutions.end() && s.resolutions.size() < 32)
      s.resolutions.push_back(r);
    if (!s.max_resolution || r > *s.max_resolution) s.max_resolution = r;
  }
  std::sort(s.resolutions.begin(), s.resolutions.end());
}

void set_bool(std::optional<bool>& field, const Value& v) {
  if (auto b = as_bool(v)) field = *b;
}

}  // namespace

void parse_setting(Settings& s, SettingId id, std::string_view low, size_t pos, size_t end) {
  using I = SettingId;
  // Whole-word keys only: "vae_batch_size" is not "batch_size", "quantize_te" is not "quantize".
  if (end < low.size() && is_word(low[end])) return;
  if (id == I::kUse8bitAdam) {  // "--use_8bit_adam", "Use 8-bit AdamW": a switch, no value
    s.optimizer = "AdamW8bit";
    return;
  }
  if (pos > 0 && is_word(low[pos - 1])) return;
  const bool loose = id == I::kBatchSize || id == I::kAccumulation || id == I::kRank;
  const Value v = value_after(low, pos, end, loose);
  if (v.token.empty() && v.ints.empty()) return;
  switch (id) {
    case I::kGradientCheckpointing: set_bool(s.gradient_checkpointing, v); break;
    case I::kBatchSize:
      if (auto n = int_in(v, 1, 4096)) s.batch_size = *n;
      break;
    case I::kAccumulation:
      if (auto n = int_in(v, 1, 4096)) s.gradient_accumulation = *n;
      break;
    case I::kRank:
      if (auto n = int_in(v, 1, 4096)) s.rank = *n;
      break;
    case I::kResolution: add_resolutions(s, v.ints); break;
    case I::kFrames:
      if (auto n = int_in(v, 1, 10000)) s.num_frames = std::max(s.num_frames.value_or(0), *n);
      break;
    case I::kPrecision:
      if (auto w = word_value(v, 24)) s.precision = *w;
      break;
    case I::kOptimizer:
      if (auto w = word_value(v, 48)) s.optimizer = *w;
      break;
    case I::kLowVram: set_bool(s.low_vram, v); break;
    case I::kQuantize:
      if (auto b = as_bool(v)) s.quantize = *b;
      else
        for (std::string_view q : {"int8", "fp8", "nf4", "int4"})
          if (contains(v.token, q)) s.quantize = true;
      break;
    case I::kFp8Base:
      if (auto b = as_bool(v); b && *b) s.quantize = true;
      break;
    case I::kBlocksToSwap:
      if (auto n = int_in(v, 0, 999)) s.blocks_to_swap = *n;
      break;
    case I::kDisableSampling: set_bool(s.disable_sampling, v); break;
    case I::kSkipFirstSample: set_bool(s.skip_first_sample, v); break;
    case I::kSampleAtFirst: set_bool(s.sample_at_first, v); break;
    case I::kSampleEvery:
      if (auto n = int_in(v, 0, 1 << 30)) s.sample_every = *n;
      break;
    case I::kSampleSteps:
      if (auto n = int_in(v, 1, 9999)) s.sample_steps = *n;
      break;
    case I::kSampleWidth:
      if (auto n = int_in(v, 64, 16384)) s.sample_width = *n;
      break;
    case I::kSampleHeight:
      if (auto n = int_in(v, 64, 16384)) s.sample_height = *n;
      break;
    case I::kMemoryEfficientAttention:
      if (auto b = as_bool(v)) s.memory_efficient_attention = *b || s.memory_efficient_attention.value_or(false);
      break;
    case I::kCacheLatents: set_bool(s.cache_latents, v); break;
    case I::kUse8bitAdam: break;
    case I::kAttentionChunk:
      if (!v.ints.empty() && v.token != "list") s.attention_chunk = v.ints.front();
      break;
    case I::kVaeTiling: set_bool(s.vae_tiling, v); break;
  }
}

void add_bucket(Settings& s, int width, int height) {
  if (width < 64 || height < 64 || width > 16384 || height > 16384) return;
  const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(width) * height) / 64.0)) * 64;
  if (!s.max_resolution || side > *s.max_resolution) s.max_resolution = side;
}

void parse_bucket_line(Settings& s, std::string_view low) {
  // "(W, H)" / "(W, H, F)".
  const size_t open = low.find('(');
  if (open != std::string_view::npos) {
    const size_t close = std::min(low.size(), low.find(')', open));
    std::vector<int> nums;
    for (size_t i = open + 1; i < close; ++i) {
      if (is_digit(low[i]) && !is_word(low[i - 1])) {
        int n = 0;
        while (i < low.size() && is_digit(low[i]) && n < 100000) n = n * 10 + (low[i++] - '0');
        nums.push_back(n);
      }
    }
    if (nums.size() >= 2) add_bucket(s, nums[0], nums[1]);
    if (nums.size() == 3 && nums[2] >= 1 && nums[2] < 2000) s.num_frames = std::max(s.num_frames.value_or(0), nums[2]);
  }
  // "832x480x41f" / "1024x1024".
  for (size_t i = 1; i + 2 < low.size(); ++i) {
    if (low[i] != 'x' || !is_digit(low[i - 1]) || !is_digit(low[i + 1])) continue;
    size_t b = i;
    while (b > 0 && is_digit(low[b - 1])) --b;
    if (b > 0 && is_word(low[b - 1])) continue;
    int w = 0, h = 0;
    for (size_t k = b; k < i; ++k) w = std::min(100000, w * 10 + (low[k] - '0'));
    size_t k = i + 1;
    while (k < low.size() && is_digit(low[k])) h = std::min(100000, h * 10 + (low[k++] - '0'));
    if (w < 64 || h < 64) continue;
    add_bucket(s, w, h);
    if (k + 1 < low.size() && low[k] == 'x' && is_digit(low[k + 1])) {
      int f = 0;
      size_t m = k + 1;
      while (m < low.size() && is_digit(low[m])) f = std::min(100000, f * 10 + (low[m++] - '0'));
      if (m < low.size() && low[m] == 'f' && f >= 1) s.num_frames = std::max(s.num_frames.value_or(0), f);
    }
  }
}

}  // namespace lt::diagnose::detail
