#include "loratrain/memory/guard.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "loratrain/util/strings.h"

namespace lt::memory {

// ---- PhaseScope ----

PhaseScope::PhaseScope(OomGuard* guard, size_t depth)
    : guard_(guard), depth_(depth), uncaught_(std::uncaught_exceptions()) {}

PhaseScope::PhaseScope(PhaseScope&& other) noexcept
    : guard_(other.guard_), depth_(other.depth_), uncaught_(other.uncaught_) {
  other.guard_ = nullptr;
}

PhaseScope::~PhaseScope() {
  if (guard_ != nullptr) guard_->exit_phase(depth_, std::uncaught_exceptions() > uncaught_);
}

// ---- OomGuard ----

namespace {

std::string first_line(const std::string& s) {
  const size_t nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

ExitCode to_exit_code(int code) {
  switch (code) {
    case 3: return ExitCode::kOomExhausted;
    case 4: return ExitCode::kEnvironment;
    case 1: return ExitCode::kRuntime;
    default: return ExitCode::kOk;
  }
}

}  // namespace

OomGuard::OomGuard(DeviceMemory& memory, GuardOptions options, MemorySettings initial)
    : memory_(memory), options_(options), settings_(initial),
      created_(std::chrono::steady_clock::now()) {
  history_.initial = std::move(initial);
}

double OomGuard::seconds_since_start() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - created_).count();
}

StartCheck OomGuard::check_start() {
  start_ = {};
  start_.at_start = memory_.free_and_total();
  start_checked_ = true;
  const FreeTotal& ft = start_.at_start;
  if (memory_.is_host() || ft.total <= 0) return start_;
  start_.foreign = std::max<int64_t>(0, ft.total - ft.free - memory_.reserved());
  if (start_.foreign > kForeignFraction * ft.total) {
    start_.warned = true;
    spdlog::warn(
        "oom-guard: only {} of {} is free at start on {}: {} is held by something else (another "
        "process, a dirty worker); borderline settings may not fit",
        format_bytes(ft.free), format_bytes(ft.total), memory_.name(), format_bytes(start_.foreign));
  }
  return start_;
}

PhaseScope OomGuard::enter(Phase phase, PhaseContext where) {
  // The device keeps one peak counter: fold it into the enclosing phase before resetting it.
  if (!frames_.empty()) {
    frames_.back().running_peak = std::max(frames_.back().running_peak, memory_.peak_allocated());
  }
  memory_.reset_peak();
  frames_.push_back({phase, where, memory_.allocated(), std::chrono::steady_clock::now()});
  return PhaseScope(this, frames_.size() - 1);
}

void OomGuard::set_context(const PhaseContext& where) {
  if (!frames_.empty()) frames_.back().where = where;
}

void OomGuard::exit_phase(size_t depth, bool failed) {
  if (depth >= frames_.size()) return;
  const Frame frame = frames_[depth];
  frames_.resize(depth);  // scopes are nested, so this is the innermost one
  const int64_t peak = std::max(frame.running_peak, memory_.peak_allocated());
  const MemorySnapshot at_exit{memory_.allocated(), memory_.reserved(), peak};
  peaks_.record(frame.phase, at_exit);
  if (!frames_.empty()) frames_.back().running_peak = std::max(frames_.back().running_peak, peak);
  if (failed) {
    last_failure_ = Failure{frame.phase, frame.where, at_exit};
  } else if (frame.phase == Phase::train_step) {
    ++steps_completed_;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - frame.started).count();
    step_costs_.push_back({frame.where.step, seconds, peak});
  }
}

std::optional<Phase> OomGuard::current_phase() const {
  if (frames_.empty()) return std::nullopt;
  return frames_.back().phase;
}

