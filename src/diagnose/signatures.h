// Failure signatures (OOM_PLAYBOOK.md §1 and its look-alikes): one table row per keyword, with the
// condition that makes a hit count right beside it.
#pragma once
#include <string_view>
#include <vector>

#include "loratrain/diagnose/diagnosis.h"

namespace lt::diagnose::detail {

// What a qualifying condition may look at: the line and where the keyword sits in it.
struct LineFacts {
  std::string_view low;     // the whole line, lowercase
  size_t pos = 0;           // keyword start in `low`
  size_t end = 0;           // keyword end
  bool exception = false;   // "XxxError: ..." / "XxxException: ..."
  bool error_level = false; // ERROR / CRITICAL / [error] / "!!! Exception during processing !!!" ...
  bool fatal() const { return exception || error_level; }
};

enum class OomKind {
  kNone,       // not a GPU OOM signature
  kHard,       // a GPU OOM
  kWeak,       // often an OOM in disguise (cuBLAS/cuDNN initialisation failures)
  kRecovered,  // an OOM the trainer skipped and carried on from (AI Toolkit)
};

struct Signature {
  const char* text;  // lowercase keyword
  Cause cause;
  OomKind oom = OomKind::kNone;
  bool (*qualifies)(const LineFacts&) = nullptr;  // nullptr: every hit counts
};

const std::vector<Signature>& signatures();

}  // namespace lt::diagnose::detail
