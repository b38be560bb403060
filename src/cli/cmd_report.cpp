// `lora-train report RUN_DIR`: writes RUN_DIR/report.html again from what the run folder holds
// (the trainer writes it at each save and at the end; this redoes it, e.g. after a crash).
#include <iostream>
#include <memory>

#include "commands.h"
#include "loratrain/report/run_report.h"

namespace lt::cli {

void add_report_command(CLI::App& app, Action& chosen) {
  auto run_dir = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("report", "Write a run folder's report.html again (loss, memory, OOM-guard actions, previews)");
  sub->add_option("run_dir", *run_dir, "the run folder: training_folder/<config name>")->required();
  sub->callback([&chosen, run_dir] {
    chosen = [run_dir] {
      std::cout << report::write_run_report(*run_dir).string() << "\n";
      return 0;
    };
  });
}

}  // namespace lt::cli
