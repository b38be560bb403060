#include "loratrain/dist/launch.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "loratrain/util/error.h"

extern char** environ;

namespace lt::dist {

namespace {

std::optional<std::string> env_text(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int env_int(const char* name, int fallback, int min, int max) {
  const auto text = env_text(name);
  if (!text) return fallback;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(text->c_str(), &end, 10);
  if (errno != 0 || end == text->c_str() || *end != '\0' || value < min || value > max) {
    throw InputError(std::string(name) + "=" + *text + ": expected a whole number in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "]");
  }
  return static_cast<int>(value);
}

// The launcher's children and the signals it forwards to them.
volatile std::sig_atomic_t g_forward_signal = 0;
extern "C" void on_launcher_signal(int signal) { g_forward_signal = signal; }

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("was killed by signal ") + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) + ")";
  return "ended";
}

}  // namespace

DistEnv read_dist_env() {
  DistEnv env;
  env.world_size = env_int("WORLD_SIZE", 1, 1, 65536);
  env.rank = env_int("RANK", 0, 0, 65535);
  env.local_rank = env_int("LOCAL_RANK", env.rank, 0, 65535);
  if (auto addr = env_text("MASTER_ADDR")) env.master_addr = *addr;
  env.master_port = env_int("MASTER_PORT", env.master_port, 1, 65535);
  env.agent_store = env_text("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (env.rank >= env.world_size) {
    throw InputError("RANK=" + std::to_string(env.rank) + " is not below WORLD_SIZE=" + std::to_string(env.world_size));
  }
  if (env.distributed() && !env_text("MASTER_ADDR")) {
    throw InputError("WORLD_SIZE=" + std::to_string(env.world_size) +
                     " without MASTER_ADDR: set MASTER_ADDR and MASTER_PORT (rank 0's host and a free port), as torchrun does");
  }
  return env;
}

int free_local_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(ExitCode::kEnvironment, std::string("no socket for a free port: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;  // the kernel picks a free one
  socklen_t length = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  if (port == 0) throw Error(ExitCode::kEnvironment, std::string("no free local port: ") + std::strerror(errno));
  return port;
}

int launch_local_ranks(int nproc, const std::vector<std::string>& args, int grace_seconds) {
  if (nproc < 1) throw InputError("--nproc " + std::to_string(nproc) + ": expected at least 1");
  const int port = free_local_port();
  spdlog::info("launching {} ranks on this machine (rendezvous 127.0.0.1:{})", nproc, port);

  // Every child's argv and environment are built before the first fork: between fork and exec a
  // child only calls async-signal-safe functions.
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry = *e;
    bool ours = false;
    for (const char* name : {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=", "MASTER_PORT=",
                             "TORCHELASTIC_USE_AGENT_STORE="}) {
      ours = ours || entry.rfind(name, 0) == 0;
    }
    if (!ours) inherited.push_back(entry);
  }
  // Each rank gets its share of the cores unless the user chose (LT_NUM_THREADS).
  if (std::getenv("LT_NUM_THREADS") == nullptr) {
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    inherited.push_back("LT_NUM_THREADS=" + std::to_string(std::max(1u, cores / static_cast<unsigned>(nproc))));
  }
  std::vector<std::vector<std::string>> envs(static_cast<size_t>(nproc), inherited);
  for (int r = 0; r < nproc; ++r) {
    auto& e = envs[static_cast<size_t>(r)];
    e.push_back("RANK=" + std::to_string(r));
    e.push_back("LOCAL_RANK=" + std::to_string(r));
    e.push_back("WORLD_SIZE=" + std::to_string(nproc));
    e.push_back("LOCAL_WORLD_SIZE=" + std::to_string(nproc));
    e.push_back("MASTER_ADDR=127.0.0.1");
    e.push_back("MASTER_PORT=" + std::to_string(port));
  }
  std::vector<std::string> argv_text = {"lora-train"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);

  struct sigaction action {};
  action.sa_handler = on_launcher_signal;
  sigemptyset(&action.sa_mask);
  struct sigaction previous_int {}, previous_term {};
  ::sigaction(SIGINT, &action, &previous_int);
  ::sigaction(SIGTERM, &action, &previous_term);
  g_forward_signal = 0;

  std::vector<pid_t> pids;
  for (int r = 0; r < nproc; ++r) {
    std::vector<char*> envp;
    for (auto& e : envs[static_cast<size_t>(r)]) envp.push_back(e.data());
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(ExitCode::kEnvironment, std::string("could not start a rank: ") + std::strerror(errno));
    if (pid == 0) {
      // The child: its own process group (a terminal's Ctrl-C reaches it once, through the
      // launcher), ended with the launcher.
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      ::execve("/proc/self/exe", argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }

  int result = 0;
  int running = nproc;
  std::optional<std::chrono::steady_clock::time_point> failed_at;
  bool terminated = false, killed = false;
  int forwarded = 0;
  while (running > 0) {
    if (g_forward_signal != 0 && g_forward_signal != forwarded) {
      forwarded = g_forward_signal;
      g_forward_signal = 0;
      for (pid_t pid : pids) {
        if (pid > 0) ::kill(pid, forwarded);
      }
      forwarded = 0;
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (size_t r = 0; r < pids.size(); ++r) {
        if (pids[r] != done) continue;
        pids[r] = -1;
        --running;
        const int code = exit_code_of(status);
        if (code != 0) {
          spdlog::error("rank {} {}", r, describe_status(status));
          if (result == 0) result = code;
          if (!failed_at) failed_at = std::chrono::steady_clock::now();
        }
      }
      continue;
    }
    if (done < 0 && errno != EINTR) break;
    if (failed_at && running > 0) {
      // The others normally notice the lost rank and end within seconds; this is the backstop.
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - *failed_at).count();
      if (!terminated && waited > grace_seconds) {
        spdlog::error("{} rank(s) still running {} s after a failure: stopping them", running, grace_seconds);
        for (pid_t pid : pids) if (pid > 0) ::kill(pid, SIGTERM);
        terminated = true;
      } else if (!killed && waited > grace_seconds + 30) {
        for (pid_t pid : pids) if (pid > 0) ::kill(pid, SIGKILL);
        killed = true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::sigaction(SIGINT, &previous_int, nullptr);
  ::sigaction(SIGTERM, &previous_term, nullptr);
  if (result == 0) spdlog::info("all {} ranks finished", nproc);
  return result;
}

}  // namespace lt::dist