bool OomGuard::is_largest_bucket(const PhaseContext& where) const {
  const auto active = settings_.active_resolutions();
  if (active.empty()) return where.width > 0;
  if (where.resolution > 0) return where.resolution >= active.back();
  if (where.width <= 0 || where.height <= 0) return false;
  // Buckets keep about the base resolution's pixel count: the nearest base is the owner.
  const double side = std::sqrt(static_cast<double>(where.width) * where.height);
  int nearest = active.front();
  for (int r : active) {
    if (std::abs(r - side) < std::abs(nearest - side)) nearest = r;
  }
  return nearest == active.back();
}

Decision OomGuard::finish(Decision d, AttemptRecord rec, std::chrono::steady_clock::time_point t0) {
  memory_.empty_cache();
  rec.after = snapshot(memory_);
  rec.settings = d.settings;
  rec.at_seconds = seconds_since_start();
  rec.recover_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (d.give_up()) {
    spdlog::error("{}", d.message);
    outcome_ = to_string(d.action.kind);
  } else {
    spdlog::warn("{}", d.message);
  }
  if (!rec.reason.empty()) {
    spdlog::info("oom-guard:   evidence: {}; at the failure {} allocated, after cleanup {}",
                 rec.reason, format_bytes(rec.before.allocated), format_bytes(rec.after.allocated));
  }
  attempts_.push_back(std::move(rec));
  return d;
}

PeerOutOfMemory::PeerOutOfMemory(std::vector<int> ranks)
    : Error(ExitCode::kRuntime, [&] {
        std::string text;
        for (int r : ranks) text += (text.empty() ? "" : ", ") + std::to_string(r);
        return "rank " + text + " ran out of memory";
      }()),
      ranks_(std::move(ranks)) {}

bool is_memory_failure(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const PeerOutOfMemory&) {
    return true;
  } catch (...) {
  }
  return inspect_failure(error).kind != FailureKind::none;
}

std::string decision_to_text(const Decision& d) {
  nlohmann::json j;
  j["kind"] = static_cast<int>(d.kind);
  j["action"] = static_cast<int>(d.action.kind);
  j["description"] = d.action.description;
  j["settings"] = d.settings;
  j["exit_code"] = static_cast<int>(d.exit_code);
  j["message"] = d.message;
  if (d.classification) j["classification"] = to_string(*d.classification);
  return j.dump();
}

Decision decision_from_text(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text);
  Decision d;
  d.kind = static_cast<Decision::Kind>(j.at("kind").get<int>());
  d.action.kind = static_cast<ActionKind>(j.at("action").get<int>());
  d.action.description = j.at("description").get<std::string>();
  playbook::from_json(j.at("settings"), d.settings);
  d.action.settings = d.settings;
  d.exit_code = static_cast<ExitCode>(j.at("exit_code").get<int>());
  d.message = j.at("message").get<std::string>();
  if (j.contains("classification")) d.classification = playbook::classification_from_string(j.at("classification").get<std::string>());
  return d;
}

Decision OomGuard::recover(std::exception_ptr error) {
  const auto t0 = std::chrono::steady_clock::now();
  bool peer = false;
  try {
    std::rethrow_exception(error);
  } catch (const PeerOutOfMemory&) {
    peer = true;
  } catch (...) {
  }
  if (ranks_ == nullptr) return recover_here(error);
  if (!peer && inspect_failure(error).kind == FailureKind::none) return recover_here(error);  // not for the ranks
  std::optional<Decision> own;
  if (!peer) own = recover_here(error);
  const Decision agreed = ranks_->decide(own);
  if (own && decision_to_text(*own) == decision_to_text(agreed)) return agreed;
  return follow(agreed, own, t0);
}

