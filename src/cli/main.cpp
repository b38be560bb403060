// lora-train: entry point. Parses the command line, runs one subcommand, maps errors to the
// documented exit codes (README: exit codes). Nothing else calls exit().
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <c10/util/Exception.h>

#include <csignal>
#include <iostream>

#include "commands.h"
#include "loratrain/util/error.h"
#include "loratrain/util/log.h"

int main(int argc, char** argv) {
  CLI::App app{"lora-train: a native LoRA trainer for diffusion models that does not die of OOM"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")->capture_default_str();
  app.set_version_flag("--version", [] { return lt::cli::version_text(); }, "Print versions and devices, then exit");

  lt::cli::Action chosen;
  lt::cli::add_run_command(app, chosen, argv);
  lt::cli::add_diagnose_command(app, chosen);
  lt::cli::add_plan_command(app, chosen);
  lt::cli::add_sample_command(app, chosen);
  lt::cli::add_inspect_command(app, chosen);
  lt::cli::add_report_command(app, chosen);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return static_cast<int>(lt::ExitCode::kUsage);
  }

  // A file-size limit (ulimit -f) would kill the process with SIGXFSZ mid-save and no message;
  // ignored, the write fails with EFBIG and the save reports it like a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
  try {
    lt::log::init(log_level);
    return chosen();
  } catch (const lt::Error& e) {
    spdlog::error("{}", e.what());
    return static_cast<int>(e.code());
  } catch (const c10::Error& e) {
    spdlog::error("{}", e.what_without_backtrace());
    return static_cast<int>(lt::ExitCode::kRuntime);
  } catch (const std::bad_alloc&) {
    spdlog::error("out of host memory (RAM), not GPU memory: reduce caching in RAM or batch size");
    return static_cast<int>(lt::ExitCode::kRuntime);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return static_cast<int>(lt::ExitCode::kRuntime);
  }
}
