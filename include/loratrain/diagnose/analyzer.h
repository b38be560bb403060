// Streaming log analysis: feed cleaned lines one at a time (bounded state, no line is kept beyond
// a few evidence snippets), then finish() to get the verdict, phase, numbers and fixes.
#pragma once
#include <memory>
#include <string>

#include "loratrain/diagnose/diagnosis.h"
#include "loratrain/diagnose/line_reader.h"

namespace lt::diagnose {

class LogAnalyzer {
 public:
  LogAnalyzer();
  ~LogAnalyzer();
  LogAnalyzer(const LogAnalyzer&) = delete;
  LogAnalyzer& operator=(const LogAnalyzer&) = delete;

  void feed(const LogLine& line);
  // Verdict from everything fed so far; `bytes` is only reported. Fixes are planned (plan_fixes).
  Diagnosis finish(int64_t bytes = 0) const;

  struct State;

 private:
  std::unique_ptr<State> s_;
};

// Reads the whole source through LineReader and analyses it. Throws lt::InputError on read errors.
Diagnosis diagnose(std::unique_ptr<ByteSource> source);
// `path` or "-" for standard input.
Diagnosis diagnose_path(const std::string& path);
Diagnosis diagnose_text(const std::string& text);

}  // namespace lt::diagnose
