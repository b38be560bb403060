#include "line_parsers.h"

#include <algorithm>

#include "loratrain/diagnose/line_reader.h"
#include "settings_parser.h"
#include "text.h"

namespace lt::diagnose::detail {
namespace {

void record_training_progress(AnalyzerState& st, int64_t completed, int64_t total, int64_t line,
                              std::string_view text) {
  Activity& a = st.act;
  a.training_seen = true;
  a.progress.set(st.seq, line, text);
  a.completed = completed;
  if (total > 0) a.total = total;
}

struct Bar {
  std::string desc;  // lowercase, trimmed, ':' removed
  int64_t n = 0;
  int64_t total = 0;
  std::string postfix;
};

std::optional<Bar> parse_bar(std::string_view low) {
  size_t pct = low.find("%|");
  // tqdm without bar characters (notebooks, some non-terminals): "steps:   0% 0/2300 [00:01<?, ?it/s]".
  const bool plain = pct == std::string_view::npos;
  if (plain) {
    for (size_t p = low.find("% "); p != std::string_view::npos; p = low.find("% ", p + 2)) {
      size_t q = p + 2;
      while (q < low.size() && low[q] == ' ') ++q;
      if (p > 0 && is_digit(low[p - 1]) && q < low.size() && is_digit(low[q])) {
        pct = p;
        break;
      }
    }
    if (pct == std::string_view::npos) return std::nullopt;
  }
  size_t d = pct;
  while (d > 0 && (is_digit(low[d - 1]) || low[d - 1] == '.')) --d;
  if (d == pct) return std::nullopt;
  Bar b;
  std::string_view desc = low.substr(0, d);
  while (!desc.empty() && (desc.back() == ' ' || desc.back() == ':')) desc.remove_suffix(1);
  // A bar glued after log text: keep only the tail after the last ']' or '|'.
  const size_t cut = desc.find_last_of("]|");
  if (cut != std::string_view::npos && desc.size() - cut < 80) desc.remove_prefix(cut + 1);
  while (!desc.empty() && desc.front() == ' ') desc.remove_prefix(1);
  if (desc.size() > 80) desc = desc.substr(desc.size() - 80);
  b.desc = std::string(desc);
  const size_t bar_end = plain ? pct + 1 : low.find('|', pct + 2);
  if (bar_end == std::string_view::npos) return std::nullopt;
  size_t i = bar_end + 1;
  while (i < low.size() && low[i] == ' ') ++i;
  const size_t s0 = i;
  while (i < low.size() && is_digit(low[i]) && b.n < (int64_t(1) << 40)) b.n = b.n * 10 + (low[i++] - '0');
  if (i == s0 || i >= low.size() || low[i] != '/') return std::nullopt;
  ++i;
  const size_t s1 = i;
  while (i < low.size() && is_digit(low[i]) && b.total < (int64_t(1) << 40)) b.total = b.total * 10 + (low[i++] - '0');
  if (i == s1) return std::nullopt;
  const size_t lb = low.find('[', i);
  if (lb != std::string_view::npos) {
    const size_t rb = low.find(']', lb);
    b.postfix = std::string(low.substr(lb, (rb == std::string_view::npos ? low.size() : rb) - lb));
  }
  return b;
}

bool previews_by_name(std::string_view desc) {
  return contains(desc, "validat") || contains(desc, "sampl") || contains(desc, "generat");
}

const BarRule* bar_rule_for(std::string_view desc) {
  for (const BarRule& r : bar_rules())
    if (r.prefix ? starts_with(desc, r.text) : contains(desc, r.text)) return &r;
  return nullptr;
}

std::optional<int> int_field(std::string_view low, std::string_view key, size_t window = 4) {
  const size_t k = low.find(key);
  if (k == std::string_view::npos) return std::nullopt;
  auto v = int_after(low, k + key.size(), window);
  if (!v || *v < 0 || *v > (int64_t(1) << 30)) return std::nullopt;
  return static_cast<int>(*v);
}

}  // namespace

// summarize() of src/playbook/settings.cpp: "checkpointing on, batch 1 x accumulation 4, buckets
// [512,768], frames 41, samples 512x512/20 steps (no baseline)" / "sampling off", ", attention in
// chunks of 1024", ", VAE tiled", ", low_vram", ", base int8". The chunk and the tiling are printed
// only when on, so a whole summary (it starts with "checkpointing") without them says they are off.
void apply_settings_summary(Settings& s, std::string_view low) {
  const bool whole = contains(low, "checkpointing on") || contains(low, "checkpointing off");
  if (const size_t a = low.find("attention in chunks of "); a != std::string_view::npos) {
    if (auto n = int_after(low, a + 23, 2); n && *n > 0 && *n < (int64_t(1) << 30)) s.attention_chunk = static_cast<int>(*n);
  } else if (whole) {
    s.attention_chunk = 0;
  }
  if (contains(low, "vae tiled")) s.vae_tiling = true;
  else if (whole) s.vae_tiling = false;
  if (contains(low, "checkpointing on")) s.gradient_checkpointing = true;
  if (contains(low, "checkpointing off")) s.gradient_checkpointing = false;
  if (auto b = int_field(low, "batch ")) s.batch_size = *b;
  if (auto a = int_field(low, "accumulation ")) s.gradient_accumulation = *a;
  const size_t bk = low.find("buckets [");
  if (bk != std::string_view::npos) {
    const size_t close = low.find(']', bk);
    s.resolutions.clear();
    s.max_resolution.reset();
    for (size_t i = bk + 9; i < std::min(low.size(), close); ++i) {
      if (!is_digit(low[i])) continue;
      int n = 0;
      while (i < low.size() && is_digit(low[i]) && n < 100000) n = n * 10 + (low[i++] - '0');
      if (n >= 64) {
        s.resolutions.push_back(n);
        s.max_resolution = std::max(s.max_resolution.value_or(0), n);
      }
    }
    std::sort(s.resolutions.begin(), s.resolutions.end());
  }
  if (auto f = int_field(low, "frames ")) s.num_frames = *f;
  if (contains(low, "sampling off")) s.disable_sampling = true;
  const size_t sm = low.find("samples ");
  if (sm != std::string_view::npos) {
    s.disable_sampling = false;
    if (auto w = int_after(low, sm + 8, 2)) s.sample_width = static_cast<int>(*w);
    const size_t x = low.find('x', sm + 8);
    if (x != std::string_view::npos)
      if (auto h = int_after(low, x + 1, 2)) s.sample_height = static_cast<int>(*h);
    const size_t slash = low.find('/', sm + 8);
    if (slash != std::string_view::npos)
      if (auto n = int_after(low, slash + 1, 2)) s.sample_steps = static_cast<int>(*n);
    s.skip_first_sample = contains(low, "(no baseline)");
  }
  if (contains(low, "low_vram")) s.low_vram = true;
  if (contains(low, ", base ")) s.quantize = true;
}

void parse_progress_bar(AnalyzerState& st, std::string_view low, std::string_view text, int64_t line) {
  auto bar = parse_bar(low);
  if (!bar) return;
  const std::string& d = bar->desc;
  Activity& a = st.act;
  const bool has_loss = contains(bar->postfix, "loss") || contains(bar->postfix, "lr:") || contains(bar->postfix, "lr=");
  // A bar with a loss in its postfix is the training loop, whatever it is called.
  if (has_loss && !previews_by_name(d)) return record_training_progress(st, bar->n, bar->total, line, text);
  if (const BarRule* r = bar_rule_for(d)) {
    switch (r->kind) {
      case BarKind::kActivity: a.marker(r->stage).set(st.seq, line, text); return;
      case BarKind::kBeforeTraining:
        if (!a.training_seen) a.marker(r->stage).set(st.seq, line, text);
        return;
      case BarKind::kIgnore: return;
      case BarKind::kEpochs:
        if (!contains(d, "step")) {
          a.training_seen = true;
          if (!a.marker(Stage::kTrainingStep).seen()) a.marker(Stage::kTrainingStep).set(st.seq, line, text);
          return;
        }
        break;  // "epoch 1 step": counts steps
      case BarKind::kTrainingProgress: break;
    }
    return record_training_progress(st, bar->n, bar->total, line, text);
  }
  // A named long bar is a training loop, and so is an unnamed one of hundreds of steps once the
  // loop has begun (StableCascade's step bar has no name; previews count tens of steps). A short
  // unnamed bar belongs to whatever activity is under way and changes nothing.
  const bool loop_begun = a.marker(Stage::kTrainingStep).seen();
  if (has_loss || (!d.empty() && bar->total >= 50) || (d.empty() && loop_begun && bar->total >= 200))
    record_training_progress(st, bar->n, bar->total, line, text);
}

void parse_step_line(AnalyzerState& st, std::string_view low, size_t pos, size_t end, std::string_view text,
                     int64_t line) {
  if (pos > 0 && is_word(low[pos - 1])) return;
  if (contains(low, "%|")) return;  // a tqdm bar
  if (!contains(low, "loss") && !contains(low, "s/it") && !contains(low, "it/s")) return;
  size_t i = end;
  while (i < low.size() && (low[i] == ' ' || low[i] == ':' || low[i] == '=' || low[i] == '#')) ++i;
  if (i >= low.size() || !is_digit(low[i])) return;
  int64_t n = 0;
  while (i < low.size() && is_digit(low[i]) && n < (int64_t(1) << 40)) n = n * 10 + (low[i++] - '0');
  int64_t total = -1;
  if (i + 1 < low.size() && low[i] == '/' && is_digit(low[i + 1])) {
    total = 0;
    ++i;
    while (i < low.size() && is_digit(low[i]) && total < (int64_t(1) << 40)) total = total * 10 + (low[i++] - '0');
  }
  record_training_progress(st, n, total, line, text);
}

void parse_epoch_line(AnalyzerState& st, std::string_view low, size_t pos, size_t end, std::string_view text,
                      int64_t line) {
  if ((pos > 0 && is_word(low[pos - 1])) || contains(low, "%|")) return;
  size_t q = end;
  if (q >= low.size() || !is_digit(low[q])) return;
  while (q < low.size() && is_digit(low[q])) ++q;
  if (q < low.size() && low[q] == '/') {
    st.act.training_seen = true;
    st.act.marker(Stage::kTrainingStep).set(st.seq, line, text);
  }
}

void parse_sample_at_step(AnalyzerState& st, std::string_view low, size_t end, std::string_view text, int64_t line) {
  const auto n = int_after(low, end, 24);
  st.act.sample_at_step = n.value_or(-1);
  st.act.marker((n && *n == 0) ? Stage::kBaselineSample : Stage::kSampling).set(st.seq, line, text);
}

void parse_allocator_message(MemoryLog& mem, int64_t seq, std::string_view low) {
  MemoryNumbers& m = mem.numbers;
  auto size_after = [&](std::string_view key) -> std::optional<int64_t> {
    const size_t p = low.find(key);
    if (p == std::string_view::npos) return std::nullopt;
    size_t q = p + key.size();
    while (q < low.size() && (low[q] == ' ' || low[q] == ':')) ++q;
    return parse_size_at(low, q);
  };
  // A size right before `key` ("7.25 gib already allocated").
  auto size_before = [&](std::string_view key) -> std::optional<int64_t> {
    const size_t p = low.find(key);
    if (p == std::string_view::npos || p == 0) return std::nullopt;
    size_t e = p;
    while (e > 0 && low[e - 1] == ' ') --e;
    size_t b = e;
    while (b > 0 && is_alpha(low[b - 1])) --b;  // the unit
    while (b > 0 && low[b - 1] == ' ') --b;
    while (b > 0 && (is_digit(low[b - 1]) || low[b - 1] == '.' || low[b - 1] == ',')) --b;
    return parse_size_at(low, b);
  };
  bool touched = false;
  auto set = [&](std::optional<int64_t>& field, std::optional<int64_t> v) {
    if (!v) return;
    field = v;
    touched = true;
  };
  if (auto t = size_after("tried to allocate")) {
    m = MemoryNumbers{};  // a new message: forget the previous one's numbers
    mem.process_uses.clear();
    set(m.tried_to_allocate, t);
  }
  // PyTorch >= 2.1: "GPU 0 has a total capacity of X of which Y is free. Including non-PyTorch
  // memory, this process has Z memory in use. Of the allocated memory A is allocated by PyTorch,
  // and R is reserved by PyTorch but unallocated."
  if (contains(low, "total capacity of")) {
    m.new_format = true;
    set(m.total, size_after("total capacity of"));
    const size_t p = low.find("of which");
    if (p != std::string_view::npos) set(m.free, parse_size_at(low, p + 8));
  }
  if (contains(low, "this process has")) set(m.process_in_use, size_after("this process has"));
  set(m.allocated_by_pytorch, size_before("is allocated by pytorch"));
  set(m.reserved_unallocated, size_before("is reserved by pytorch but unallocated"));
  // "Process 1234 has 3.20 GiB memory in use": other processes on the same GPU.
  for (size_t p = low.find("process "); p != std::string_view::npos; p = low.find("process ", p + 8)) {
    size_t q = p + 8;
    if (q >= low.size() || !is_digit(low[q])) continue;
    while (q < low.size() && is_digit(low[q])) ++q;
    if (low.compare(q, 5, " has ") != 0) continue;
    const auto v = parse_size_at(low, q + 5);
    if (v && mem.process_uses.size() < 16) {
      mem.process_uses.push_back(*v);
      touched = true;
    }
  }
  // Older: "(GPU 0; 8.00 GiB total capacity; 7.25 GiB already allocated; 0 bytes free; 7.31 GiB
  // reserved in total by PyTorch)".
  if (contains(low, "gib total capacity") || contains(low, "mib total capacity") || contains(low, " total capacity;"))
    set(m.total, size_before("total capacity"));
  if (contains(low, "already allocated")) set(m.allocated_by_pytorch, size_before("already allocated"));
  if ((contains(low, "free;") || contains(low, "free)")) && !contains(low, "of which") && contains(low, " free"))
    set(m.free, size_before(" free"));
  if (auto r = size_before("reserved in total by pytorch")) {
    touched = true;
    if (m.allocated_by_pytorch && *r >= *m.allocated_by_pytorch) m.reserved_unallocated = *r - *m.allocated_by_pytorch;
  }
  // ComfyUI / memory-fraction message, MPS message.
  if (contains(low, "currently allocated")) set(m.allocated_by_pytorch, size_after("currently allocated"));
  if (starts_with(low, "requested")) set(m.tried_to_allocate, size_after("requested"));
  if (contains(low, "device limit")) set(m.total, size_after("device limit"));
  if (contains(low, "free (according to cuda)")) set(m.free, size_after("free (according to cuda)"));
  if (contains(low, "mps allocated")) {
    set(m.allocated_by_pytorch, size_after("mps allocated"));
    set(m.total, size_after("max allowed"));
  }
  if (touched) mem.seq = seq;
}

void parse_frame_line(AnalyzerState& st, std::string_view low, std::string_view text, size_t path_start) {
  // File "C:\x\train_network.py", line 1234, in train
  const size_t path_end = low.find('"', path_start);
  if (path_end == std::string_view::npos) return;
  const std::string_view path = text.substr(path_start, path_end - path_start);
  const size_t slash = path.find_last_of("/\\");
  Frame f;
  f.file = to_valid_utf8(path.substr(slash == std::string_view::npos ? 0 : slash + 1));
  std::transform(f.file.begin(), f.file.end(), f.file.begin(), lower);
  const size_t in = low.find(", in ", path_end);
  if (in != std::string_view::npos) {
    size_t fe = in + 5;
    while (fe < low.size() && (is_word(low[fe]) || low[fe] == '<' || low[fe] == '>')) ++fe;
    f.func = std::string(low.substr(in + 5, fe - in - 5));
  }
  // Deep tracebacks keep their outer and inner frames.
  if (st.frames.size() >= 96) st.frames.erase(st.frames.begin() + 48);
  st.frames.push_back(std::move(f));
  st.expect_code_line = true;
}

bool parse_rich_traceback_line(AnalyzerState& st, std::string_view trimmed_low, std::string_view trimmed) {
  static constexpr std::string_view kSide = "\xe2\x94\x82";         // │
  static constexpr std::string_view kTop = "\xe2\x95\xad";          // ╭
  static constexpr std::string_view kBottom = "\xe2\x95\xb0";       // ╰
  static constexpr std::string_view kCurrent = "\xe2\x9d\xb1";      // ❱
  if (starts_with(trimmed_low, kTop) || starts_with(trimmed_low, kBottom)) return true;
  if (!starts_with(trimmed_low, kSide)) return false;
  auto inner = [&](std::string_view s) {
    s.remove_prefix(kSide.size());
    if (ends_with(s, kSide)) s.remove_suffix(kSide.size());
    const size_t b = s.find_first_not_of(' ');
    const size_t e = s.find_last_not_of(' ');
    return b == std::string_view::npos ? std::string_view() : s.substr(b, e - b + 1);
  };
  const std::string_view low = inner(trimmed_low);
  const std::string_view text = inner(trimmed);
  // "❱ 1145 │   │   return self._apply(convert)": the failing line of the frame; "1144 │ ..." are
  // the lines around it.
  const bool current = starts_with(low, kCurrent);
  std::string_view numbered = current ? low.substr(kCurrent.size()) : low;
  while (!numbered.empty() && numbered.front() == ' ') numbered.remove_prefix(1);
  if (!numbered.empty() && is_digit(numbered.front())) {
    const size_t bar = numbered.find(kSide);
    if (bar == std::string_view::npos) return true;
    std::string_view code = numbered.substr(bar + kSide.size());
    while (!code.empty() && (code.front() == ' ' || starts_with(code, kSide)))
      code.remove_prefix(code.front() == ' ' ? 1 : kSide.size());
    // A paste cut inside the box keeps only context lines: they stand for the lost frame.
    if (st.frames.empty() && !code.empty()) st.frames.emplace_back();
    if (!st.frames.empty() && !code.empty() && (current || st.frames.back().code.empty()))
      st.frames.back().code = snippet(code, 200);
    return true;
  }
  // "/path/train_util.py:4233 in sample_images" (the path may be cut by the box).
  const size_t in = low.rfind(" in ");
  if (in == std::string_view::npos || in == 0) return true;
  size_t colon = in;
  while (colon > 0 && is_digit(low[colon - 1])) --colon;
  if (colon == in || colon == 0 || low[colon - 1] != ':') return true;
  const std::string_view path = text.substr(0, colon - 1);
  std::string_view func = low.substr(in + 4);
  size_t fe = 0;
  while (fe < func.size() && (is_word(func[fe]) || func[fe] == '<' || func[fe] == '>')) ++fe;
  if (fe == 0 || fe != func.size()) return true;
  Frame f;
  const size_t slash = path.find_last_of("/\\");
  f.file = to_valid_utf8(path.substr(slash == std::string_view::npos ? 0 : slash + 1));
  std::transform(f.file.begin(), f.file.end(), f.file.begin(), lower);
  f.func = std::string(func);
  if (st.frames.size() >= 96) st.frames.erase(st.frames.begin() + 48);
  st.frames.push_back(std::move(f));
  return true;
}

int rank_of_line(std::string_view low) {
  // torchrun/accelerate prefix every line of a child: "[rank1]: ..." / "[rank1]:[W ...".
  if (starts_with(low, "[rank") && low.size() > 6 && is_digit(low[5])) {
    const auto n = int_after(low, 5, 1);
    if (n && *n < 64) return static_cast<int>(*n);
  }
  // torch.distributed.elastic's failure summary: "rank      : 1 (local_rank: 1)".
  const size_t p = low.find("rank");
  if (p != std::string_view::npos && contains(low, "local_rank")) {
    size_t q = p + 4;
    while (q < low.size() && (low[q] == ' ' || low[q] == ':')) ++q;
    if (q < low.size() && is_digit(low[q])) {
      const auto n = int_after(low, q, 1);
      if (n && *n < 64) return static_cast<int>(*n);
    }
  }
  return -1;
}

void parse_guard_line(AnalyzerState& st, std::string_view low, std::string_view text, int64_t line) {
  GuardLog& g = st.guard;
  // Summary lines at the end of a run (guard.cpp summary()).
  if (contains(low, "oom-guard:   #")) return;  // "#1 train_step(...) early_steps -> ...": already seen as events
  // "price of #2 (enable_checkpointing): +24% s/step (0.110 -> 0.136 s), -38% peak (...)".
  if (const size_t p = low.find("price of #"); p != std::string_view::npos) {
    if (g.prices.size() < 16) g.prices.push_back(snippet(text.substr(p), 300));
    return;
  }
  if (const size_t p = low.find("settings now: "); p != std::string_view::npos) {
    g.settings_now = snippet(text.substr(p + 14), 300);
    apply_settings_summary(st.settings, low.substr(p + 14));
    return;
  }
  const bool failure = contains(low, "oom in phase") || contains(low, "ladder exhausted") ||
                       contains(low, "host ram exhausted") || contains(low, "oom-guard: environment");
  if (!failure) {
    // "only X of Y is free at start": memory held by something else before the run began.
    if (contains(low, "is free at start")) g.environment = true;
    return;
  }
  g.seen = true;
  ++g.events;
  if (contains(low, "host ram exhausted")) g.host = true;
  else g.oom = true;
  g.line.set(st.seq, line, text);
  // "oom-guard: OOM in phase train_step(step 3, bucket 512x512, batch 4) — early_steps; action: ..."
  const size_t dash = low.find("\xe2\x80\x94 ");
  if (dash != std::string_view::npos) {
    size_t e = dash + 4;
    while (e < low.size() && is_word(low[e])) ++e;
    g.classification = std::string(low.substr(dash + 4, e - dash - 4));
  }
  if (const size_t p = low.find("phase "); p != std::string_view::npos) {
    size_t e = p + 6;
    while (e < low.size() && is_word(low[e])) ++e;
    g.phase = std::string(low.substr(p + 6, e - p - 6));
  }
  // describe() prints step 0 / bucket 0x0 / batch 0 outside training steps: those are "unknown".
  g.step.reset();
  g.batch.reset();
  g.frames.reset();
  if (auto s = int_field(low, "(step "); s && *s >= 1) g.step = *s;
  if (auto b = int_field(low, "batch "); b && *b >= 1) g.batch = *b;
  if (auto f = int_field(low, "frames "); f && *f >= 1) g.frames = *f;
  if (const size_t bk = low.find("bucket "); bk != std::string_view::npos) {
    const auto w = int_after(low, bk + 7, 3);
    const size_t x = low.find('x', bk + 7);
    if (w && x != std::string_view::npos) {
      const auto h = int_after(low, x + 1, 2);
      const int side = static_cast<int>(std::max<int64_t>(*w, h.value_or(0)));
      if (side >= 64) g.bucket = side;
    }
  }
  if (contains(low, "ladder exhausted")) g.gave_up = true;
  if (contains(low, "oom-guard: environment")) g.environment = true;
  const size_t act = low.find("action: ");
  if (act != std::string_view::npos) {
    const std::string_view what = text.substr(act + 8);
    if (starts_with(low.substr(act + 8), "give up")) g.gave_up = true;
    else if (g.actions.size() < 16) g.actions.push_back(snippet(what, 200));
  }
  // What the guard changed is done: the fixes continue the ladder from there. The actions read
  // "<key>: <old> -> <new>" (src/memory/ladder.cpp).
  Settings& s = st.settings;
  // Give-ups carry the settings they ended on: "every memory lever is used (<summary>); ..." and
  // "... (guard max_attempts); settings: <summary>".
  if (const size_t u = low.find("lever is used ("); u != std::string_view::npos) apply_settings_summary(s, low.substr(u + 15));
  else if (const size_t k = low.find("; settings: "); k != std::string_view::npos) apply_settings_summary(s, low.substr(k + 12));
  if (const size_t a = low.find("memory.attention_chunk: "); a != std::string_view::npos) {
    const size_t arrow = low.find("-> ", a);
    if (arrow != std::string_view::npos)
      if (auto n = int_after(low, arrow + 3, 2); n && *n > 0 && *n < (int64_t(1) << 30)) {
        s.attention_chunk = static_cast<int>(*n);
        g.chunked_attention = true;
      }
  }
  if (contains(low, "model.low_vram: false -> true")) s.low_vram = true;
  if (contains(low, "model.quantize: false -> true")) s.quantize = true;
  if (contains(low, "train.disable_sampling: false -> true")) s.disable_sampling = true;
  if (contains(low, "train.skip_first_sample: false -> true")) s.skip_first_sample = true;
  if (contains(low, "memory.vae_tiling: false -> true")) {
    s.vae_tiling = true;
    g.tiled_vae = true;
  }
  if (contains(low, "gradient_checkpointing: false -> true") || contains(low, "gradient_checkpointing=true"))
    s.gradient_checkpointing = true;
  // The context's batch is the training batch only in a training step (one image while caching,
  // the previews at once while sampling).
  if (g.batch && g.phase == "train_step") s.batch_size = *g.batch;
  if (contains(low, "train.batch_size: ") && contains(low, " -> 1")) s.batch_size = 1;
  if (g.frames) s.num_frames = *g.frames;
  if (g.bucket && (!s.max_resolution || *g.bucket > *s.max_resolution)) s.max_resolution = *g.bucket;
  if (act == std::string_view::npos) return;
  // The new value of "<key>: <old> -> <new>" in the action, where the action names the key.
  auto after_arrow = [&](std::string_view key) -> size_t {
    const size_t k = low.find(key, act);
    if (k == std::string_view::npos) return std::string_view::npos;
    const size_t arrow = low.find("-> ", k + key.size());
    return arrow == std::string_view::npos ? arrow : arrow + 3;
  };
  auto new_int = [&](std::string_view key) -> std::optional<int> {
    const size_t at = after_arrow(key);
    if (at == std::string_view::npos) return std::nullopt;
    auto v = int_after(low, at, 2);
    if (!v || *v < 0 || *v > (int64_t(1) << 30)) return std::nullopt;
    return static_cast<int>(*v);
  };
  if (auto a = new_int("train.gradient_accumulation: ")) s.gradient_accumulation = *a;
  if (auto f = new_int("datasets.num_frames: ")) s.num_frames = *f;
  if (auto n = new_int("sample.sample_steps: ")) s.sample_steps = *n;
  // "sample.width/height: 1024x1024 -> 512x512"
  if (const size_t at = after_arrow("sample.width/height: "); at != std::string_view::npos) {
    if (auto w = int_after(low, at, 2)) s.sample_width = static_cast<int>(*w);
    const size_t x = low.find('x', at);
    if (x != std::string_view::npos)
      if (auto h = int_after(low, x + 1, 2)) s.sample_height = static_cast<int>(*h);
  }
  // "datasets.resolution: drop 1024 (its images are re-bucketed to 768); buckets [512, 768]"
  if (const size_t r = low.find("datasets.resolution: ", act); r != std::string_view::npos) {
    if (const size_t bk = low.find("buckets [", r); bk != std::string_view::npos) apply_settings_summary(s, low.substr(bk));
  }
}

bool parse_run_end_line(AnalyzerState& st, std::string_view low, std::string_view text, int64_t line) {
  GuardLog& g = st.guard;
  if (const size_t p = low.find("the settings that worked: "); p != std::string_view::npos) {
    g.effective_config = snippet(text.substr(p + 26), 300);
    return true;
  }
  // "done: runs/x/lora.safetensors (1000 steps)".
  const size_t p = low.find("done: ");
  if (p == std::string_view::npos || !ends_with(low, " steps)") || (p > 0 && is_word(low[p - 1]))) return false;
  const size_t open = low.rfind('(');
  if (open == std::string_view::npos || open < p) return false;
  g.finished = true;
  g.finished_steps = int_after(low, open + 1, 2);
  g.done_line.set(st.seq, line, text);
  return true;
}

}  // namespace lt::diagnose::detail
