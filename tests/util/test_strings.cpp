#include <catch2/catch.hpp>

#include "loratrain/util/strings.h"

CATCH_TEST_CASE("edit distance and closest match", "[util]") {
  CATCH_CHECK(lt::edit_distance("kitten", "sitting") == 3);
  CATCH_CHECK(lt::edit_distance("", "abc") == 3);
  CATCH_CHECK(lt::closest_match("batch_szie", {"batch_size", "steps", "lr"}) == std::string("batch_size"));
  CATCH_CHECK_FALSE(lt::closest_match("completely_different", {"batch_size", "lr"}).has_value());
}

CATCH_TEST_CASE("byte sizes parse and format", "[util]") {
  CATCH_CHECK(lt::parse_byte_size("1.5GiB") == int64_t(1610612736));
  CATCH_CHECK(lt::parse_byte_size("800 MiB") == int64_t(800) * 1024 * 1024);
  CATCH_CHECK(lt::parse_byte_size("24GB") == int64_t(24000000000));
  CATCH_CHECK(lt::parse_byte_size("1024") == int64_t(1024));
  CATCH_CHECK_FALSE(lt::parse_byte_size("lots").has_value());
  CATCH_CHECK_FALSE(lt::parse_byte_size("-3GiB").has_value());
  CATCH_CHECK(lt::format_bytes(1610612736) == "1.50 GiB");
  CATCH_CHECK(lt::format_bytes(512) == "512 B");
}
