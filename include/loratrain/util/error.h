// Errors that cross a module boundary carry the exit code `main` maps them to (README: exit codes).
#pragma once
#include <stdexcept>
#include <string>

namespace lt {

enum class ExitCode : int {
  kOk = 0,
  kRuntime = 1,        // a runtime failure (I/O, a bug, an unexpected library error)
  kUsage = 2,          // bad command line, config, dataset or input file
  kOomExhausted = 3,   // the OOM guard ran out of rollback steps (state saved)
  kEnvironment = 4,    // the GPU or its environment is the cause (state saved)
};

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// Bad user input: config values, command-line arguments, datasets, checkpoint files.
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(ExitCode::kUsage, message) {}
};

// A config problem located at file:line:col (1-based; 0 when unknown).
class ConfigError : public Error {
 public:
  ConfigError(std::string file, int line, int column, const std::string& message)
      : Error(ExitCode::kUsage, format(file, line, column, message)),
        file_(std::move(file)), line_(line), column_(column), bare_message_(message) {}
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int column() const { return column_; }
  const std::string& bare_message() const { return bare_message_; }

 private:
  static std::string format(const std::string& file, int line, int column, const std::string& m) {
    std::string where = file.empty() ? "<config>" : file;
    if (line > 0) where += ":" + std::to_string(line) + ":" + std::to_string(column);
    return where + ": " + m;
  }
  std::string file_;
  int line_;
  int column_;
  std::string bare_message_;
};

}  // namespace lt
