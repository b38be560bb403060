// Log analysis in one pass. feed() lowercases a line, finds the keywords of every rule table in
// it with one automaton, and hands each hit to the rule that owns it: failure signatures
// (signatures.cpp), activity messages (phase_rules.cpp), identification markers (identify.cpp),
// settings keys (settings_parser.cpp), and the line formats with numbers (line_parsers.cpp).
// finish() turns the bounded state into a Diagnosis: verdict.cpp (cause, memory, environment,
// recovered runs), phase.cpp (stage, phase, step), advice.cpp (notes), fixes.cpp (fixes).
#include "loratrain/diagnose/analyzer.h"

#include <algorithm>

#include "advice.h"
#include "analyzer_state.h"
#include "keyword_matcher.h"
#include "line_parsers.h"
#include "loratrain/diagnose/fixes.h"
#include "phase.h"
#include "settings_parser.h"
#include "signatures.h"
#include "text.h"
#include "verdict.h"

namespace lt::diagnose {

using namespace detail;

namespace {

// The tables whose keywords the automaton finds.
enum class Table : uint8_t { kSignature, kLineFormat, kActivity, kTrainer, kFamily, kSetting };

// Keywords that route a line to a parser (line_parsers.h) rather than to a rule table.
enum class LineFormat : uint16_t {
  kTracebackStart,   // "Traceback (most recent call last):"
  kFrame,            // `File "...", line N, in f`
  kChainedException, // "During handling of the above exception ..."
  kProgressRate,     // "it/s" / "s/it": a tqdm bar
  kStepLine,         // "steps: 10 loss: ..."
  kEpochLine,        // "epoch 1/16"
  kSampleAtStep,     // sd-scripts / musubi "generating sample images at step N"
  kGuard,            // lora-train "oom-guard:"
  kRunEnd,           // lora-train "done: ..." / "the settings that worked: ..."
  kMemory,           // the allocator message's numbers
  kBucket,           // bucket listings
  kPinnedMemory,     // the failing allocation was pinned host memory
  kWsl,              // Windows Subsystem for Linux
  kRank,             // a rank prefix or a rank in a failure summary
  kLauncherChild,    // a launcher stopping one of its processes (one per rank)
  kErrorWord,        // "error", "exception", ...: makes a line of no other keyword an error candidate
  kSettingsSummary,  // lora-train: its memory settings at the start of training
  kAttentionOn,      // sd-scripts: the U-Net's memory-efficient attention was enabled
  kKohyaCommand,     // sd-scripts: a training script's command line
};

struct LineFormatKeyword {
  const char* text;
  LineFormat format;
};

const std::vector<LineFormatKeyword>& line_format_keywords() {
  using F = LineFormat;
  static const std::vector<LineFormatKeyword> table = {
      {"traceback (most recent call last)", F::kTracebackStart},
      {"file \"", F::kFrame},
      {"during handling of the above exception", F::kChainedException},
      {"the above exception was the direct", F::kChainedException},
      {"it/s", F::kProgressRate}, {"s/it", F::kProgressRate},
      {"steps: ", F::kStepLine}, {"step: ", F::kStepLine}, {"step ", F::kStepLine}, {"global_step", F::kStepLine},
      {"epoch ", F::kEpochLine},
      {"generating sample images at step", F::kSampleAtStep},
      {"\xe3\x82\xb5\xe3\x83\xb3\xe3\x83\x97\xe3\x83\xab\xe7\x94\xbb\xe5\x83\x8f\xe7\x94\x9f\xe6\x88\x90", F::kSampleAtStep},  // サンプル画像生成
      {"oom-guard:", F::kGuard},
      {"done: ", F::kRunEnd}, {"the settings that worked", F::kRunEnd},
      {"tried to allocate", F::kMemory}, {"total capacity", F::kMemory}, {"is free", F::kMemory},
      {"already allocated", F::kMemory}, {"reserved in total", F::kMemory}, {"allocated by pytorch", F::kMemory},
      {"reserved by pytorch but unallocated", F::kMemory}, {"memory in use", F::kMemory},
      {"currently allocated", F::kMemory}, {"requested ", F::kMemory}, {"device limit", F::kMemory},
      {"free (according to cuda)", F::kMemory}, {"mps allocated", F::kMemory}, {"max allowed", F::kMemory},
      {"bytes free", F::kMemory}, {"gib free", F::kMemory}, {"mib free", F::kMemory},
      {"bucket", F::kBucket}, {" files", F::kBucket}, {" images", F::kBucket},
      // torch/utils/data/_utils/pin_memory.py: "Caught RuntimeError in pin memory thread for device 0";
      // c10/cuda CachingHostAllocator: cudaHostAlloc.
      {"pin memory thread", F::kPinnedMemory}, {"pin_memory", F::kPinnedMemory},
      {"cudahostalloc", F::kPinnedMemory}, {"pinned memory", F::kPinnedMemory},
      {"cachinghostallocator", F::kPinnedMemory},
      {"microsoft-standard-wsl", F::kWsl}, {"wsl2", F::kWsl}, {"/mnt/c/", F::kWsl}, {"\\\\wsl", F::kWsl},
      {"[rank", F::kRank}, {"local_rank", F::kRank},
      {"killing subprocess", F::kLauncherChild},  // deepspeed/launcher/launch.py sigkill_handler()
      {"error", F::kErrorWord}, {"exception", F::kErrorWord}, {"fatal", F::kErrorWord}, {"failed", F::kErrorWord},
      {"abort", F::kErrorWord},
      // lora-train: src/train/trainer.cpp run() "training N steps from step S; memory settings: <summary>",
      // and a resumed run's "settings carried over from the interrupted run: <summary>".
      {"memory settings: ", F::kSettingsSummary}, {"settings carried over from the interrupted run: ", F::kSettingsSummary},
      // sd-scripts: library/train_util.py replace_unet_modules().
      {"enable xformers for u-net", F::kAttentionOn}, {"enable sdpa for u-net", F::kAttentionOn},
      {"enable memory efficient attention for u-net", F::kAttentionOn},
      // sd-scripts U-Net training scripts (SD1.x/2.x, SDXL); the DiT scripts always use SDPA.
      {"train_network.py", F::kKohyaCommand}, {"train_db.py", F::kKohyaCommand}, {"fine_tune.py", F::kKohyaCommand},
      {"sdxl_train.py", F::kKohyaCommand}, {"train_textual_inversion.py", F::kKohyaCommand},
  };
  return table;
}

template <class Row, class TextOf>
void add_keywords(std::vector<Keyword>& out, Table table, const std::vector<Row>& rows, TextOf text_of) {
  for (size_t i = 0; i < rows.size(); ++i) out.push_back({text_of(rows[i]), static_cast<uint8_t>(table), static_cast<uint16_t>(i)});
}

const KeywordMatcher& matcher() {
  static const KeywordMatcher m = [] {
    std::vector<Keyword> k;
    auto text = [](const auto& row) { return std::string(row.text); };
    add_keywords(k, Table::kSignature, signatures(), text);
    add_keywords(k, Table::kLineFormat, line_format_keywords(), text);
    add_keywords(k, Table::kActivity, activity_messages(), text);
    add_keywords(k, Table::kTrainer, trainer_markers(), text);
    add_keywords(k, Table::kFamily, family_markers(), text);
    add_keywords(k, Table::kSetting, setting_keys(), text);
    return KeywordMatcher(std::move(k));
  }();
  return m;
}

// The VAE in a traceback: its modules, files and calls (diffusers autoencoders, sd-scripts
// latents_to_image, musubi's vae.decode, ComfyUI's VAE.decode, lora-train has no Python frames).
std::optional<bool> traceback_in_vae(const std::vector<Frame>& frames) {
  if (frames.empty()) return std::nullopt;
  for (const Frame& f : frames) {
    for (const std::string* t : {&f.func, &f.file})
      if (contains(*t, "vae") || contains(*t, "autoencoder") || contains(*t, "latents_to_image") ||
          contains(*t, "first_stage"))
        return true;
    if (f.func == "decode" || f.func == "_decode" || f.func == "tiled_decode") return true;
    // A call, not an argument: "vae.decode(latents)", "latents_to_image(...)"; a frame's source
    // line often passes the VAE along ("self.sample_images(accelerator, args, ..., vae, ...)").
    const std::string& c = f.code;
    if (contains(c, "vae.") || contains(c, "vae(") || contains(c, ".decode(") || contains(c, "latents_to_image(") ||
        contains(c, "first_stage"))
      return true;
  }
  return false;
}

// A traceback that ends on a line of no cause belongs to the failure printed just before it
// (rich consoles and ComfyUI's error report print the message first, the stack after).
void attach_frames_to_earlier_failure(AnalyzerState& st) {
  for (CauseRecord& r : st.causes)
    if (r.last.seen() && r.last.seq >= st.traceback_seq - 4 && r.last.seq < st.traceback_seq && !r.has_frames())
      r.frames = st.frames;
}

// The line's place in a traceback. Rich-style consoles (ComfyUI, kohya) indent everything, other
// loggers lose the indentation: the structure is read from the trimmed text and the alternation of
// frame and source lines.
struct LineShape {
  std::string_view trimmed_low;  // lowercase, without log prefixes and indentation
  bool exception = false;        // "XxxError: ..." once trimmed
  bool ends_traceback = false;   // the exception line, or a line back at the margin
};

LineShape read_line_shape(AnalyzerState& st, std::string_view text, std::string_view low) {
  const std::string_view body = strip_prefix(text);
  const std::string_view body_low = low.substr(low.size() - body.size());
  const size_t indent = std::min(body.find_first_not_of(' '), body.size());
  LineShape shape;
  shape.trimmed_low = body_low.substr(indent);
  shape.exception = !exception_class(body.substr(indent)).empty();
  const std::string_view t = shape.trimmed_low;
  // A rich box's frame or code line without the box's top (a paste cut inside it) starts one.
  const auto numbered_box_line = [](std::string_view r) {
    r.remove_prefix(3);  // the box side
    const size_t d = r.find_first_not_of(' ');
    return d != std::string_view::npos && is_digit(r[d]);
  };
  if (!st.in_traceback && starts_with(t, "\xe2\x94\x82") && contains(t.substr(3), "\xe2\x94\x82") &&
      (contains(t, " in ") || contains(t, "\xe2\x9d\xb1") || numbered_box_line(t))) {
    st.in_traceback = true;
    st.traceback_seq = st.seq;
    st.frames.clear();
  }
  if (!st.in_traceback || t.empty() || starts_with(t, "file \"")) return shape;
  if (parse_rich_traceback_line(st, t, body.substr(indent))) return shape;
  const bool expecting_code = st.expect_code_line;
  st.expect_code_line = false;
  const bool carets = t.find_first_not_of("^~ ") == std::string_view::npos;
  const bool chained = starts_with(t, "during handling of the above") || starts_with(t, "the above exception");
  const bool restart = contains(t, "traceback (most recent call last)");
  if (expecting_code && !shape.exception && !chained && !restart) {
    // The source line under a frame ("    vae.to(accelerator.device, dtype=weight_dtype)").
    if (!st.frames.empty()) st.frames.back().code = snippet(t, 200);
  } else if (!carets && !chained) {
    shape.ends_traceback = shape.exception || (indent == 0 && !restart);
  }
  return shape;
}

bool is_error_level(std::string_view low, std::string_view body_low) {
  for (std::string_view p : {"error", "[error]", "critical", "fatal"})
    if (starts_with(body_low, p)) return true;
  for (std::string_view w : {"!!! exception during processing", "error running job", "| error |", "[error]", " error: "})
    if (contains(low, w)) return true;
  return false;
}

// An activity line counts when its words start a word, and loading/caching lines only until
// training steps are being counted (later ones rarely describe what runs at the failure).
void note_activity(AnalyzerState& st, const ActivityMessage& m, std::string_view low, size_t pos,
                   std::string_view text, int64_t line) {
  if (!m.inside_words && pos > 0 && is_word(low[pos - 1])) return;
  Activity& a = st.act;
  const bool before_work = m.stage == Stage::kModelLoad || m.stage == Stage::kCaching;
  if (before_work && a.training_seen && a.completed > 0) return;
  if (m.stage == Stage::kTrainingStep && m.starts_training) a.training_seen = true;
  a.marker(m.stage).set(st.seq, line, text);
}

}  // namespace

LogAnalyzer::LogAnalyzer() : s_(std::make_unique<State>()) { s_->counted.assign(matcher().size(), false); }
LogAnalyzer::~LogAnalyzer() = default;

void LogAnalyzer::feed(const LogLine& line) {
  State& st = *s_;
  ++st.seq;
  st.lines = std::max(st.lines, line.number);
  const std::string_view text = line.text;
  st.low.resize(text.size());
  std::transform(text.begin(), text.end(), st.low.begin(), lower);
  const std::string_view low = st.low;
  const KeywordMatcher& m = matcher();

  // The bulk of big logs: an overwritten tqdm redraw. Only its progress matters (the last redraw
  // of a line, which carries any NaN loss too, goes through the full path).
  if (line.redraw && !st.in_traceback && contains(low, "%|") && low.size() < 400) {
    parse_progress_bar(st, low, text, line.number);
    return;
  }

  struct Hit {
    uint16_t id;
    uint32_t pos;
  };
  Hit hits[64];
  int nhits = 0;
  m.scan(low, [&](size_t id, size_t pos) {
    if (nhits < 64) hits[nhits++] = {static_cast<uint16_t>(id), static_cast<uint32_t>(pos)};
  });

  const LineShape shape = read_line_shape(st, text, low);
  const bool is_exception = shape.exception;
  const bool traceback_end = shape.ends_traceback;
  const std::string_view trimmed_low = shape.trimmed_low;
  if (nhits == 0) {
    if (traceback_end) {
      attach_frames_to_earlier_failure(st);
      st.in_traceback = false;
    }
    return;
  }
  const bool error_level = is_error_level(low, trimmed_low);
  const bool fatal_line = is_exception || error_level;
  // Inside a traceback, paths and code mention "quantize", "sample", "load_model"...: the activity
  // there comes from the frames, not from activity lines.
  const bool tb_body = st.in_traceback && !traceback_end;
  // lora-train's guard lines are read by parse_guard_line alone: their "(step N, bucket WxH,
  // batch B)" and action texts are not other trainers' activity or settings lines.
  const bool guard_line = contains(low, "oom-guard:");
  bool memory_line = false;
  bool bucket_line = false;
  bool pinned_hint = false;
  int rank = -1;

  std::array<bool, kCauseCount> line_cause{};
  bool oom_hard = false, oom_weak = false, oom_recovered = false;

  for (int h = 0; h < nhits; ++h) {
    const Keyword& k = m.keyword(hits[h].id);
    const size_t pos = hits[h].pos;
    const size_t end = pos + k.text.size();
    switch (static_cast<Table>(k.table)) {
      case Table::kSignature: {
        const Signature& sig = signatures()[k.row];
        const LineFacts facts{low, pos, end, is_exception, error_level};
        if (sig.qualifies && !sig.qualifies(facts)) break;
        line_cause[static_cast<int>(sig.cause)] = true;
        if (sig.oom == OomKind::kHard) oom_hard = true;
        if (sig.oom == OomKind::kWeak) oom_weak = true;
        if (sig.oom == OomKind::kRecovered) oom_recovered = true;
        break;
      }
      case Table::kActivity:
        if (!tb_body && !guard_line) note_activity(st, activity_messages()[k.row], low, pos, text, line.number);
        break;
      case Table::kTrainer:
        if (!st.counted[hits[h].id]) {
          st.counted[hits[h].id] = true;
          const TrainerMarker& t = trainer_markers()[k.row];
          st.identity.trainer[static_cast<int>(t.trainer)] += t.weight;
          if (t.kohya_gui) st.identity.kohya_gui = true;
        }
        if (k.text == "kohya" && (contains(low, "kohya_ss") || contains(low, "kohya_gui"))) st.identity.kohya_gui = true;
        break;
      case Table::kFamily: {
        const FamilyMarker& f = family_markers()[k.row];
        int& score = st.identity.family[static_cast<int>(f.family)];
        if (!st.counted[hits[h].id]) {
          st.counted[hits[h].id] = true;
          score += f.weight;
        } else if (score < 1000) {
          score += 1;  // repeated mentions add a little
        }
        break;
      }
      case Table::kSetting:
        if (!tb_body && !guard_line) parse_setting(st.settings, setting_keys()[k.row].id, low, pos, end);
        break;
      case Table::kLineFormat:
        switch (line_format_keywords()[k.row].format) {
          case LineFormat::kTracebackStart:
            st.in_traceback = true;
            st.expect_code_line = false;
            st.traceback_seq = st.seq;
            st.frames.clear();
            break;
          case LineFormat::kChainedException: st.in_traceback = false; break;
          case LineFormat::kFrame:
            // A stack pasted without its "Traceback" header (ComfyUI's error report) starts at its
            // first frame.
            if (!st.in_traceback && starts_with(trimmed_low, "file \"") && contains(trimmed_low, "\", line ")) {
              st.in_traceback = true;
              st.traceback_seq = st.seq;
              st.frames.clear();
            }
            if (st.in_traceback) parse_frame_line(st, low, text, end);
            break;
          case LineFormat::kProgressRate:
            if (!tb_body) parse_progress_bar(st, low, text, line.number);
            break;
          case LineFormat::kStepLine:
            if (!tb_body) parse_step_line(st, low, pos, end, text, line.number);
            break;
          case LineFormat::kEpochLine:
            if (!tb_body) parse_epoch_line(st, low, pos, end, text, line.number);
            break;
          case LineFormat::kSampleAtStep:
            if (!tb_body) parse_sample_at_step(st, low, end, text, line.number);
            break;
          case LineFormat::kGuard:
            parse_guard_line(st, low, text, line.number);
            if (contains(low, "host ram exhausted")) line_cause[static_cast<int>(Cause::kHostOom)] = true;
            break;
          case LineFormat::kRunEnd: parse_run_end_line(st, low, text, line.number); break;
          case LineFormat::kMemory: memory_line = true; break;
          case LineFormat::kBucket: bucket_line = !tb_body && !guard_line; break;
          case LineFormat::kPinnedMemory: pinned_hint = fatal_line || st.in_traceback; break;
          case LineFormat::kWsl: st.env.wsl = true; break;
          case LineFormat::kRank: rank = rank_of_line(low); break;
          case LineFormat::kLauncherChild:
            if (st.env.launcher_children < 64) ++st.env.launcher_children;
            break;
          case LineFormat::kErrorWord: break;
          case LineFormat::kSettingsSummary:
            if (!tb_body) apply_settings_summary(st.settings, low.substr(end));
            break;
          case LineFormat::kAttentionOn:
            if (!tb_body) st.settings.memory_efficient_attention = true;
            break;
          case LineFormat::kKohyaCommand:
            if (!tb_body && contains(low, "--pretrained_model_name_or_path") && !contains(low, "--config_file")) {
              KohyaAttention& k = st.kohya_attention;
              k.command_line = true;
              k.flag_on_command = k.flag_on_command || contains(low, "--xformers") || contains(low, "--sdpa") ||
                                  contains(low, "--mem_eff_attn");
            }
            break;
        }
        break;
    }
  }
  if (contains(low, "gui") && contains(low, "kohya")) st.identity.kohya_gui = true;
  if (memory_line) parse_allocator_message(st.mem, st.seq, low);
  if (bucket_line) parse_bucket_line(st.settings, low);
  if (rank >= 0) {
    st.env.ranks_seen |= uint64_t(1) << rank;
    st.env.highest_rank = std::max(st.env.highest_rank, rank);
  }

  if (oom_hard || oom_weak || oom_recovered) {
    line_cause[static_cast<int>(Cause::kGpuOom)] = true;
    if (oom_hard || oom_weak) {
      st.oom_recovered_only = false;
      if (oom_hard) ++st.oom_hard_count;
      else ++st.oom_weak_count;
      if (oom_hard && rank >= 0) st.env.oom_ranks |= uint64_t(1) << rank;
    } else {
      st.last_oom_recovered_seq = st.seq;
    }
  }
  if (pinned_hint) st.env.pinned_memory = true;
  bool any_cause = false;
  for (int c = 1; c < kCauseCount; ++c) any_cause = any_cause || line_cause[c];
  // An exception of no known kind is "other"; generic wrappers (accelerate's CalledProcessError
  // "returned non-zero exit status 1" for the training script it launched) carry no cause of their
  // own. A failed command that is no Python script (Triton's compiler, a build tool) is the failure.
  const bool wrapper = (contains(low, "non-zero exit status") || contains(low, "calledprocesserror")) &&
                       (contains(low, ".py'") || contains(low, ".py\"") || contains(low, "accelerate") ||
                        !contains(low, "command '"));
  if (!any_cause && is_exception && !wrapper) line_cause[static_cast<int>(Cause::kOther)] = true;

  for (int c = 1; c < kCauseCount; ++c) {
    if (!line_cause[c]) continue;
    CauseRecord& r = st.causes[c];
    ++r.count;
    const Cause cause = static_cast<Cause>(c);
    const bool fatal = fatal_line || cause == Cause::kHostOom || cause == Cause::kDataLoaderWorker ||
                       (cause == Cause::kGpuOom && oom_hard);
    if (!r.first.seen() || st.act.progress.seq > r.first.seq) {
      r.first.set(st.seq, line.number, text);
      r.at_first = st.act;
    }
    r.last.set(st.seq, line.number, text);
    if (fatal) {
      ++r.fatal_count;
      r.last_fatal.set(st.seq, line.number, text);
    }
    if (traceback_end) r.frames = st.frames;
  }
  if (traceback_end) {
    if (!any_cause && !line_cause[static_cast<int>(Cause::kOther)]) attach_frames_to_earlier_failure(st);
    st.in_traceback = false;
  }
}

Diagnosis LogAnalyzer::finish(int64_t bytes) const {
  const State& st = *s_;
  Diagnosis d;
  d.lines = st.lines;
  d.bytes = bytes;
  d.settings = st.settings;
  identify(st.identity, st.settings, d);
  // An sd-scripts command line with all its arguments and none of the attention flags: plain attention
  // in its U-Nets (the DiT models always call SDPA).
  const bool unet = d.family == ModelFamily::kSd15 || d.family == ModelFamily::kSdxl || d.family == ModelFamily::kUnknown;
  if (d.trainer == Trainer::kKohya && unet && st.kohya_attention.command_line && !d.settings.memory_efficient_attention)
    d.settings.memory_efficient_attention = st.kohya_attention.flag_on_command;
  const CauseRecord* decisive = decide_cause(st, d);
  d.memory = d.oom ? memory_numbers(st.mem) : MemoryNumbers{};
  if (decisive) d.in_vae = traceback_in_vae(decisive->frames);
  PhaseDecision phase = decide_phase(st, d, decisive);
  apply_phase(phase, d);
  apply_environment(st, decisive, d);
  apply_recovery(st, d);
  add_evidence(st, decisive, phase, d);
  d.tried = tried_levers(d);
  add_advice(d);
  if (!d.recovered) d.fixes = plan_fixes(d);
  return d;
}

Diagnosis diagnose(std::unique_ptr<ByteSource> source) {
  LineReader reader(std::move(source));
  LogAnalyzer analyzer;
  LogLine line;
  while (reader.next(line)) analyzer.feed(line);
  return analyzer.finish(reader.bytes_read());
}

Diagnosis diagnose_path(const std::string& path) { return diagnose(open_source(path)); }
Diagnosis diagnose_text(const std::string& text) { return diagnose(string_source(text)); }

}  // namespace lt::diagnose
