// Data-parallel training over Gloo on loopback, with real processes: 2 ranks with batch 2 each
// train exactly as 1 rank with batch 4 (same seed); an OOM on one rank is agreed on by both; a
// lost rank ends the other with a message that names it.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include <nlohmann/json.hpp>

#include "loratrain/dist/launch.h"
#include "loratrain/io/safetensors.h"
#include "train/cli_process.h"
#include "train/train_fixture.h"
#include "test_support.h"

using lt::test::read_json;

namespace {

namespace fs = std::filesystem;

// Starts `program args...` with `env` added to the environment; stdout and stderr go to `output`.
pid_t start(const std::string& program, const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
            const fs::path& output) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(output.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(name);
    ::setenv("LT_NUM_THREADS", "1", 1);
    ::setenv("LT_BLAS_THREADS", "1", 1);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(program.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

std::string rank_program() { return (lt::test::binary_dir() / "lt-dist-rank").string(); }

// Two ranks of lt-dist-rank on loopback (torchrun's environment); their exit codes.
std::vector<int> run_two_ranks(const std::vector<std::string>& args, const fs::path& logs) {
  const int port = lt::dist::free_local_port();
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(start(rank_program(), args,
                         {{"RANK", std::to_string(r)}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", std::to_string(r)},
                          {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(port)}},
                         logs / ("rank" + std::to_string(r) + ".out")));
  }
  std::vector<int> codes;
  for (pid_t pid : pids) {
    const auto exit = lt::test::wait_child(pid);
    codes.push_back(exit.exited ? exit.code : 128 + exit.code);
  }
  return codes;
}

int run_one_rank(const std::vector<std::string>& args, const fs::path& output) {
  const auto exit = lt::test::wait_child(start(rank_program(), args, {}, output));
  return exit.exited ? exit.code : 128 + exit.code;
}

std::vector<double> losses(const fs::path& metrics) {
  std::ifstream in(metrics);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  }
  return out;
}

// The two LoRA files as one vector of weights: within `tolerance` relative (|a - b| / |b| over all
// tensors). Each tensor alone stays within 10x that: lora_up starts at zero, so the last bits of
// its few smallest entries weigh more in its own norm.
void check_same_lora(const fs::path& a, const fs::path& b, double tolerance) {
  auto fa = lt::io::SafetensorsFile::open(a);
  auto fb = lt::io::SafetensorsFile::open(b);
  CATCH_REQUIRE(fa->tensors().size() == fb->tensors().size());
  double diff_sq = 0, norm_sq = 0, worst = 0;
  std::string worst_name;
  for (const auto& t : fa->tensors()) {
    const at::Tensor x = fa->load(t.name).to(at::kDouble);
    const at::Tensor y = fb->load(t.name).to(at::kDouble);
    const double norm = y.norm().item<double>();
    const double diff = (x - y).norm().item<double>();
    diff_sq += diff * diff;
    norm_sq += norm * norm;
    if ((norm > 0 ? diff / norm : diff) > worst) {
      worst = norm > 0 ? diff / norm : diff;
      worst_name = t.name;
    }
  }
  const double relative = std::sqrt(diff_sq / norm_sq);
  CATCH_INFO("relative difference of the LoRA: " << relative << "; largest of one tensor: " << worst << " (" << worst_name << ")");
  CATCH_CHECK(relative <= tolerance);
  CATCH_CHECK(worst <= 10 * tolerance);
}

void check_same_losses(const std::vector<double>& a, const std::vector<double>& b, double tolerance) {
  CATCH_REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CATCH_INFO("step " << i + 1 << ": " << a[i] << " vs " << b[i]);
    CATCH_CHECK(std::abs(a[i] - b[i]) <= tolerance * std::abs(b[i]));
  }
}

const std::string kMemory = "        simulate_vram: 2GiB\n        oom_guard:\n          plan: false\n";

}  // namespace

CATCH_TEST_CASE("2 ranks with batch 2 train as 1 rank with batch 4 (lora-train run --nproc 2)", "[dist][e2e]") {
  const auto root = lt::test::scratch_dir(lt::test::per_program("dist_equal"));
  const auto single = lt::test::write_tiny_config(root / "single", "dp", 5, "", kMemory);
  const auto ranks = lt::test::write_tiny_config(root / "ranks", "dp", 5, "", kMemory);
  CATCH_REQUIRE(run_one_rank({single.string(), "--set", "train.batch_size=4"}, root / "single.out") == 0);

  const auto launcher = lt::test::start_lora_train({"run", ranks.string(), "--nproc", "2"}, root / "ranks.out");
  const auto exit = lt::test::wait_child(launcher);
  CATCH_INFO(lt::test::read_file(root / "ranks.out"));
  CATCH_REQUIRE(exit.exited);
  CATCH_REQUIRE(exit.code == 0);

  const auto a = losses(root / "ranks" / "dp" / "metrics.jsonl");
  const auto b = losses(root / "single" / "dp" / "metrics.jsonl");
  CATCH_CHECK(a.size() == 5);
  check_same_losses(a, b, 1e-6);
  check_same_lora(root / "ranks" / "dp" / "dp.safetensors", root / "single" / "dp" / "dp.safetensors", 1e-6);
  // Rank 0 writes the run's files; rank 1 its log and its generator states.
  CATCH_CHECK(fs::exists(root / "ranks" / "dp" / "logs" / "rank1.txt"));
  CATCH_CHECK(fs::exists(root / "ranks" / "dp" / "state" / "training_state.rank1.safetensors"));
  CATCH_CHECK(read_json(root / "ranks" / "dp" / "report.json").at("outcome") == "completed");
}