// Another rank's decision, made this rank's: the same change, the same history for the ladder.
Decision OomGuard::follow(const Decision& agreed, const std::optional<Decision>& own,
                          std::chrono::steady_clock::time_point t0) {
  if (own) {
    // This rank failed too and has recorded its own choice: the agreed one replaces it.
    settings_ = agreed.retry() ? agreed.settings : settings_;
    if (!attempts_.empty()) {
      attempts_.back().action = agreed.action.kind;
      attempts_.back().description = agreed.action.description;
      attempts_.back().settings = agreed.settings;
    }
    spdlog::warn("oom-guard: the ranks agreed on another rank's change: {}", agreed.action.description);
    return agreed;
  }
  const Failure f = take_failure();
  if (agreed.rethrow()) return agreed;  // the guard is off: every rank ends with the error
  AttemptRecord rec;
  rec.attempt = static_cast<int>(attempts_.size()) + 1;
  rec.steps_before = step_costs_.size();
  rec.phase = f.phase;
  rec.where = f.where;
  rec.error = "another rank ran out of memory";
  rec.classification = agreed.classification;
  rec.before = f.at_exit;
  failed_steps_.push_back({f.phase, f.where.step});
  if (agreed.action.kind == ActionKind::revert_scale_up && pending_) {
    blocked_.insert(pending_->lever);
    if (!scale_ups_.empty()) scale_ups_.back().reverted = true;
    pending_.reset();
  }
  if (!agreed.action.gives_up()) history_.failed.push_back(settings_);
  if (agreed.action.kind == ActionKind::empty_cache_retry) history_.quick_retries.push_back({f.phase, f.where.step});
  stable_steps_ = 0;
  if (agreed.retry()) settings_ = agreed.settings;
  if (agreed.give_up()) outcome_ = to_string(agreed.action.kind);
  Decision d = agreed;
  const std::string prefix = "oom-guard: ";
  d.message = prefix + "another rank's " + (starts_with(d.message, prefix) ? d.message.substr(prefix.size()) : d.message);
  rec.action = d.action.kind;
  rec.description = d.action.description;
  return finish(std::move(d), std::move(rec), t0);
}

// The failure being recovered from: the one the unwinding scope recorded, or, when it failed
// outside any scope that unwound, the innermost open phase's. Either way it is consumed.
OomGuard::Failure OomGuard::take_failure() {
  Failure f;
  if (last_failure_) {
    f = *last_failure_;
  } else {
    f.phase = frames_.empty() ? Phase::load : frames_.back().phase;
    f.where = frames_.empty() ? PhaseContext{} : frames_.back().where;
    f.at_exit = snapshot(memory_);
  }
  last_failure_.reset();
  return f;
}

