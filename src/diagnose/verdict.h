// The verdicts finish() draws from the analyzer state: the cause (GPU OOM or which look-alike),
// the memory numbers, whether the machine rather than the config is to blame (playbook §2 E, §4),
// and whether a lora-train run recovered and finished.
#pragma once

#include "analyzer_state.h"

namespace lt::diagnose::detail {

// How sure each cause verdict is (confidence).
constexpr double kOomWithNumbersConfidence = 0.97;  // the allocator message with its numbers
constexpr double kOomConfidence = 0.93;             // an OOM signature
constexpr double kOomSkippedConfidence = 0.85;      // only OOMs a trainer skipped / the guard's line
constexpr double kOomInDisguiseConfidence = 0.6;    // only cuBLAS/cuDNN initialisation failures
constexpr double kHostOomConfidence = 0.88;
constexpr double kFatalLookAlikeConfidence = 0.85;
constexpr double kLookAlikeConfidence = 0.65;
constexpr double kOtherErrorConfidence = 0.6;
constexpr double kNoFailureConfidence = 0.5;
constexpr double kEnvironmentByNumbersConfidence = 0.8;  // the message's numbers show it
constexpr double kEnvironmentConfidence = 0.7;

// Cause, oom, confidence and error line into `d`; returns the decisive cause's record (or null).
const CauseRecord* decide_cause(const AnalyzerState& st, Diagnosis& d);

// The allocator message's numbers with the derived ones: other processes, fragmentation.
MemoryNumbers memory_numbers(const MemoryLog& mem);

// Turns the phase into `environment` (with a note) when the log shows the GPU or the machine is
// the problem: other processes, PyTorch holding little of a full card, a small allocation failing
// with gigabytes free, pinned host memory, one rank of several, a full GPU or a cuBLAS failure
// before training with a conservative config, or lora-train's start-up warning.
void apply_environment(const AnalyzerState& st, const CauseRecord* decisive, Diagnosis& d);

// A lora-train run whose guard handled the OOMs and that finished: recovered, with the changes and
// the settings to start with next time.
void apply_recovery(const AnalyzerState& st, Diagnosis& d);

}  // namespace lt::diagnose::detail
