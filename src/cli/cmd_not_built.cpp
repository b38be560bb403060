// Subcommands whose machinery is not built yet: they say so plainly and exit 2.
#include <spdlog/spdlog.h>

#include "commands.h"
#include "loratrain/util/error.h"

namespace lt::cli {

namespace {
void add_not_built(CLI::App& app, Action& chosen, const char* name, const char* description) {
  auto* sub = app.add_subcommand(name, description);
  sub->allow_extras();
  sub->callback([&chosen, name] {
    chosen = [name] {
      spdlog::error("'lora-train {}' is not available in this version yet", name);
      return static_cast<int>(ExitCode::kUsage);
    };
  });
}
}  // namespace

void add_plan_command(CLI::App& app, Action& chosen) {
  add_not_built(app, chosen, "plan", "Predict peak memory per phase for a config (not available yet)");
}

}  // namespace lt::cli