Decision OomGuard::recover_here(std::exception_ptr error) {
  const auto t0 = std::chrono::steady_clock::now();
  OomInfo info = inspect_failure(error);
  Decision d;
  if (!options_.enabled || info.kind == FailureKind::none) {
    last_failure_.reset();
    return d;  // rethrow
  }

  const Failure f = take_failure();

  AttemptRecord rec;
  rec.attempt = static_cast<int>(attempts_.size()) + 1;
  rec.steps_before = step_costs_.size();
  rec.phase = f.phase;
  rec.where = f.where;
  rec.error = first_line(info.message);
  rec.numbers = info.numbers;
  const OomNumbers& n = info.numbers;
  rec.before.allocated = n.allocated.value_or(f.at_exit.peak);
  rec.before.reserved = n.allocated ? *n.allocated + n.reserved_unallocated.value_or(0)
                                    : f.at_exit.reserved;
  rec.before.peak = f.at_exit.peak;

  if (info.kind == FailureKind::host_oom) {
    d.kind = Decision::Kind::give_up;
    d.action = {ActionKind::give_up_host_memory,
                "give up: host RAM is exhausted, not device memory (" + info.signature +
                    "); cache latents to disk, use fewer data workers or a machine with more RAM",
                settings_};
    d.settings = settings_;
    d.exit_code = ExitCode::kRuntime;
    d.message = fmt::format("oom-guard: host RAM exhausted in phase {}; action: {}",
                            describe(f.phase, f.where), d.action.description);
    rec.action = d.action.kind;
    rec.description = d.action.description;
    return finish(std::move(d), std::move(rec), t0);
  }

  FailureContext ctx;
  ctx.phase = f.phase;
  ctx.where = f.where;
  ctx.largest_bucket = is_largest_bucket(f.where);
  ctx.settings = settings_;
  ctx.error = info;
  if (!ctx.error.numbers.total) {
    const int64_t total = memory_.free_and_total().total;
    if (total > 0) ctx.error.numbers.total = total;
  }
  if (!ctx.error.numbers.allocated) ctx.error.numbers.allocated = f.at_exit.peak;
  ctx.at_start = start_.at_start;
  ctx.foreign_at_start = start_.foreign;
  ctx.steps_completed = steps_completed_;
  const std::pair<Phase, int64_t> key{f.phase, f.where.step};
  ctx.same_step_failed_before =
      std::find(failed_steps_.begin(), failed_steps_.end(), key) != failed_steps_.end();
  failed_steps_.push_back(key);

  const Classified c = classify(ctx);
  rec.classification = c.kind;
  rec.reason = c.reason;

  Action action;
  if (pending_) {
    // The last scale-up did not hold: back to the settings that were stable, for good.
    blocked_.insert(pending_->lever);
    history_.failed.push_back(settings_);
    action = {ActionKind::revert_scale_up,
              fmt::format("revert the scale-up ({}): back to {}; it stays off for the rest of the run",
                          to_string(pending_->lever), summarize(pending_->before)),
              pending_->before};
    if (!scale_ups_.empty()) scale_ups_.back().reverted = true;
    pending_.reset();
  } else if (static_cast<int>(attempts_.size()) >= options_.max_attempts) {
    action = {ActionKind::give_up_exhausted,
              fmt::format("give up: {} OOM recoveries in this run (guard max_attempts); settings: {}",
                          attempts_.size(), summarize(settings_)),
              settings_};
  } else {
    action = next_action(ctx, c, history_);
    if (!action.gives_up()) history_.failed.push_back(settings_);
    if (action.kind == ActionKind::empty_cache_retry) {
      history_.quick_retries.push_back({f.phase, f.where.step});
    }
    if (c.kind == Classification::environment) ++history_.environment_failures;
  }
  stable_steps_ = 0;

  d.action = action;
  d.settings = action.settings;
  d.classification = c.kind;
  if (action.gives_up()) {
    d.kind = Decision::Kind::give_up;
    d.exit_code = to_exit_code(action.exit_code());
  } else {
    d.kind = Decision::Kind::retry;
    settings_ = action.settings;
  }
  d.message = fmt::format("oom-guard: OOM in phase {} \u2014 {}; action: {}",
                          describe(f.phase, f.where), to_string(c.kind), action.description);
  rec.action = action.kind;
  rec.description = action.description;
  return finish(std::move(d), std::move(rec), t0);
}

std::optional<Action> OomGuard::step_completed(int64_t step) {
  ++stable_steps_;
  if (stable_steps_ < options_.scale_up_after) return std::nullopt;
  if (pending_) {
    spdlog::info("oom-guard: scale-up ({}) held for {} steps; kept", to_string(pending_->lever),
                 stable_steps_);
    pending_.reset();
  }
  if (!options_.scale_up || attempts_.empty()) return std::nullopt;
  auto up = next_scale_up(settings_, history_.initial, blocked_);
  if (!up) return std::nullopt;
  spdlog::warn("oom-guard: scale up after {} stable steps (step {}); action: {}", stable_steps_,
               step, up->action.description);
  pending_ = PendingScaleUp{up->lever, settings_};
  scale_ups_.push_back({step, up->lever, up->action.description, false});
  settings_ = up->action.settings;
  stable_steps_ = 0;
  return up->action;
}

namespace {

bool changes_settings(ActionKind k) { return k != ActionKind::empty_cache_retry && !gives_up(k); }

}  // namespace

