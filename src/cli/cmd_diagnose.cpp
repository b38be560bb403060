// `lora-train diagnose LOG [--json] [--config cfg.yaml --write-fix fixed.yaml]` (docs/diagnose.md).
// Exit 0 when a diagnosis was made (OOM or not), 2 when the log or config cannot be read.
#include <spdlog/spdlog.h>

#include <iostream>
#include <memory>

#include "commands.h"
#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/report.h"
#include "loratrain/util/error.h"

namespace lt::cli {

namespace {
struct DiagnoseOptions {
  std::string log;
  bool json = false;
  std::string config;
  std::string write_fix;
};
}  // namespace

void add_diagnose_command(CLI::App& app, Action& chosen) {
  auto opts = std::make_shared<DiagnoseOptions>();
  auto* sub = app.add_subcommand("diagnose", "Read a failed training log (any trainer): why it died and what to change");
  sub->add_option("log", opts->log, "Log file, or - for standard input")->required();
  sub->add_flag("--json", opts->json, "Print the diagnosis as JSON (schema in docs/diagnose.md)");
  sub->add_option("--config", opts->config, "The run's lora-train / AI Toolkit YAML config (settings it states count)");
  auto* wf = sub->add_option("--write-fix", opts->write_fix, "Write --config with the first applicable fix applied");
  wf->needs(sub->get_option("--config"));
  sub->callback([&chosen, opts] {
    chosen = [opts] {
      namespace dg = lt::diagnose;
      const std::string name = opts->log == "-" ? "<stdin>" : opts->log;
      dg::Diagnosis d = dg::diagnose_path(opts->log);
      if (!opts->config.empty()) dg::merge_config_settings(d, opts->config);
      std::string applied, what;
      if (!opts->write_fix.empty()) {
        applied = dg::write_fixed_config(d, opts->config, opts->write_fix, &what);
      }
      if (opts->json) {
        nlohmann::json j = dg::to_json(d, name);
        if (!opts->write_fix.empty()) {
          j["write_fix"] = {{"path", opts->write_fix},
                            {"applied", applied.empty() ? nlohmann::json(nullptr) : nlohmann::json(applied)},
                            {"change", what.empty() ? nlohmann::json(nullptr) : nlohmann::json(what)}};
        }
        std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      } else {
        std::cout << dg::format_report(d, name);
        if (!opts->write_fix.empty()) {
          if (applied.empty())
            std::cout << "\nNo fix maps to a config setting (see above); " << opts->write_fix << " was not written.\n";
          else
            std::cout << "\nWrote " << opts->write_fix << " with the first fix applied: " << what << "\n";
        }
      }
      return static_cast<int>(ExitCode::kOk);
    };
  });
}

}  // namespace lt::cli
