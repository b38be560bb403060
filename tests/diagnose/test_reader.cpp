// LineReader: the awkward bytes real logs contain.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "loratrain/diagnose/analyzer.h"
#include "loratrain/diagnose/line_reader.h"

using namespace lt::diagnose;

namespace {
struct Got {
  std::string text;
  int64_t number;
  bool redraw;
};
std::vector<Got> read_all(const std::string& bytes) {
  LineReader r(string_source(bytes));
  std::vector<Got> out;
  LogLine l;
  while (r.next(l)) out.push_back({std::string(l.text), l.number, l.redraw});
  return out;
}
}  // namespace

CATCH_TEST_CASE("reader splits on LF, CRLF and keeps line numbers", "[diagnose][reader]") {
  auto v = read_all("first\r\nsecond\n\nfourth");
  CATCH_REQUIRE(v.size() == 3);
  CATCH_CHECK(v[0].text == "first");
  CATCH_CHECK(v[0].number == 1);
  CATCH_CHECK_FALSE(v[0].redraw);
  CATCH_CHECK(v[1].text == "second");
  CATCH_CHECK(v[2].text == "fourth");
  CATCH_CHECK(v[2].number == 4);
}

CATCH_TEST_CASE("reader splits tqdm carriage-return redraws, last one last", "[diagnose][reader]") {
  auto v = read_all("steps:   0%|   | 0/10 [00:00<?, ?it/s]\rsteps:  10%|#  | 1/10 [00:01<00:09, 1.0it/s]\r"
                    "steps:  20%|## | 2/10 [00:02<00:08, 1.0it/s]\nnext line\n");
  CATCH_REQUIRE(v.size() == 4);
  CATCH_CHECK(v[0].redraw);
  CATCH_CHECK(v[2].text.find("2/10") != std::string::npos);
  CATCH_CHECK(v[2].number == 1);
  CATCH_CHECK(v[3].text == "next line");
  CATCH_CHECK(v[3].number == 2);
}

CATCH_TEST_CASE("reader strips ANSI codes, orphan SGR fragments and control bytes", "[diagnose][reader]") {
  auto v = read_all("\x1b[1;31mERROR\x1b[0m: \x1b]0;title\x07" "boom\x01\x02\n[32mINFO[0m  ok\t x\n");
  CATCH_REQUIRE(v.size() == 2);
  CATCH_CHECK(v[0].text == "ERROR: boom");
  CATCH_CHECK(v[1].text == "INFO  ok  x");
  CATCH_CHECK(clean_line("\xE2\x86\x90[36mtext\xE2\x86\x90[0m") == "text");
  CATCH_CHECK(clean_line("keep [1m] and [0m") == "keep [1m] and");  // "[1m]" is not SGR-only text
}

CATCH_TEST_CASE("reader keeps invalid UTF-8 bytes, to_valid_utf8 repairs them", "[diagnose][reader]") {
  auto v = read_all(std::string("bad \xff\xfe bytes \xc3\x28 and \xe6\x97\xa5\n"));
  CATCH_REQUIRE(v.size() == 1);
  std::string fixed = to_valid_utf8(v[0].text);
  CATCH_CHECK(fixed == "bad \xEF\xBF\xBD\xEF\xBF\xBD bytes \xEF\xBF\xBD( and \xe6\x97\xa5");
  CATCH_CHECK(to_valid_utf8("\xed\xa0\x80") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  CATCH_CHECK(to_valid_utf8("\xf0\x9f\x98") == "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // truncated
}

CATCH_TEST_CASE("reader cuts a 1 MB line into bounded pieces with one line number", "[diagnose][reader]") {
  std::string big(1 << 20, 'a');
  auto v = read_all("before\n" + big + "CUDA out of memory\nafter\n");
  CATCH_REQUIRE(v.size() >= 3);
  size_t total = 0;
  for (size_t i = 1; i + 1 < v.size(); ++i) {
    CATCH_CHECK(v[i].text.size() <= LineReader::kMaxSegment);
    CATCH_CHECK(v[i].number == 2);
    total += v[i].text.size();
  }
  CATCH_CHECK(total == big.size() + std::string("CUDA out of memory").size());
  CATCH_CHECK(v.back().text == "after");
  CATCH_CHECK(v.back().number == 3);
}

CATCH_TEST_CASE("reader handles empty input, NUL-only input and a missing final newline", "[diagnose][reader]") {
  CATCH_CHECK(read_all("").empty());
  CATCH_CHECK(read_all(std::string(100, '\0')).empty());
  auto v = read_all("no newline at end");
  CATCH_REQUIRE(v.size() == 1);
  CATCH_CHECK(v[0].text == "no newline at end");
}

CATCH_TEST_CASE("open_source reports unreadable paths as input errors", "[diagnose][reader]") {
  CATCH_CHECK_THROWS(open_source("/nonexistent/dir/x.log"));
  CATCH_CHECK_THROWS(open_source("/"));
}

CATCH_TEST_CASE("reader removes data-parallel rank prefixes and keeps the rank", "[diagnose][reader][dist]") {
  LineReader r(string_source("[rank1]: E 10:00:01 torch.OutOfMemoryError: CUDA out of memory.\n"
                             "[rank 0] I 10:00:01 step 3\n[default1]:Traceback\n[ranked] not a prefix\n"));
  std::vector<std::pair<std::string, int>> got;
  LogLine l;
  while (r.next(l)) got.emplace_back(std::string(l.text), l.rank);
  CATCH_REQUIRE(got.size() == 4);
  CATCH_CHECK(got[0] == std::make_pair(std::string("E 10:00:01 torch.OutOfMemoryError: CUDA out of memory."), 1));
  CATCH_CHECK(got[1] == std::make_pair(std::string("I 10:00:01 step 3"), 0));
  CATCH_CHECK(got[2] == std::make_pair(std::string("Traceback"), 1));
  CATCH_CHECK(got[3] == std::make_pair(std::string("[ranked] not a prefix"), -1));
}

CATCH_TEST_CASE("diagnose reads a two-rank log whose OOM is on rank 1", "[diagnose][dist]") {
  const std::string log =
      "[rank0]: I 10:00:00 lora-train 0.1.0 (LibTorch 2.5.1): run two in /runs/two\n"
      "[rank1]: I 10:00:00 lora-train 0.1.0 (LibTorch 2.5.1): run two in /runs/two\n"
      "[rank0]: I 10:00:05 step 1/100 | loss 0.1234 | lr 1.0e-04 | 1.20 s/it | mem 5.1 GiB / 7.9 GiB\n"
      "[rank1]: E 10:00:07 torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.50 GiB. GPU 1 has a total "
      "capacity of 23.65 GiB of which 1.02 GiB is free.\n";
  const auto d = lt::diagnose::diagnose_text(log);
  CATCH_CHECK(d.oom);
}
