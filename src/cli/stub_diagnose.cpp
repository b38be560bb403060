// Placeholder until the 'diagnose' area lands: the command exists and says it is not available yet.
#include <spdlog/spdlog.h>

#include "commands.h"
#include "loratrain/util/error.h"

namespace lt::cli {

void add_diagnose_command(CLI::App& app, Action& chosen) {
  auto* sub = app.add_subcommand("diagnose", "(not available yet)");
  sub->allow_extras();
  sub->callback([&chosen] {
    chosen = [] {
      spdlog::error("'lora-train diagnose' is not available in this version yet");
      return static_cast<int>(ExitCode::kUsage);
    };
  });
}

}  // namespace lt::cli
