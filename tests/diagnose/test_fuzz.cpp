// Fuzz-style robustness: random bytes, random truncations and byte flips of corpus logs, and
// pathological shapes. Never a crash; bounded iterations (about a second in Release).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/report.h"
#include "test_support.h"

using namespace lt::diagnose;
namespace fs = std::filesystem;

using lt::test::read_file;

namespace {
void exercise(const std::string& bytes) {
  Diagnosis d = diagnose_text(bytes);
  // Everything the tool prints must serialise (valid UTF-8 everywhere).
  std::string j = to_json(d, "fuzz").dump();
  std::string r = format_report(d, "fuzz");
  CATCH_CHECK_FALSE(j.empty());
  CATCH_CHECK_FALSE(r.empty());
}
}  // namespace

CATCH_TEST_CASE("fuzz: random bytes never crash", "[diagnose][fuzz]") {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<int> byte(0, 255);
  const std::string alphabet = "CUDA out of memory Tried to allocate 2.00 GiB \r\n\x1b[0m%|/:=[]()Traceback File \"";
  for (int it = 0; it < 200; ++it) {
    size_t n = std::uniform_int_distribution<size_t>(0, 20000)(rng);
    std::string s(n, '\0');
    bool text_like = it % 2 == 0;
    for (auto& c : s) c = text_like ? alphabet[static_cast<size_t>(byte(rng)) % alphabet.size()] : static_cast<char>(byte(rng));
    exercise(s);
  }
}

CATCH_TEST_CASE("fuzz: truncated and corrupted corpus logs never crash", "[diagnose][fuzz]") {
  std::vector<std::string> logs;
  for (const auto& e : fs::directory_iterator(lt::test::source_dir() / "tests" / "data" / "logs"))
    if (e.path().extension() == ".log") logs.push_back(read_file(e.path()));
  CATCH_REQUIRE_FALSE(logs.empty());
  std::mt19937 rng(99);
  for (int it = 0; it < 300; ++it) {
    const std::string& src = logs[static_cast<size_t>(it) % logs.size()];
    size_t a = std::uniform_int_distribution<size_t>(0, src.size())(rng);
    size_t b = std::uniform_int_distribution<size_t>(a, src.size())(rng);
    std::string s = src.substr(a, b - a);
    for (int k = 0; k < 5 && !s.empty(); ++k)
      s[std::uniform_int_distribution<size_t>(0, s.size() - 1)(rng)] = static_cast<char>(rng() & 0xFF);
    exercise(s);
  }
}

CATCH_TEST_CASE("fuzz: pathological shapes", "[diagnose][fuzz]") {
  exercise(std::string(3 << 20, '\r'));                       // millions of empty redraws
  exercise(std::string(2 << 20, 'x') + "\nKilled\n");          // one huge line
  std::string deep = "Traceback (most recent call last):\n";
  for (int i = 0; i < 5000; ++i) deep += "  File \"/a/b.py\", line 1, in f" + std::to_string(i) + "\n";
  exercise(deep + "torch.OutOfMemoryError: CUDA out of memory.\n");
  std::string bars;
  for (int i = 0; i < 20000; ++i) bars += "x:  1%|#| " + std::to_string(i) + "/99999999999999999999999 [\r";
  exercise(bars);
  exercise("Tried to allocate 99999999999999999999999999.00 GiB. GPU 0 has a total capacity of nan GiB\n");
}