CATCH_TEST_CASE("an OOM on rank 1 at step 3: both ranks take the same action and match one rank given it", "[dist][guard][e2e]") {
  const auto root = lt::test::scratch_dir(lt::test::per_program("dist_oom"));
  const auto single = lt::test::write_tiny_config(root / "single", "dp", 5, "", kMemory);
  const auto ranks = lt::test::write_tiny_config(root / "ranks", "dp", 5, "", kMemory);
  // Four failures in a row: three empty-cache retries, then a change of settings.
  const std::vector<std::string> fault = {"--oom-at-step", "3", "--oom-count", "4"};
  std::vector<std::string> single_args = {single.string(), "--set", "train.batch_size=4"};
  single_args.insert(single_args.end(), fault.begin(), fault.end());
  CATCH_REQUIRE(run_one_rank(single_args, root / "single.out") == 0);

  std::vector<std::string> rank_args = {ranks.string(), "--oom-rank", "1"};
  rank_args.insert(rank_args.end(), fault.begin(), fault.end());
  const auto codes = run_two_ranks(rank_args, root);
  CATCH_INFO(lt::test::read_file(root / "rank0.out") << "\n---- rank 1 ----\n" << lt::test::read_file(root / "rank1.out"));
  CATCH_REQUIRE(codes == std::vector<int>{0, 0});

  const auto single_report = read_json(root / "single" / "dp" / "report.json");
  const auto rank_report = read_json(root / "ranks" / "dp" / "report.json");
  std::vector<std::string> single_actions, rank_actions;
  for (const auto& a : single_report.at("attempts")) single_actions.push_back(a.at("action").get<std::string>());
  for (const auto& a : rank_report.at("attempts")) rank_actions.push_back(a.at("action").get<std::string>());
  CATCH_INFO("actions of one rank: " << nlohmann::json(single_actions).dump());
  CATCH_CHECK(rank_actions == single_actions);
  CATCH_CHECK(single_actions.size() == 4);
  CATCH_CHECK(single_actions.back() != "empty_cache_retry");  // a real change of settings
  // The same settings, batch_size being per rank (2 x 2 ranks against 4).
  auto rank_settings = rank_report.at("final_settings");
  CATCH_CHECK(rank_settings.at("batch_size") == 2);
  rank_settings["batch_size"] = 4;
  CATCH_CHECK(rank_settings == single_report.at("final_settings"));
  // Rank 1's log has the failure; rank 0 followed its decision.
  const std::string rank1_log = lt::test::read_file(root / "ranks" / "dp" / "logs" / "rank1.txt");
  CATCH_CHECK(rank1_log.find("OOM in phase train_step") != std::string::npos);
  CATCH_CHECK(lt::test::read_file(root / "ranks" / "dp" / "log.txt").find("another rank's OOM") != std::string::npos);

  const auto a = losses(root / "ranks" / "dp" / "metrics.jsonl");
  CATCH_CHECK(a.size() == 5);
  check_same_losses(a, losses(root / "single" / "dp" / "metrics.jsonl"), 1e-6);
  check_same_lora(root / "ranks" / "dp" / "dp.safetensors", root / "single" / "dp" / "dp.safetensors", 1e-6);
}

