// Each subcommand lives in its own file and registers itself on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

namespace lt::cli {

// The chosen subcommand's body; returns the process exit code (README: exit codes).
using Action = std::function<int()>;

void add_run_command(CLI::App& app, Action& chosen);
void add_diagnose_command(CLI::App& app, Action& chosen);
void add_plan_command(CLI::App& app, Action& chosen);
void add_sample_command(CLI::App& app, Action& chosen);
void add_inspect_command(CLI::App& app, Action& chosen);
void add_report_command(CLI::App& app, Action& chosen);

// One line per fact: project version, LibTorch version, CUDA available, device names.
std::string version_text();

}  // namespace lt::cli
