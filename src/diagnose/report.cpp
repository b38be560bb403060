#include "loratrain/diagnose/report.h"

#include <cstdio>
#include <sstream>

#include "loratrain/util/strings.h"

namespace lt::diagnose {
namespace {

nlohmann::json opt(const std::optional<int64_t>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }
nlohmann::json opt(const std::optional<int>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }
nlohmann::json opt(const std::optional<bool>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }
nlohmann::json opt(const std::optional<std::string>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

double round2(double x) { return static_cast<double>(static_cast<int>(x * 100 + 0.5)) / 100.0; }

std::string verdict_text(const Diagnosis& d) {
  if (d.recovered) return "GPU out of memory, RECOVERED: the OOM guard handled it and the run finished";
  switch (d.cause) {
    case Cause::kGpuOom: return "GPU out of memory";
    case Cause::kHostOom: return "NOT a GPU OOM: the system ran out of RAM (host OOM killer / paging file)";
    case Cause::kDataLoaderWorker: return "NOT a GPU OOM: a DataLoader worker died";
    case Cause::kNanLoss: return "NOT a GPU OOM: the loss became NaN/inf";
    case Cause::kGpuFault: return "NOT a GPU OOM: a GPU fault (illegal memory access / launch failure / Xid)";
    case Cause::kMissingFile: return "NOT a GPU OOM: a missing or unreadable file";
    case Cause::kVersionMismatch: return "NOT a GPU OOM: a package/model version mismatch";
    case Cause::kOther: return "NOT a GPU OOM: another error";
    default: return "no failure signature found";
  }
}

std::string phase_text(Phase p) {
  switch (p) {
    case Phase::kLoad: return "A. load / before step 1";
    case Phase::kBaselineSample: return "A. baseline sample before training";
    case Phase::kEarlySteps: return "B. early training steps (1-10)";
    case Phase::kLaterSteps: return "D. later steps (borderline config, largest bucket)";
    case Phase::kSampling: return "C. sampling / previews during training";
    case Phase::kVideoSpike: return "video spike (frames / buckets on training steps)";
    case Phase::kEnvironment: return "E. environment (GPU/worker state, other processes)";
    default: return "unknown";
  }
}

}  // namespace

nlohmann::json to_json(const Diagnosis& d, const std::string& input_name) {
  using nlohmann::json;
  json j;
  j["schema_version"] = kJsonSchemaVersion;
  j["input"] = input_name;
  j["lines"] = d.lines;
  j["bytes"] = d.bytes;
  j["oom"] = d.oom;
  j["cause"] = cause_name(d.cause);
  j["confidence"] = round2(d.confidence);
  j["phase"] = phase_name(d.phase);
  j["phase_confidence"] = round2(d.phase_confidence);
  j["stage"] = stage_name(d.stage);
  j["step"] = opt(d.step);
  j["trainer"] = trainer_name(d.trainer);
  j["trainer_detail"] = d.trainer_detail.empty() ? json(nullptr) : json(d.trainer_detail);
  j["model_family"] = family_name(d.family);
  j["model_kind"] = kind_name(d.kind);
  j["error_line"] = d.error_line.empty() ? json(nullptr) : json(d.error_line);
  const MemoryNumbers& m = d.memory;
  j["memory"] = {
      {"tried_to_allocate", opt(m.tried_to_allocate)},
      {"total", opt(m.total)},
      {"free", opt(m.free)},
      {"process_in_use", opt(m.process_in_use)},
      {"allocated_by_pytorch", opt(m.allocated_by_pytorch)},
      {"reserved_unallocated", opt(m.reserved_unallocated)},
      {"other_processes", opt(m.other_processes)},
      {"fragmentation", m.fragmentation},
  };
  const Settings& s = d.settings;
  j["settings"] = {
      {"batch_size", opt(s.batch_size)},
      {"gradient_accumulation", opt(s.gradient_accumulation)},
      {"max_resolution", opt(s.max_resolution)},
      {"resolutions", s.resolutions},
      {"num_frames", opt(s.num_frames)},
      {"rank", opt(s.rank)},
      {"precision", opt(s.precision)},
      {"optimizer", opt(s.optimizer)},
      {"gradient_checkpointing", opt(s.gradient_checkpointing)},
      {"low_vram", opt(s.low_vram)},
      {"quantize", opt(s.quantize)},
      {"blocks_to_swap", opt(s.blocks_to_swap)},
      {"disable_sampling", opt(s.disable_sampling)},
      {"skip_first_sample", opt(s.skip_first_sample)},
      {"sample_width", opt(s.sample_width)},
      {"sample_height", opt(s.sample_height)},
      {"sample_steps", opt(s.sample_steps)},
      {"sample_every", opt(s.sample_every)},
      {"memory_efficient_attention", opt(s.memory_efficient_attention)},
      {"attention_chunk", opt(s.attention_chunk)},
      {"vae_tiling", opt(s.vae_tiling)},
  };
  j["evidence"] = json::array();
  for (const Evidence& e : d.evidence) j["evidence"].push_back({{"line", e.line}, {"text", e.text}, {"why", e.why}});
  j["fixes"] = json::array();
  for (const Fix& f : d.fixes)
    j["fixes"].push_back({{"id", f.id},
                          {"setting", f.setting},
                          {"config_key", f.config_key.empty() ? json(nullptr) : json(f.config_key)},
                          {"value", f.value.empty() ? json(nullptr) : json(f.value)},
                          {"description", f.description}});
  j["in_vae"] = opt(d.in_vae);
  j["tried"] = json::array();
  for (const TriedLever& t : d.tried)
    j["tried"].push_back({{"id", t.id}, {"setting", t.setting}, {"price", t.price.empty() ? json(nullptr) : json(t.price)}});
  j["notes"] = d.notes;
  j["environment"] = d.environment.empty() ? json(nullptr) : json(d.environment);
  j["recovered"] = d.recovered;
  if (d.recovered) {
    const Recovery& r = d.recovery;
    j["recovery"] = {{"oom_events", r.oom_events},
                     {"changes", r.changes},
                     {"final_settings", r.final_settings.empty() ? json(nullptr) : json(r.final_settings)},
                     {"effective_config", r.effective_config.empty() ? json(nullptr) : json(r.effective_config)},
                     {"steps", opt(r.steps)},
                     {"prices", d.guard_prices}};
  } else {
    j["recovery"] = nullptr;
  }
  return j;
}

std::string format_report(const Diagnosis& d, const std::string& input_name) {
  std::ostringstream o;
  char pct[32];
  std::snprintf(pct, sizeof pct, "%.0f%%", d.confidence * 100);
  o << "lora-train diagnose: " << input_name << " (" << d.lines << " lines)\n\n";
  o << "Verdict:  " << verdict_text(d) << "  [confidence " << pct << "]\n";
  if (!d.error_line.empty()) o << "Error:    " << d.error_line << "\n";
  std::snprintf(pct, sizeof pct, "%.0f%%", d.phase_confidence * 100);
  o << "Phase:    " << phase_text(d.phase) << "  [" << stage_name(d.stage);
  if (d.step) o << ", step " << *d.step;
  o << ", confidence " << pct << "]\n";
  o << "Trainer:  " << trainer_display_name(d.trainer);
  if (!d.trainer_detail.empty()) o << " (" << d.trainer_detail << ")";
  o << "\nModel:    " << family_name(d.family) << " (" << kind_name(d.kind) << ")\n";

  const MemoryNumbers& m = d.memory;
  if (d.oom && (m.tried_to_allocate || m.total || m.allocated_by_pytorch)) {
    o << "\nMemory at the failure:\n";
    auto row = [&](const char* label, const std::optional<int64_t>& v) {
      if (v) o << "  " << label << format_bytes(*v) << "\n";
    };
    row("tried to allocate:        ", m.tried_to_allocate);
    row("total capacity:           ", m.total);
    row("free:                     ", m.free);
    row("in use by this process:   ", m.process_in_use);
    row("allocated by PyTorch:     ", m.allocated_by_pytorch);
    row("reserved, unallocated:    ", m.reserved_unallocated);
    row("held by other processes:  ", m.other_processes);
    if (m.fragmentation) o << "  -> large reserved-but-unallocated memory: fragmentation\n";
  }
  const Settings& s = d.settings;
  std::ostringstream st;
  if (s.batch_size) st << " batch " << *s.batch_size << ";";
  if (s.gradient_accumulation) st << " accumulation " << *s.gradient_accumulation << ";";
  if (s.max_resolution) st << " max resolution " << *s.max_resolution << ";";
  if (s.num_frames) st << " frames " << *s.num_frames << ";";
  if (s.rank) st << " rank " << *s.rank << ";";
  if (s.precision) st << " precision " << *s.precision << ";";
  if (s.optimizer) st << " optimizer " << *s.optimizer << ";";
  if (s.gradient_checkpointing) st << " gradient checkpointing " << (*s.gradient_checkpointing ? "on" : "off") << ";";
  if (s.low_vram) st << " low_vram " << (*s.low_vram ? "on" : "off") << ";";
  if (s.quantize) st << " quantized base " << (*s.quantize ? "yes" : "no") << ";";
  if (s.memory_efficient_attention)
    st << " memory-efficient attention " << (*s.memory_efficient_attention ? "on" : "off") << ";";
  if (s.attention_chunk) st << " attention chunk " << *s.attention_chunk << ";";
  if (s.vae_tiling) st << " VAE tiling " << (*s.vae_tiling ? "on" : "off") << ";";
  if (!st.str().empty()) o << "\nSettings seen in the log:" << st.str() << "\n";

  if (!d.evidence.empty()) {
    o << "\nEvidence:\n";
    for (const Evidence& e : d.evidence) {
      if (e.line > 0) o << "  line " << e.line << ": " << e.text << "   <- " << e.why << "\n";
      else o << "  " << e.text << "   <- " << e.why << "\n";
    }
  }
  if (d.recovered) {
    const Recovery& r = d.recovery;
    o << "\nWhat the OOM guard changed (" << r.oom_events << " OOM" << (r.oom_events == 1 ? "" : "s") << " handled):\n";
    for (const std::string& c : r.changes) o << "  - " << c << "\n";
    for (const std::string& p : d.guard_prices) o << "    " << p << "\n";
    if (!r.final_settings.empty()) o << "\nStart the next run with: " << r.final_settings << "\n";
    if (!r.effective_config.empty()) o << "  (written as a config: " << r.effective_config << ")\n";
  }
  if (!d.tried.empty()) {
    o << "\nAlready on, not recommended again:\n";
    for (const TriedLever& t : d.tried) {
      o << "  - " << t.setting << "\n";
      if (!t.price.empty()) o << "    " << t.price << "\n";
    }
  }
  if (!d.fixes.empty()) {
    o << "\nWhat to change (one at a time, safest first; never rerun unchanged):\n";
    int i = 1;
    for (const Fix& f : d.fixes) {
      o << "  " << i++ << ". " << f.setting << "\n     " << f.description << "\n";
    }
  }
  if (!d.notes.empty()) {
    o << "\nNotes:\n";
    for (const std::string& n : d.notes) o << "  - " << n << "\n";
  }
  return o.str();
}

}  // namespace lt::diagnose
