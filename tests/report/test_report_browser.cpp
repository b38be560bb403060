// report.html in a real browser: Debian's chromium, headless, renders the page to a PNG and dumps
// the DOM it built, with the console on stderr. The page must build its charts, guard markers and
// images, and the browser must have nothing to complain about (an SVG path with a NaN, a broken
// attribute, a script error would all show up as console lines). One browser launch, about 2 s.
// Exits 77 (ctest: skipped) only when chromium is not installed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <optional>
#include <regex>
#include <thread>
#include <vector>

#include "loratrain/report/run_report.h"
#include "loratrain/util/strings.h"
#include "report_fixture.h"

namespace {

namespace fs = std::filesystem;

// LT_CHROMIUM, else chromium or chromium-browser on the PATH.
std::optional<fs::path> find_chromium() {
  if (const char* env = std::getenv("LT_CHROMIUM"); env && *env) return fs::path(env);
  const char* path = std::getenv("PATH");
  for (const std::string& dir : lt::split(path ? path : "", ':')) {
    for (const char* name : {"chromium", "chromium-browser"}) {
      const fs::path candidate = fs::path(dir.empty() ? "." : dir) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
  }
  return std::nullopt;
}

// Runs argv with stdout and stderr into files; kills it after `timeout`. Returns the exit status
// (-1 when killed or not exited normally).
int run_process(const std::vector<std::string>& argv, const fs::path& out, const fs::path& err, std::chrono::seconds timeout) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int out_fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err_fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(err_fd, STDERR_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

size_t count(const std::string& text, const std::regex& pattern) {
  return static_cast<size_t>(std::distance(std::sregex_iterator(text.begin(), text.end(), pattern), std::sregex_iterator()));
}

// Appended to a copy of the page (never to report.html itself): after the load event it records
// how many images decoded, and says so on the console, which also proves the console is captured.
constexpr const char* kProbe = R"(<script>
window.addEventListener('load', function () {
  var images = document.images, loaded = 0;
  for (var i = 0; i < images.length; i++) if (images[i].complete && images[i].naturalWidth > 0) loaded++;
  document.documentElement.setAttribute('data-images-loaded', loaded + '/' + images.length);
  console.info('probe: ' + loaded + '/' + images.length + ' images');
});
</script>)";

}  // namespace

CATCH_TEST_CASE("chromium renders report.html with its charts, guard markers and grids, and no console errors",
                "[report][browser]") {
  const fs::path chromium = *find_chromium();
  const fs::path dir = lt::test::write_run_folder("report_browser");
  const fs::path page = lt::report::write_run_report(dir);
  std::string html = lt::test::read_bytes(page);
  const size_t body_end = html.rfind("</body>");
  CATCH_REQUIRE(body_end != std::string::npos);
  lt::test::write_bytes(dir / "report_check.html", html.substr(0, body_end) + kProbe + html.substr(body_end));

  const fs::path out = dir.parent_path();
  const int status = run_process({chromium.string(), "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                                  "--user-data-dir=" + (out / "profile").string(), "--enable-logging=stderr", "--v=0",
                                  "--window-size=1200,2000", "--screenshot=" + (out / "report.png").string(), "--dump-dom",
                                  "file://" + (dir / "report_check.html").string()},
                                 out / "dom.html", out / "console.txt", std::chrono::seconds(90));
  CATCH_REQUIRE(status == 0);
  const std::string dom = lt::test::read_bytes(out / "dom.html");
  const std::string console = lt::test::read_bytes(out / "console.txt");
  CATCH_INFO("chromium stderr:\n" << console);

  // The console: the probe's line, and nothing else from the page.
  std::vector<std::string> page_messages;
  for (const std::string& line : lt::split(console, '\n')) {
    if (line.find(":CONSOLE") != std::string::npos && line.find("\"probe: ") == std::string::npos) page_messages.push_back(line);
  }
  CATCH_CHECK(console.find("\"probe: 2/2 images\"") != std::string::npos);
  CATCH_CHECK(page_messages.empty());

  // The DOM the browser built: charts with real paths, one marker per guard action, the grids decoded.
  CATCH_CHECK(dom.find("data-images-loaded=\"2/2\"") != std::string::npos);
  CATCH_CHECK(count(dom, std::regex(R"(<svg id="loss-chart"[^>]*>)")) == 1);
  CATCH_CHECK(count(dom, std::regex(R"(<path class="loss" d="M[0-9.]+,[0-9.]+ L)")) == 1);
  CATCH_CHECK(count(dom, std::regex(R"(<path class="loss-avg" d="M[0-9.]+,[0-9.]+ L)")) == 1);
  CATCH_CHECK(count(dom, std::regex(R"(<path class="lr" d="M)")) == 1);
  CATCH_CHECK(count(dom, std::regex(R"(<svg id="memory-chart")")) == 1);
  CATCH_CHECK(count(dom, std::regex(R"(<rect class="mem-peak")")) == 4);
  CATCH_CHECK(count(dom, std::regex(R"(<g class="guard-mark oom")")) == 2);
  CATCH_CHECK(count(dom, std::regex(R"(<g class="guard-mark scale-up")")) == 1);
  CATCH_CHECK(count(dom, std::regex(R"(<img src="samples/grid_00000000[05].png")")) == 2);
  CATCH_CHECK(count(dom, std::regex("<script")) == 1);  // the probe's; the config's markup stayed text
  CATCH_CHECK(dom.find("&lt;script&gt;alert") != std::string::npos);

  // The screenshot: a PNG of the window's size.
  const std::string png = lt::test::read_bytes(out / "report.png");
  CATCH_REQUIRE(png.size() > 24);
  CATCH_CHECK(png.substr(0, 8) == "\x89PNG\r\n\x1a\n");
  const auto be32 = [&](size_t at) {
    return (uint32_t(uint8_t(png[at])) << 24) | (uint32_t(uint8_t(png[at + 1])) << 16) | (uint32_t(uint8_t(png[at + 2])) << 8) |
           uint32_t(uint8_t(png[at + 3]));
  };
  CATCH_CHECK(be32(16) == 1200);
  CATCH_CHECK(be32(20) == 2000);
  CATCH_CHECK(png.size() > 20000);  // charts and text, not a blank page (a near-empty 1200x2000 page is ~12 KB)
}

int main(int argc, char** argv) {
  if (!find_chromium()) {
    std::printf("chromium is not installed (scripts/install-deps installs it): the browser test is skipped\n");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
