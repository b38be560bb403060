// Each subcommand lives in its own file and registers itself on the CLI11 app.
#pragma once
#include <CLI/CLI.hpp>

#include <functional>

namespace lt::cli {

// The chosen subcommand's body; returns the process exit code (README: exit codes).
using Action = std::function<int()>;

// `run` may restart the process once (passive_openmp_or_restart) and needs the command line.
void add_run_command(CLI::App& app, Action& chosen, char** argv);
void add_diagnose_command(CLI::App& app, Action& chosen);
void add_plan_command(CLI::App& app, Action& chosen);
void add_sample_command(CLI::App& app, Action& chosen);
void add_inspect_command(CLI::App& app, Action& chosen);
void add_report_command(CLI::App& app, Action& chosen);

// libgomp reads OMP_WAIT_POLICY once, while it is loaded, before main(). Unset, its idle threads
// spin for milliseconds after every parallel region and take the cores OpenBLAS's threads need
// for the next matrix product (measured: 1.75 vs 1.51 s/step on a 2-core tiny run, and most of
// the profile in libgomp's spin loop). Unless the user set a policy, sets PASSIVE (and a short
// OpenBLAS idle poll, unless set) and re-executes this binary with the same arguments; returns
// only when nothing was restarted. On an AVX-512 CPU it first asks LibTorch for its AVX-512
// kernels (ATEN_CPU_CAPABILITY, unless set).
void passive_openmp_or_restart(char** argv);

// One line per fact: project version, LibTorch version, CUDA available, device names.
std::string version_text();

}  // namespace lt::cli