std::optional<double> Price::time_change() const {
  if (!seconds_before || !seconds_after || *seconds_before <= 0) return std::nullopt;
  return *seconds_after / *seconds_before - 1;
}

std::optional<double> Price::peak_change() const {
  if (!peak_before || !peak_after || *peak_before <= 0) return std::nullopt;
  return static_cast<double>(*peak_after) / static_cast<double>(*peak_before) - 1;
}

std::string Price::describe() const {
  if (!seconds_after) return "no training step ran with it yet";
  if (auto t = time_change(); t && peak_change()) {
    return fmt::format("{:+.0f}% s/step ({:.3f} -> {:.3f} s), {:+.0f}% peak ({} -> {})", *t * 100, *seconds_before,
                       *seconds_after, *peak_change() * 100, format_bytes(*peak_before), format_bytes(*peak_after));
  }
  return fmt::format("{:.3f} s/step, peak {} in the {} step{} after (none before it)", *seconds_after,
                     format_bytes(*peak_after), steps_after, steps_after == 1 ? "" : "s");
}

std::optional<Price> OomGuard::price(size_t index) const {
  if (index >= attempts_.size() || !changes_settings(attempts_[index].action)) return std::nullopt;
  // The steps under the previous settings start at the previous change made at an earlier step;
  // those under the new ones end at the next change made at a later step.
  const size_t at = attempts_[index].steps_before;
  size_t begin = 0, end = step_costs_.size();
  Price p;
  for (const auto& a : attempts_) {
    if (!changes_settings(a.action)) continue;
    if (a.steps_before < at) begin = std::max(begin, a.steps_before);
    if (a.steps_before > at) end = std::min(end, a.steps_before);
    if (a.steps_before == at) p.attempts.push_back(a.attempt);
  }
  auto window = [this](size_t from, size_t to, std::optional<double>& seconds, std::optional<int64_t>& peak) {
    double sum = 0;
    int64_t max_peak = 0;
    for (size_t i = from; i < to; ++i) {
      sum += step_costs_[i].seconds;
      max_peak = std::max(max_peak, step_costs_[i].peak);
    }
    if (to > from) {
      seconds = sum / static_cast<double>(to - from);
      peak = max_peak;
    }
    return static_cast<int>(to - from);
  };
  p.steps_before = window(std::max(begin, at >= kPriceWindow ? at - kPriceWindow : 0), at, p.seconds_before, p.peak_before);
  p.steps_after = window(at, std::min(end, at + kPriceWindow), p.seconds_after, p.peak_after);
  return p;
}

void OomGuard::adopt_planned(const MemorySettings& settings, std::vector<PlannedChangeRecord> changes) {
  if (settings != settings_) history_.failed.push_back(settings_);
  settings_ = settings;
  for (auto& c : changes) planned_.push_back(std::move(c));
}

std::string OomGuard::summary() const {
  std::string out;
  if (attempts_.empty()) {
    out += "oom-guard: no OOM in this run\n";
  } else {
    int changes = 0;
    for (const auto& a : attempts_) {
      if (a.action != ActionKind::empty_cache_retry && !gives_up(a.action)) ++changes;
    }
    out += fmt::format("oom-guard: {} OOM{} handled, {} configuration change{}\n", attempts_.size(),
                       attempts_.size() == 1 ? "" : "s", changes, changes == 1 ? "" : "s");
    for (size_t i = 0; i < attempts_.size(); ++i) {
      const auto& a = attempts_[i];
      out += fmt::format("  #{} {} {} -> {}\n", a.attempt, describe(a.phase, a.where),
                         a.classification ? to_string(*a.classification) : "host_ram",
                         a.description);
      // One price line per group of changes, after its last member.
      auto p = price(i);
      if (!p || p->attempts.back() != a.attempt) continue;
      std::string levers;
      for (int n : p->attempts) levers += (levers.empty() ? "" : ", ") + std::string(to_string(attempts_[n - 1].action));
      const std::string which = p->attempts.size() == 1
                                    ? fmt::format("#{}", a.attempt)
                                    : fmt::format("#{}-#{}", p->attempts.front(), p->attempts.back());
      out += fmt::format("     price of {} ({}): {}\n", which, levers, p->describe());
    }
  }
  for (const auto& s : scale_ups_) {
    out += fmt::format("  scale-up at step {}: {}{}\n", s.step, s.description,
                       s.reverted ? " (reverted)" : "");
  }
  if (settings_ != history_.initial) {
    out += "oom-guard: settings now: " + summarize(settings_) + "\n";
  }
  out += "oom-guard: peak memory per phase on " + memory_.name() + ":\n" + peaks_.table();
  return out;
}

