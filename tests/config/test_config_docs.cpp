// docs/config.md is generated from the key tables; this fails when it is stale.
// Regenerate: LT_UPDATE_DOCS=1 build/tests/config/test_config "[docs]"
#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "loratrain/config/schema.h"
#include "loratrain/util/atomic_file.h"
#include "test_paths.h"

CATCH_TEST_CASE("docs/config.md matches the key tables", "[config][docs]") {
  const auto path = lt::test::source_dir() / "docs" / "config.md";
  const std::string want = lt::config::render_config_reference();
  const char* update = std::getenv("LT_UPDATE_DOCS");
  if (update && std::string(update) == "1") lt::write_file_atomic(path, want);
  std::ifstream in(path, std::ios::binary);
  std::ostringstream have;
  have << in.rdbuf();
  CATCH_INFO("docs/config.md is stale: run LT_UPDATE_DOCS=1 test_config \"[docs]\"");
  CATCH_CHECK(have.str() == want);
}

CATCH_TEST_CASE("the reference documents every key with type, default and memory-lever mark", "[config][docs]") {
  const std::string doc = lt::config::render_config_reference();
  for (const auto& k : lt::config::all_keys()) {
    CATCH_INFO(k.path);
    CATCH_CHECK_FALSE(k.doc.empty());
    CATCH_CHECK_FALSE(k.type.empty());
    CATCH_CHECK(doc.find("| `" + k.name + "` |") != std::string::npos);
  }
  CATCH_CHECK(doc.find("## `train`") != std::string::npos);
  CATCH_CHECK(doc.find("## `memory.oom_guard`") != std::string::npos);
  CATCH_CHECK(doc.find("## Memory levers at a glance") != std::string::npos);
}
