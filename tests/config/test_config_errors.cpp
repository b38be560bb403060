// Malformed configs as users write them: each one gets exactly one file:line:col message.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "loratrain/config/config.h"
#include "test_paths.h"

namespace fs = std::filesystem;
using namespace lt::config;

namespace {

struct Expectation {
  int line = 0;     // 0: not checked
  int column = 0;   // 0: not checked
  std::string text;
};

// "# expect: 12:7: message" (tests/data/configs/make_bad_configs.py writes these headers).
Expectation read_expectation(const fs::path& path) {
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  const std::string tag = "# expect: ";
  if (first.rfind(tag, 0) != 0) throw std::runtime_error(path.string() + ": no '# expect:' header");
  std::string rest = first.substr(tag.size());
  Expectation e;
  const size_t colon1 = rest.find(':');
  const size_t colon2 = rest.find(':', colon1 + 1);
  e.line = std::stoi(rest.substr(0, colon1));
  const std::string col = rest.substr(colon1 + 1, colon2 - colon1 - 1);
  e.column = col == "*" ? 0 : std::stoi(col);
  e.text = rest.substr(colon2 + 2);
  return e;
}

}  // namespace

CATCH_TEST_CASE("each malformed config reports one precise file:line:col error", "[config][errors]") {
  const fs::path dir = lt::test::source_dir() / "tests" / "data" / "configs" / "bad";
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".yaml") continue;
    ++count;
    const Expectation want = read_expectation(entry.path());
    CATCH_INFO(entry.path().filename().string());
    try {
      load_config(entry.path());
      CATCH_FAIL("no error for " << entry.path().filename().string());
    } catch (const lt::ConfigError& e) {
      const std::string what = e.what();
      CATCH_INFO(what);
      CATCH_CHECK(e.code() == lt::ExitCode::kUsage);
      CATCH_CHECK(e.file() == entry.path().string());
      CATCH_CHECK(what.find('\n') == std::string::npos);  // one line
      CATCH_CHECK(what.rfind(entry.path().string() + ":", 0) == 0);
      if (want.line > 0) CATCH_CHECK(e.line() == want.line);
      if (want.column > 0) CATCH_CHECK(e.column() == want.column);
      CATCH_CHECK(e.bare_message().find(want.text) != std::string::npos);
      CATCH_CHECK(what.find("yaml-cpp") == std::string::npos);  // no raw library text
    }
  }
  CATCH_CHECK(count >= 30);
}

CATCH_TEST_CASE("an unset environment variable is an error at its position", "[config][errors]") {
  ::unsetenv("LT_TEST_SURELY_UNSET");
  const std::string text =
      "job: extension\n"
      "config:\n"
      "  name: env\n"
      "  process:\n"
      "    - type: sd_trainer\n"
      "      datasets:\n"
      "        - folder_path: /data/${LT_TEST_SURELY_UNSET}/images\n"
      "      model: {name_or_path: /m.safetensors}\n";
  try {
    parse_config_text(text, "env.yaml");
    CATCH_FAIL("no error");
  } catch (const lt::ConfigError& e) {
    CATCH_CHECK(e.line() == 7);
    CATCH_CHECK(e.column() == 30);  // the '$' of ${LT_TEST_SURELY_UNSET}
    CATCH_CHECK(e.bare_message() ==
                "datasets.0.folder_path: environment variable 'LT_TEST_SURELY_UNSET' is not set "
                "(used as ${LT_TEST_SURELY_UNSET})");
  }
}

CATCH_TEST_CASE("file-level problems are config errors too", "[config][errors]") {
  const fs::path dir = lt::test::scratch_dir("config_errors");
  try {
    load_config(dir / "nope.yaml");
    CATCH_FAIL("no error");
  } catch (const lt::ConfigError& e) {
    CATCH_CHECK(std::string(e.what()) == (dir / "nope.yaml").string() + ": config file not found");
  }
  {
    std::ofstream(dir / "empty.yaml") << "# nothing here\n";
  }
  try {
    load_config(dir / "empty.yaml");
    CATCH_FAIL("no error");
  } catch (const lt::ConfigError& e) {
    CATCH_CHECK(e.bare_message().find("the config is empty") != std::string::npos);
  }
  {
    std::ofstream(dir / "list.yaml") << "- job: extension\n";
  }
  try {
    load_config(dir / "list.yaml");
    CATCH_FAIL("no error");
  } catch (const lt::ConfigError& e) {
    CATCH_CHECK(e.line() == 1);
    CATCH_CHECK(e.bare_message().find("expected a mapping with job:") != std::string::npos);
  }
}

CATCH_TEST_CASE("random damage to a config only ever yields a ConfigError", "[config][errors]") {
  std::ifstream in(lt::test::source_dir() / "configs" / "flux-lora-24gb.yaml");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string original = buf.str();
  // A fixed linear congruential sequence: the same edits on every run.
  uint64_t state = 12345;
  auto next = [&](uint64_t n) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % n;
  };
  const std::string inserts[] = {":", "- ", "[", "]", "{", "\t", "\"", "'", "#", "&a", "*a", "? ", "\n", "  ", "!!int ",
                                 "${X", "0x1F", "-1", "1e400", "null", "~", "<<: "};
  int errors = 0;
  for (int i = 0; i < 400; ++i) {
    std::string text = original;
    for (int edits = 1 + static_cast<int>(next(3)); edits > 0; --edits) {
      const size_t pos = next(text.size());
      switch (next(3)) {
        case 0: text.erase(pos, 1 + next(8)); break;
        case 1: text.insert(pos, inserts[next(sizeof(inserts) / sizeof(inserts[0]))]); break;
        default: {
          const size_t line_start = text.rfind('\n', pos);
          const size_t line_end = text.find('\n', pos);
          if (line_start != std::string::npos && line_end != std::string::npos)
            text.insert(line_end, text.substr(line_start, line_end - line_start));
        }
      }
    }
    try {
      parse_config_text(text, "damaged.yaml");
    } catch (const lt::ConfigError& e) {
      ++errors;
      CATCH_CHECK(std::string(e.what()).find('\n') == std::string::npos);
    } catch (const std::exception& e) {
      CATCH_FAIL("edit " << i << " escaped as a non-config exception: " << e.what() << "\n" << text);
    }
  }
  CATCH_CHECK(errors > 100);  // most damage is detected, the rest still parses to a valid config
}
