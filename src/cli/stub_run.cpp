// Placeholder until the 'run' area lands: the command exists and says it is not available yet.
#include <spdlog/spdlog.h>

#include "commands.h"
#include "loratrain/util/error.h"

namespace lt::cli {

void add_run_command(CLI::App& app, Action& chosen) {
  auto* sub = app.add_subcommand("run", "(not available yet)");
  sub->allow_extras();
  sub->callback([&chosen] {
    chosen = [] {
      spdlog::error("'lora-train run' is not available in this version yet");
      return static_cast<int>(ExitCode::kUsage);
    };
  });
}

}  // namespace lt::cli
