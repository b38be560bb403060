#include "verdict.h"

#include <algorithm>
#include <bitset>
#include <cstdlib>

#include "loratrain/util/strings.h"
#include "text.h"

namespace lt::diagnose::detail {
namespace {

constexpr int64_t kGiB = int64_t(1) << 30;
constexpr int64_t kMiB = int64_t(1) << 20;

const CauseRecord& record(const AnalyzerState& st, Cause c) { return st.causes[static_cast<int>(c)]; }

// The latest fatal event among the specific look-alikes (a NaN in a progress bar is enough, and so
// is a GPU fault the kernel logs: NVRM lines are no Python errors). A NaN shown only by the bar
// does not end a run an exception of another kind ended (a shape error at step 492 with
// avr_loss=nan in the bar tqdm prints after it).
Cause latest_look_alike(const AnalyzerState& st, int64_t* at_seq) {
  Cause best = Cause::kNone;
  *at_seq = -1;
  const bool other_exception = record(st, Cause::kOther).fatal_count > 0;
  for (int c = static_cast<int>(Cause::kHostOom); c < static_cast<int>(Cause::kOther); ++c) {
    const CauseRecord& r = st.causes[c];
    int64_t seq = r.last_fatal.seq;
    const Cause cause = static_cast<Cause>(c);
    if (cause == Cause::kGpuFault && seq < 0) seq = r.last.seq;
    if (cause == Cause::kNanLoss && seq < 0 && !other_exception) seq = r.last.seq;
    if (seq > *at_seq) {
      *at_seq = seq;
      best = static_cast<Cause>(c);
    }
  }
  return best;
}

void note_environment(Diagnosis& d, const char* reason, double confidence, std::string note) {
  d.phase = Phase::kEnvironment;
  d.environment = reason;
  d.phase_confidence = std::max(d.phase_confidence, confidence);
  d.notes.push_back(std::move(note));
}

}  // namespace

const CauseRecord* decide_cause(const AnalyzerState& st, Diagnosis& d) {
  const CauseRecord& oom = record(st, Cause::kGpuOom);
  int64_t other_seq = -1;
  const Cause other = latest_look_alike(st, &other_seq);
  bool oom_wins = oom.count > 0;
  // AI Toolkit skipped the OOM batches and carried on; something else ended the run.
  if (oom_wins && st.oom_recovered_only && other_seq > st.last_oom_recovered_seq) oom_wins = false;
  // lora-train's guard line alone is an OOM.
  if (st.guard.oom && oom.count == 0) oom_wins = true;

  const CauseRecord* decisive = nullptr;
  if (oom_wins) {
    d.cause = Cause::kGpuOom;
    d.oom = true;
    decisive = &oom;
    const bool numbers = st.mem.numbers.tried_to_allocate || st.mem.numbers.total;
    d.confidence = numbers ? kOomWithNumbersConfidence : (st.oom_hard_count > 0 ? kOomConfidence : kOomSkippedConfidence);
    if (st.oom_hard_count == 0 && st.oom_weak_count > 0 && !st.guard.seen) d.confidence = kOomInDisguiseConfidence;
  } else if (other != Cause::kNone) {
    d.cause = other;
    decisive = &record(st, other);
    d.confidence = other == Cause::kHostOom ? kHostOomConfidence
                   : decisive->fatal_count > 0 ? kFatalLookAlikeConfidence
                                               : kLookAlikeConfidence;
  } else if (record(st, Cause::kOther).count > 0) {
    d.cause = Cause::kOther;
    decisive = &record(st, Cause::kOther);
    d.confidence = kOtherErrorConfidence;
  } else {
    d.cause = Cause::kNone;
    d.confidence = kNoFailureConfidence;
  }
  if (decisive) {
    const Marker& m = decisive->last_fatal.seen() ? decisive->last_fatal : decisive->last;
    d.error_line = snippet(m.text);
  }
  if (d.error_line.empty() && d.oom && st.guard.line.seen()) d.error_line = snippet(st.guard.line.text);
  return decisive;
}

// PyTorch (c10/cuda/CUDACachingAllocator.cpp) lists every process on the card: the others as
// "Process N has X memory in use", its own as "this process has X memory in use".
namespace {
bool others_listed(const MemoryLog& mem) { return !mem.process_uses.empty() && mem.numbers.process_in_use.has_value(); }
}  // namespace

MemoryNumbers memory_numbers(const MemoryLog& mem) {
  MemoryNumbers m = mem.numbers;
  if (others_listed(mem)) {
    int64_t sum = 0;
    for (int64_t u : mem.process_uses) sum += u;
    m.other_processes = sum;
  } else if (!mem.process_uses.empty()) {
    // Without "this process has": ours is the process whose use is closest to what PyTorch holds.
    const int64_t ours_estimate = m.allocated_by_pytorch.value_or(0) + m.reserved_unallocated.value_or(0);
    int64_t sum = 0;
    int64_t ours = mem.process_uses[0];
    for (int64_t u : mem.process_uses) {
      sum += u;
      if (std::llabs(u - ours_estimate) < std::llabs(ours - ours_estimate)) ours = u;
    }
    if (mem.process_uses.size() >= 2) m.other_processes = sum - ours;
    if (mem.process_uses.size() == 1) m.process_in_use = ours;
  } else if (m.total && m.free && m.process_in_use) {
    const int64_t others = *m.total - *m.free - *m.process_in_use;
    if (others >= 256 * kMiB) m.other_processes = others;  // below that: driver/context noise
  }
  if (m.reserved_unallocated) {
    const int64_t ru = *m.reserved_unallocated;
    const int64_t tried = m.tried_to_allocate.value_or(0);
    const int64_t total = m.total.value_or(0);
    m.fragmentation = ru >= 512 * kMiB && (ru >= tried || (total > 0 && ru * 10 >= total));
  }
  return m;
}

void apply_environment(const AnalyzerState& st, const CauseRecord* decisive, Diagnosis& d) {
  if (!d.oom) return;
  const MemoryNumbers& mm = d.memory;
  const Settings& s = d.settings;
  const int64_t total = mm.total.value_or(0);
  const bool before_training = d.phase == Phase::kLoad || d.phase == Phase::kBaselineSample ||
                               (d.phase == Phase::kEarlySteps && d.step.value_or(1) <= 1);
  // When this run's own tensors fill the card, the model/config is the problem, not the machine.
  const bool ours_fill_it = total > 0 && mm.allocated_by_pytorch && *mm.allocated_by_pytorch * 4 >= total * 3;

  if (st.guard.environment) {
    note_environment(d, "guard", kEnvironmentConfidence,
                     "lora-train found the GPU partly held by something else when the run started (oom-guard's "
                     "start-up check): free it before retrying.");
    return;
  }
  // torch/cuda/__init__.py _lazy_init(): creating the CUDA context failed, before this run
  // allocated anything: the card is full of something else.
  if (decisive && std::any_of(decisive->frames.begin(), decisive->frames.end(),
                              [](const Frame& f) { return f.func == "_lazy_init"; })) {
    note_environment(d, "cuda_context", kEnvironmentByNumbersConfidence,
                     "The CUDA context could not be created for lack of GPU memory, before this run allocated "
                     "anything: another process holds the GPU. Free it or use another GPU.");
    return;
  }
  // torch/utils/data/_utils/pin_memory.py ("in pin memory thread"), cudaHostAlloc: the failing
  // allocation was page-locked host memory, which WSL and Windows cap far below the RAM size.
  if (st.env.pinned_memory) {
    note_environment(d, "pinned_memory", kEnvironmentByNumbersConfidence,
                     std::string("The allocation that failed was pinned (page-locked) host memory, not GPU memory") +
                         (st.env.wsl ? " - WSL caps it well below the RAM it gives Linux" : "") +
                         ": turn off pinned memory (DataLoader pin_memory, pinned block swap) or give WSL more "
                         "memory (.wslconfig memory=); the training settings are not the problem.");
    return;
  }
  // Processes the message names are other programs on the card; memory only inferred as "not
  // this process" (total - free - ours) includes the desktop and driver, so it counts only when it
  // is large and this run's tensors do not fill the card anyway.
  const bool listed = others_listed(st.mem) && mm.other_processes && *mm.other_processes >= 512 * kMiB;
  const bool inferred = !others_listed(st.mem) && mm.other_processes &&
                        *mm.other_processes >= std::max<int64_t>(2 * kGiB, total / 10) && !ours_fill_it;
  if (listed || inferred) {
    note_environment(d, "other_processes", kEnvironmentByNumbersConfidence,
                     "Other processes hold " + format_bytes(*mm.other_processes) +
                         " of this GPU: free it (nvidia-smi shows who) before retrying.");
    return;
  }
  const bool little_ours = total > 0 && mm.allocated_by_pytorch && mm.free && *mm.allocated_by_pytorch * 4 < total &&
                           *mm.free * 20 < total && mm.tried_to_allocate && *mm.tried_to_allocate * 2 < total;
  if (little_ours) {
    note_environment(d, "little_pytorch", kEnvironmentByNumbersConfidence,
                     "PyTorch itself holds little of the GPU while it is full: another process or a dirty worker "
                     "holds the memory.");
    return;
  }
  // A small request failing while the driver reports gigabytes free: the card is shared or capped
  // (another process's peak, a memory fraction, MIG/vGPU, WSL), not too small for the config.
  if (mm.tried_to_allocate && mm.free && *mm.free >= kGiB && *mm.tried_to_allocate * 4 <= *mm.free &&
      !mm.fragmentation) {
    note_environment(d, "free_but_failed", kEnvironmentByNumbersConfidence,
                     "Only " + format_bytes(*mm.tried_to_allocate) + " failed to allocate while " +
                         format_bytes(*mm.free) +
                         " was reported free: the GPU is shared or capped (another process, a memory fraction, "
                         "MIG/WSL). Check what else uses it before changing the config.");
    return;
  }
  // One rank of a data-parallel job ran out while the others, doing the same work, did not.
  // A line from rank N proves N+1 ranks; a launcher stopping k processes proves k.
  const int ranks = std::max({static_cast<int>(std::bitset<64>(st.env.ranks_seen).count()), st.env.highest_rank + 1,
                              st.env.launcher_children});
  const int oom_ranks = static_cast<int>(std::bitset<64>(st.env.oom_ranks).count());
  // Not when the rank's own numbers explain it (its tensors fill the card, or fragmentation): with
  // pipeline parallelism (diffusion-pipe pipeline_stages) the ranks do not do the same work.
  if (ranks >= 2 && oom_ranks == 1 && d.stage != Stage::kSampling && d.stage != Stage::kBaselineSample &&
      !ours_fill_it && !mm.fragmentation) {
    int rank = 0;
    while (!(st.env.oom_ranks >> rank & 1)) ++rank;
    note_environment(d, "one_rank", kEnvironmentConfidence,
                     "Only rank " + std::to_string(rank) + " of a multi-GPU run ran out of memory while the others, "
                     "doing the same work, did not: its GPU holds something else or is smaller. Check that GPU.");
    return;
  }
  const bool cublas = decisive && contains(decisive->last.text, "CUBLAS_STATUS_ALLOC_FAILED");
  const bool full = (mm.free && *mm.free == 0) || cublas;
  const bool conservative = s.batch_size.value_or(0) == 1 && s.gradient_checkpointing.value_or(false) &&
                            s.max_resolution.value_or(4096) <= 1024;
  if (before_training && full && conservative && !ours_fill_it) {
    note_environment(d, "full_before_training", kEnvironmentConfidence,
                     "A conservative config (batch 1, gradient checkpointing on) failed before training started "
                     "with the GPU completely full: treat it as the environment, not the config.");
    return;
  }
  // cuBLAS failing to get its small workspace before training is the environment unless the log
  // shows an ambitious config.
  const bool ambitious = s.batch_size.value_or(1) > 1 || !s.gradient_checkpointing.value_or(true);
  if (before_training && cublas && !ambitious && !ours_fill_it) {
    note_environment(d, "cublas_before_training", kEnvironmentConfidence,
                     "cuBLAS could not get its small workspace before training started: the GPU is held by "
                     "something else or in a bad state. Start on a clean worker/GPU.");
  }
}

void apply_recovery(const AnalyzerState& st, Diagnosis& d) {
  const GuardLog& g = st.guard;
  d.guard_prices = g.prices;
  if (!(d.oom && g.oom && g.finished && !g.gave_up)) return;
  d.recovered = true;
  Recovery& r = d.recovery;
  r.oom_events = g.events;
  r.changes = g.actions;
  r.final_settings = g.settings_now;
  r.effective_config = g.effective_config;
  r.steps = g.finished_steps;
}

}  // namespace lt::diagnose::detail
