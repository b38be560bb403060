#include <catch2/catch.hpp>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <sstream>

#include "loratrain/util/atomic_file.h"
#include "loratrain/util/error.h"
#include "test_paths.h"

namespace {

std::string read_text(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t files_in(const std::filesystem::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

// Runs `body` in a forked child whose files may grow to at most `limit` bytes (RLIMIT_FSIZE, no
// root needed; SIGXFSZ ignored so that write() fails with EFBIG as on a full disk). Returns the
// message of the lt::Error the body threw, or "" when it threw none.
template <typename Body>
std::string error_under_file_size_limit(rlim_t limit, Body body) {
  int pipe_fds[2];
  CATCH_REQUIRE(::pipe(pipe_fds) == 0);
  const pid_t pid = ::fork();
  CATCH_REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit r{limit, limit};
    ::setrlimit(RLIMIT_FSIZE, &r);
    std::string message;
    try {
      body();
    } catch (const lt::Error& e) {
      message = e.what();
    }
    if (::write(pipe_fds[1], message.data(), message.size()) < 0) ::_exit(2);
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string message;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) message.append(buf, static_cast<size_t>(n));
  ::close(pipe_fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  CATCH_REQUIRE(WIFEXITED(status));
  CATCH_REQUIRE(WEXITSTATUS(status) == 0);
  return message;
}

}  // namespace

CATCH_TEST_CASE("atomic writes leave the old file or the new one, never a partial one", "[util]") {
  auto dir = lt::test::scratch_dir("atomic_file");
  auto target = dir / "out.txt";
  lt::write_file_atomic(target, "first");
  {
    lt::AtomicFile f(target);
    f.write("half-written");
    // destroyed without commit(): as if an exception unwound the writer
  }
  CATCH_CHECK(read_text(target) == "first");
  CATCH_CHECK(files_in(dir) == 1);  // the temporary file is gone
  lt::write_file_atomic(target, "second");
  CATCH_CHECK(read_text(target) == "second");
  CATCH_CHECK(files_in(dir) == 1);
}

CATCH_TEST_CASE("a failing write (file-size limit, as a full disk) keeps the previous file and names it", "[util]") {
  auto dir = lt::test::scratch_dir("atomic_file_full");
  auto target = dir / "lora.safetensors";
  lt::write_file_atomic(target, "previous contents");

  CATCH_SECTION("one large write") {
    const std::string message = error_under_file_size_limit(4096, [&] { lt::write_file_atomic(target, std::string(1 << 16, 'x')); });
    CATCH_CHECK_THAT(message, Catch::Contains("cannot save " + target.string()));
    CATCH_CHECK_THAT(message, Catch::Contains("write failed: File too large"));
    CATCH_CHECK_THAT(message, Catch::Contains("the previous lora.safetensors is unchanged"));
  }
  CATCH_SECTION("many small writes that cross the limit part way") {
    const std::string message = error_under_file_size_limit(4096, [&] {
      lt::AtomicFile file(target);
      for (int i = 0; i < 1000; ++i) file.write("0123456789abcdef0123456789abcdef");
      file.commit();
    });
    CATCH_CHECK_THAT(message, Catch::Contains("File too large"));
  }
  CATCH_SECTION("a new file: nothing partial is left") {
    const std::string message = error_under_file_size_limit(10, [&] { lt::write_file_atomic(dir / "new.bin", std::string(100, 'y')); });
    CATCH_CHECK_THAT(message, Catch::Contains("no partial file was left"));
    CATCH_CHECK_FALSE(std::filesystem::exists(dir / "new.bin"));
  }
  CATCH_CHECK(read_text(target) == "previous contents");
  CATCH_CHECK(files_in(dir) == 1);  // no temporary file left behind
}

CATCH_TEST_CASE("a failing rename removes the temporary file and says why", "[util]") {
  auto dir = lt::test::scratch_dir("atomic_file_rename");
  std::filesystem::create_directories(dir / "taken" / "inside");  // a non-empty folder where the file should go
  try {
    lt::write_file_atomic(dir / "taken", "data");
    CATCH_FAIL("no error renaming over a folder");
  } catch (const lt::Error& e) {
    CATCH_CHECK_THAT(std::string(e.what()), Catch::Contains("rename failed"));
    CATCH_CHECK(static_cast<int>(e.code()) == 1);
  }
  CATCH_CHECK(files_in(dir) == 1);
}
