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

// The console of `lora-train run --nproc 2` when rank 1 ran out of memory: rank 0's lines as
// they are, rank 1's warnings prefixed "[rank1]: " (docs/distributed.md).
CATCH_TEST_CASE("diagnose reads a two-rank lora-train log whose OOM is on rank 1", "[diagnose][dist]") {
  const std::string log =
      "I 21:30:27 lora-train 0.1.0 (LibTorch 1.13.0): run dp in /runs/dp\n"
      "I 21:30:27 data parallel: rank 0 of 2; train.batch_size 2 per rank, 4 per step\n"
      "I 21:30:27 training 5 steps from step 1; memory settings: checkpointing off, batch 2 x accumulation 1, "
      "buckets [64], sampling off\n"
      "step 1/5 | loss 1.0858 (avg 1.0858) | lr 1.0e-03 | 0.30 s/it | ETA 1s | mem 21.73 MiB / 28.25 MiB\n"
      "[rank1]: W 21:30:29 oom-guard: OOM in phase train_step(step 3, bucket 80x48, batch 2) \u2014 early_steps; "
      "action: enable gradient_checkpointing\n"
      "I 21:30:29 oom-guard: following rank 1's decision\n"
      "W 21:30:29 oom-guard: another rank's OOM in phase train_step(step 3, bucket 80x48, batch 2) \u2014 early_steps; "
      "action: enable gradient_checkpointing\n";
  const auto d = lt::diagnose::diagnose_text(log);
  CATCH_CHECK(d.oom);
  CATCH_CHECK(d.trainer == lt::diagnose::Trainer::kLoraTrain);
}
