// `lora-train` as a child process, as a user (or a job scheduler) runs it: to send it signals and to
// run it under a file-size limit.
#pragma once
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Version.h>

#include "test_support.h"

namespace lt::test {

struct ChildOptions {
  // LT_NUM_THREADS for the child: runs compared bit for bit need the same thread count (the
  // order of a parallel reduction changes the last bits).
  int num_threads = 1;
  std::optional<rlim_t> file_size_limit;  // RLIMIT_FSIZE in bytes (SIGXFSZ is ignored by lora-train)
};

// The kernel set LibTorch picked in this process, as ATEN_CPU_CAPABILITY names it ("avx2" from
// at::show_config()'s "CPU capability usage: AVX2"); empty if it does not say.
inline std::string this_process_cpu_capability() {
  const std::string config = at::show_config();
  const std::string key = "CPU capability usage: ";
  const size_t at = config.find(key);
  if (at == std::string::npos) return "";
  std::string name = config.substr(at + key.size(), config.find('\n', at) - at - key.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// Starts build/lora-train with `args`; stdout and stderr go to `output`. Returns the child's pid.
// The child runs LibTorch's kernels of this process (lora-train run would ask for the AVX-512 ones
// where it may): runs compared bit for bit need the same kernels, as they need the same threads.
inline pid_t start_lora_train(const std::vector<std::string>& args, const std::filesystem::path& output,
                              const ChildOptions& options = {}) {
  const std::string binary = (binary_dir() / "lora-train").string();
  const std::string capability = this_process_cpu_capability();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::setenv("LT_NUM_THREADS", std::to_string(options.num_threads).c_str(), 1);
    if (!capability.empty()) ::setenv("ATEN_CPU_CAPABILITY", capability.c_str(), 1);
    if (options.file_size_limit) {
      const rlimit limit{*options.file_size_limit, *options.file_size_limit};
      ::setrlimit(RLIMIT_FSIZE, &limit);
    }
    std::vector<char*> argv{const_cast<char*>(binary.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

struct ChildExit {
  bool exited = false;  // exited normally (else killed by a signal)
  int code = -1;        // exit code, or the signal that killed it
};

inline ChildExit wait_child(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (WIFEXITED(status)) return {true, WEXITSTATUS(status)};
  return {false, WIFSIGNALED(status) ? WTERMSIG(status) : -1};
}

// Polls (every 5 ms) until `done` holds or the child has exited or `timeout` passed; true when `done`.
inline bool wait_until(pid_t pid, const std::function<bool()>& done, std::chrono::seconds timeout = std::chrono::seconds(300)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0) {
      return done();  // it exited (and stays reapable for wait_child)
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

inline size_t line_count(const std::filesystem::path& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

}  // namespace lt::test
