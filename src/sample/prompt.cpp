#include "loratrain/sample/prompt.h"

#include <cerrno>
#include <cstdlib>
#include <random>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"

namespace lt::sample {

namespace {

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  if (from.empty()) return s;
  size_t pos = 0;
  while ((pos = s.find(from, pos)) != std::string::npos) {
    s.replace(pos, from.size(), to);
    pos += to.size();
  }
  return s;
}

[[noreturn]] void bad_value(std::string_view prompt, std::string_view flag, std::string_view value,
                            const char* expected) {
  throw InputError("sample prompt \"" + std::string(prompt) + "\": --" + std::string(flag) + " needs " + expected +
                   ", got '" + std::string(value) + "'");
}

int64_t parse_int(std::string_view prompt, std::string_view flag, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || errno != 0 || end != value.c_str() + value.size()) bad_value(prompt, flag, value, "an integer");
  return static_cast<int64_t>(v);
}

double parse_double(std::string_view prompt, std::string_view flag, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || errno != 0 || end != value.c_str() + value.size()) bad_value(prompt, flag, value, "a number");
  return v;
}

int64_t positive(std::string_view prompt, std::string_view flag, int64_t v) {
  if (v <= 0) bad_value(prompt, flag, std::to_string(v), "a positive integer");
  return v;
}

int64_t random_seed() {
  std::random_device rd;
  return static_cast<int64_t>(rd() & 0xffffffffu);  // AI Toolkit: randint(0, 2**32 - 1)
}

const std::vector<std::string>& known_flags() {
  static const std::vector<std::string> k = {"w",  "h",  "seed", "d",  "cfg", "l",      "steps",      "s",
                                             "n",  "n2", "p2",   "m",  "network_multiplier", "gr",  "frames",
                                             "num_frames", "fps", "ctrl_img", "ctrl_idx"};
  return k;
}

}  // namespace

std::string inject_trigger(std::string_view prompt, const std::optional<std::string>& trigger) {
  const std::string with = trigger.value_or("");
  return replace_all(replace_all(std::string(prompt), "[trigger]", with), "[name]", with);
}

void apply_prompt_flags(std::string_view prompt_in, SamplePrompt& out) {
  const std::string prompt = trim(prompt_in);
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = prompt.find("--", start);
    parts.push_back(prompt.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 2;
  }
  out.text = trim(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const size_t ws = part.find_first_of(" \t\r\n");
    const std::string flag = trim(part.substr(0, ws));
    const std::string value = ws == std::string::npos ? std::string() : trim(part.substr(ws));
    if (flag == "w") {
      out.width = positive(prompt, flag, parse_int(prompt, flag, value));
    } else if (flag == "h") {
      out.height = positive(prompt, flag, parse_int(prompt, flag, value));
    } else if (flag == "seed" || flag == "d") {
      int64_t s = parse_int(prompt, flag, value);
      if (s < -1) bad_value(prompt, flag, value, "a seed >= 0 (or -1 for random)");
      out.seed = s == -1 ? random_seed() : s;
    } else if (flag == "cfg" || flag == "l") {
      out.guidance_scale = parse_double(prompt, flag, value);
    } else if (flag == "steps" || flag == "s") {
      out.steps = positive(prompt, flag, parse_int(prompt, flag, value));
    } else if (flag == "n") {
      out.negative = value;
    } else if (flag == "n2") {
      out.negative_2 = value;
    } else if (flag == "p2") {
      out.text_2 = value;
    } else if (flag == "m" || flag == "network_multiplier") {
      out.network_multiplier = parse_double(prompt, flag, value);
    } else if (flag == "gr") {
      out.guidance_rescale = parse_double(prompt, flag, value);
    } else if (flag == "frames" || flag == "num_frames") {
      out.num_frames = positive(prompt, flag, parse_int(prompt, flag, value));
    } else if (flag == "fps") {
      out.fps = positive(prompt, flag, parse_int(prompt, flag, value));
    } else if (flag == "ctrl_img") {
      out.ctrl_img = value;
    } else if (flag == "ctrl_idx") {
      out.ctrl_idx = parse_int(prompt, flag, value);
    } else {
      std::string msg = "sample prompt \"" + prompt + "\": unknown flag '--" + flag + "'";
      if (auto m = closest_match(flag, known_flags())) msg += "; did you mean '--" + *m + "'?";
      msg += " (flags: --w --h --seed --cfg --steps --n --n2 --p2 --m --gr --frames --fps --ctrl_img --ctrl_idx)";
      throw InputError(msg);
    }
  }
}

SamplePrompt resolve_sample_prompt(const SampleItem& item, const SampleDefaults& d, int64_t index) {
  SamplePrompt p;
  p.width = item.width.value_or(d.width);
  p.height = item.height.value_or(d.height);
  p.guidance_scale = item.guidance_scale.value_or(d.guidance_scale);
  p.steps = item.sample_steps.value_or(d.sample_steps);
  p.negative = item.neg.value_or(d.neg);
  p.network_multiplier = item.network_multiplier.value_or(d.network_multiplier);
  p.guidance_rescale = d.guidance_rescale;
  p.num_frames = item.num_frames.value_or(d.num_frames);
  p.fps = item.fps.value_or(d.fps);
  p.ctrl_img = item.ctrl_img;
  // AI Toolkit BaseSDTrainProcess.sample: walk_seed gives prompt i the seed start + i; an item's
  // own seed wins. (AI Toolkit also lets that item seed leak into later items when walk_seed is
  // off; here each item without a seed gets the configured one.)
  int64_t seed = item.seed ? *item.seed : (d.walk_seed && d.seed >= 0 ? d.seed + index : d.seed);
  if (seed < -1) throw InputError("sample seed must be >= 0 (or -1 for random), got " + std::to_string(seed));
  p.seed = seed == -1 ? random_seed() : seed;
  apply_prompt_flags(inject_trigger(item.prompt, d.trigger_word), p);
  if (p.width <= 0 || p.height <= 0 || p.steps <= 0)
    throw InputError("sample prompt \"" + item.prompt + "\": width, height and steps must be positive");
  return p;
}

std::vector<SamplePrompt> resolve_sample_prompts(const std::vector<SampleItem>& items, const SampleDefaults& d) {
  std::vector<SamplePrompt> out;
  for (size_t i = 0; i < items.size(); ++i) out.push_back(resolve_sample_prompt(items[i], d, static_cast<int64_t>(i)));
  return out;
}

}  // namespace lt::sample