nlohmann::json OomGuard::to_json() const {
  using nlohmann::json;
  json attempts = json::array();
  for (size_t i = 0; i < attempts_.size(); ++i) {
    const auto& a = attempts_[i];
    json price = nullptr;
    if (auto p = this->price(i)) {
      auto opt = [](const auto& v) { return v ? json(*v) : json(nullptr); };
      price = {{"steps_before", p->steps_before},
               {"steps_after", p->steps_after},
               {"seconds_per_step_before", opt(p->seconds_before)},
               {"seconds_per_step_after", opt(p->seconds_after)},
               {"peak_before", opt(p->peak_before)},
               {"peak_after", opt(p->peak_after)},
               {"time_change", opt(p->time_change())},
               {"peak_change", opt(p->peak_change())},
               {"shared_with", p->attempts},
               {"summary", p->describe()}};
    }
    attempts.push_back({
        {"attempt", a.attempt},
        {"phase", to_string(a.phase)},
        {"step", a.where.step},
        {"bucket", {a.where.width, a.where.height}},
        {"frames", a.where.frames},
        {"batch", a.where.batch},
        {"classification", a.classification ? json(to_string(*a.classification)) : json(nullptr)},
        {"reason", a.reason},
        {"action", to_string(a.action)},
        {"description", a.description},
        {"error", a.error},
        {"numbers", a.numbers},
        {"memory_before", a.before},
        {"memory_after", a.after},
        {"settings_after", a.settings},
        {"at_seconds", a.at_seconds},
        {"recover_seconds", a.recover_seconds},
        {"price", price},
    });
  }
  json scale_ups = json::array();
  for (const auto& s : scale_ups_) {
    scale_ups.push_back({{"step", s.step},
                         {"lever", to_string(s.lever)},
                         {"description", s.description},
                         {"reverted", s.reverted}});
  }
  json planned = json::array();
  for (const auto& c : planned_) {
    planned.push_back({{"action", c.action},
                       {"description", c.description},
                       {"phase", to_string(c.phase)},
                       {"predicted_peak_before", c.predicted_before},
                       {"predicted_peak_after", c.predicted_after}});
  }
  json start = nullptr;
  if (start_checked_) {
    start = {{"free", start_.at_start.free},
             {"total", start_.at_start.total},
             {"foreign", start_.foreign},
             {"warned", start_.warned}};
  }
  return {
      {"enabled", options_.enabled},
      {"device", memory_.name()},
      {"options",
       {{"max_attempts", options_.max_attempts},
        {"scale_up", options_.scale_up},
        {"scale_up_after", options_.scale_up_after}}},
      {"start", start},
      {"outcome", outcome_},
      {"steps_completed", steps_completed_},
      {"planned_changes", planned},
      {"attempts", attempts},
      {"scale_ups", scale_ups},
      {"initial_settings", history_.initial},
      {"final_settings", settings_},
      {"peaks", peaks_},
      {"overall_peak", peaks_.overall_peak()},
  };
}

}  // namespace lt::memory
