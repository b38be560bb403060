#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>

#include "loratrain/util/atomic_file.h"
#include "test_paths.h"

CATCH_TEST_CASE("atomic writes leave the old file or the new one, never a partial one", "[util]") {
  auto dir = lt::test::scratch_dir("atomic_file");
  auto target = dir / "out.txt";
  lt::write_file_atomic(target, "first");
  {
    lt::AtomicFile f(target);
    f.stream() << "half-written";
    // destroyed without commit(): as if an exception unwound the writer
  }
  std::ifstream in(target);
  std::stringstream s;
  s << in.rdbuf();
  CATCH_CHECK(s.str() == "first");
  size_t files = 0;
  for ([[maybe_unused]] auto& e : std::filesystem::directory_iterator(dir)) ++files;
  CATCH_CHECK(files == 1);  // the temporary file is gone
}
