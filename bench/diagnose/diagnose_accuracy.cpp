// How often `diagnose` is right on a folder of labelled logs (<name>.log + <name>.expected.json):
//   diagnose_accuracy DIR [--misses] [--min-oom R] [--min-phase R] [--min-fix R]
// Prints OOM-vs-not accuracy, phase accuracy, first-fix accuracy on the cases labelled GPU OOM,
// and every miss (expected vs got, with the phase's stage, confidence and evidence). Exits 1 when
// a --min ratio is not reached, 2 on bad arguments or an unreadable folder.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "loratrain/diagnose/accuracy.h"

namespace {

void print_tally(const char* what, const lt::diagnose::Tally& t) {
  std::printf("%-28s %3d / %3d  = %5.1f%%\n", what, t.correct, t.total, t.ratio() * 100.0);
}

int usage() {
  std::fprintf(stderr, "usage: diagnose_accuracy DIR [--min-oom R] [--min-phase R] [--min-fix R]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  std::string dir;
  double min_oom = 0, min_phase = 0, min_fix = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto ratio = [&](double& out) {
      if (i + 1 >= argc) return false;
      char* end = nullptr;
      out = std::strtod(argv[++i], &end);
      return end && *end == '\0' && out >= 0 && out <= 1;
    };
    if (a == "--min-oom") {
      if (!ratio(min_oom)) return usage();
    } else if (a == "--min-phase") {
      if (!ratio(min_phase)) return usage();
    } else if (a == "--min-fix") {
      if (!ratio(min_fix)) return usage();
    } else if (!a.empty() && a[0] == '-') {
      return usage();
    } else {
      dir = a;
    }
  }
  if (dir.empty()) return usage();

  lt::diagnose::AccuracyReport r;
  try {
    r = lt::diagnose::score_folder(dir);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "diagnose_accuracy: %s\n", e.what());
    return 2;
  }
  int missed = 0;
  for (const auto& c : r.scored) {
    if (c.misses.empty()) continue;
    ++missed;
    const auto& j = c.diagnosis;
    std::printf("MISS %s  [trainer %s, stage %s, phase_confidence %.2f]\n", c.name.c_str(),
                j.value("trainer", "").c_str(), j.value("stage", "").c_str(), j.value("phase_confidence", 0.0));
    for (const auto& m : c.misses)
      std::printf("    %-18s expected %s, got %s\n", m.field.c_str(), m.expected.dump().c_str(), m.got.dump().c_str());
    for (const auto& e : j["evidence"])
      std::printf("      evidence line %lld: %.160s  <- %s\n", static_cast<long long>(e.value("line", 0)),
                  e.value("text", "").c_str(), e.value("why", "").c_str());
  }
  std::printf("\n%s: %d labelled logs, %d with a miss\n", dir.c_str(), r.cases, missed);
  print_tally("OOM vs not:", r.oom);
  print_tally("phase:", r.phase);
  print_tally("first fix (GPU OOM cases):", r.first_fix);
  print_tally("all stated fields:", r.fields);
  const bool ok = r.oom.ratio() >= min_oom && r.phase.ratio() >= min_phase && r.first_fix.ratio() >= min_fix;
  return ok ? 0 : 1;
}
