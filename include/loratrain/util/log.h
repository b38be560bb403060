#pragma once
#include <filesystem>
#include <string>

namespace lt::log {

// Console logging at `level` (trace, debug, info, warn, error, off). Call once from main.
void init(const std::string& level);

// Also log everything to `path` (the run folder's log file).
void add_file(const std::filesystem::path& path);

// A data-parallel rank other than 0: the console shows only its warnings and errors, and every
// line (console and `path`) starts with "[rank<r>]: ", the prefix PyTorch's launchers use.
void set_rank(int rank, const std::filesystem::path& path);

}  // namespace lt::log