CATCH_TEST_CASE("a killed rank ends the other within 30 s with a message naming it", "[dist][e2e]") {
  const auto root = lt::test::scratch_dir(lt::test::per_program("dist_lost"));
  const auto config = lt::test::write_tiny_config(root, "lost", 6, "", kMemory);
  const int port = lt::dist::free_local_port();
  const std::map<std::string, std::string> common = {{"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"},
                                                     {"MASTER_PORT", std::to_string(port)},
                                                     {"LT_DIST_HEARTBEAT_TIMEOUT", "5"}};
  auto env = [&](int rank) {
    auto e = common;
    e["RANK"] = e["LOCAL_RANK"] = std::to_string(rank);
    return e;
  };
  const std::vector<std::string> args = {config.string(), "--die-at-step", "3", "--die-rank", "1"};
  const pid_t rank0 = start(rank_program(), args, env(0), root / "rank0.out");
  const pid_t rank1 = start(rank_program(), args, env(1), root / "rank1.out");
  const auto killed = lt::test::wait_child(rank1);
  const auto died_at = std::chrono::steady_clock::now();
  CATCH_REQUIRE_FALSE(killed.exited);
  CATCH_REQUIRE(killed.code == SIGKILL);
  const bool ended = lt::test::wait_until(rank0, [] { return false; }, std::chrono::seconds(30));
  (void)ended;
  siginfo_t info{};
  const bool exited = ::waitid(P_PID, static_cast<id_t>(rank0), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid != 0;
  if (!exited) ::kill(rank0, SIGKILL);
  const auto exit = lt::test::wait_child(rank0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - died_at).count();
  const std::string output = lt::test::read_file(root / "rank0.out");
  CATCH_INFO(output);
  CATCH_INFO("rank 0 ended " << seconds << " s after rank 1 was killed");
  CATCH_REQUIRE(exited);
  CATCH_CHECK(exit.exited);
  CATCH_CHECK(exit.code != 0);
  CATCH_CHECK(seconds < 30);
  CATCH_CHECK(output.find("rank 1 is lost") != std::string::npos);
}

CATCH_TEST_CASE("resume: the same number of ranks continues bit-identically, another warns and continues", "[dist][e2e]") {
  const auto root = lt::test::scratch_dir(lt::test::per_program("dist_resume"));
  const auto full = lt::test::write_tiny_config(root / "full", "dp", 4, "", kMemory);
  const auto resumed = lt::test::write_tiny_config(root / "resumed", "dp", 4, "", kMemory);
  const auto changed = lt::test::write_tiny_config(root / "changed", "dp", 4, "", kMemory);
  CATCH_REQUIRE(run_two_ranks({full.string()}, root) == std::vector<int>{0, 0});

  CATCH_REQUIRE(run_two_ranks({resumed.string(), "--stop-after", "2"}, root) == std::vector<int>{130, 130});
  CATCH_CHECK(fs::exists(root / "resumed" / "dp" / "state" / "training_state.rank1.safetensors"));
  const auto codes = run_two_ranks({resumed.string()}, root);
  CATCH_INFO(lt::test::read_file(root / "rank0.out"));
  CATCH_REQUIRE(codes == std::vector<int>{0, 0});
  CATCH_CHECK(losses(root / "resumed" / "dp" / "metrics.jsonl") == losses(root / "full" / "dp" / "metrics.jsonl"));
  auto a = lt::io::SafetensorsFile::open(root / "full" / "dp" / "dp.safetensors");
  auto b = lt::io::SafetensorsFile::open(root / "resumed" / "dp" / "dp.safetensors");
  for (const auto& t : a->tensors()) CATCH_CHECK(torch::equal(a->load(t.name), b->load(t.name)));

  CATCH_REQUIRE(run_two_ranks({changed.string(), "--stop-after", "2"}, root) == std::vector<int>{130, 130});
  CATCH_REQUIRE(run_one_rank({changed.string()}, root / "one.out") == 0);
  const std::string log = lt::test::read_file(root / "changed" / "dp" / "log.txt");
  CATCH_CHECK(log.find("the saved state is from a run on 2 rank(s), this one has 1") != std::string::npos);
  CATCH_CHECK(losses(root / "changed" / "dp" / "metrics.jsonl").size() == 4);
}

CATCH_TEST_CASE("the launch environment: torchrun's variables, checked", "[dist]") {
  using Vars = std::map<std::string, std::string>;
  struct Env {
    std::map<std::string, std::string> values;
    explicit Env(std::map<std::string, std::string> v) : values(std::move(v)) {
      for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}) ::unsetenv(name);
      for (const auto& [k, val] : values) ::setenv(k.c_str(), val.c_str(), 1);
    }
    ~Env() {
      for (const auto& [k, val] : values) ::unsetenv(k.c_str());
    }
  };
  {
    Env env(Vars{});
    CATCH_CHECK_FALSE(lt::dist::read_dist_env().distributed());
  }
  {
    Env env(Vars{{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "host0"}, {"MASTER_PORT", "29511"}});
    const auto e = lt::dist::read_dist_env();
    CATCH_CHECK(e.distributed());
    CATCH_CHECK(e.rank == 3);
    CATCH_CHECK(e.local_rank == 1);
    CATCH_CHECK(e.master_addr == "host0");
    CATCH_CHECK(e.master_port == 29511);
  }
  {
    Env env(Vars{{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "host0"}});
    CATCH_CHECK_THROWS_WITH(lt::dist::read_dist_env(), Catch::Contains("RANK=2 is not below WORLD_SIZE=2"));
  }
  {
    Env env(Vars{{"RANK", "0"}, {"WORLD_SIZE", "2"}});
    CATCH_CHECK_THROWS_WITH(lt::dist::read_dist_env(), Catch::Contains("without MASTER_ADDR"));
  }
  {
    Env env(Vars{{"WORLD_SIZE", "two"}});
    CATCH_CHECK_THROWS_WITH(lt::dist::read_dist_env(), Catch::Contains("WORLD_SIZE=two"));
  }
}
