#include "loratrain/data/captions.h"

#include <vector>

#include "loratrain/util/strings.h"

namespace lt::data {

namespace {

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
    s.replace(pos, from.size(), to);
}

}  // namespace

std::string inject_trigger(const std::string& caption, const std::string& trigger) {
  std::string out = caption;
  replace_all(out, "[trigger]", trigger);
  replace_all(out, "[name]", trigger);
  if (!trim(trigger).empty() && out.find(trigger) == std::string::npos) {
    out = trim(out).empty() ? trigger : trigger + " " + out;
  }
  return out;
}

bool caption_is_random(const CaptionOptions& o) {
  return o.caption_dropout_rate > 0.0 || o.token_dropout_rate > 0.0 || o.shuffle_tokens;
}

std::string process_caption(const std::string& raw, const CaptionOptions& o, Rng& rng) {
  if (o.caption_dropout_rate > 0.0 && rng.uniform() < o.caption_dropout_rate) return "";
  // Placeholders become the trigger before tag handling, so "[trigger], ..." with keep_tokens = 1
  // keeps it first; a trigger lost to token dropout is prepended again, as AI Toolkit guarantees.
  std::string caption = raw;
  replace_all(caption, "[trigger]", o.trigger_word);
  replace_all(caption, "[name]", o.trigger_word);
  if (!o.shuffle_tokens && o.token_dropout_rate <= 0.0) return inject_trigger(caption, o.trigger_word);

  std::vector<std::string> tags;
  for (const std::string& t : split(caption, ',')) {
    std::string s = trim(t);
    if (!s.empty()) tags.push_back(std::move(s));
  }
  const size_t keep = std::min(tags.size(), static_cast<size_t>(std::max(o.keep_tokens, 0)));
  std::vector<std::string> fixed(tags.begin(), tags.begin() + keep);
  std::vector<std::string> rest;
  for (size_t i = keep; i < tags.size(); ++i) {
    if (o.token_dropout_rate >= 1.0) continue;
    if (o.token_dropout_rate > 0.0 && rng.uniform() < o.token_dropout_rate) continue;
    rest.push_back(tags[i]);
  }
  if (o.shuffle_tokens) rng.shuffle(rest);

  std::string out;
  for (const auto* list : {&fixed, &rest}) {
    for (const std::string& t : *list) {
      if (!out.empty()) out += ", ";
      out += t;
    }
  }
  return inject_trigger(out, o.trigger_word);
}

}  // namespace lt::data
