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

CATCH_TEST_CASE("printable: file bytes quoted in messages cannot drive the terminal", "[util]") {
  using lt::printable;
  // Printable UTF-8 is kept as it is.
  CATCH_CHECK(printable("lora_unet_down_blocks_0.alpha") == "lora_unet_down_blocks_0.alpha");
  CATCH_CHECK(printable("caf\xC3\xA9 \xE7\x8C\xAB \xF0\x9F\x90\x88") == "caf\xC3\xA9 \xE7\x8C\xAB \xF0\x9F\x90\x88");
  // Controls: ESC (colours, cursor moves), BEL, NUL, DEL; newline, tab and carriage return by name.
  CATCH_CHECK(printable("\x1b[2J\x1b[31mred\a") == "\\x1B[2J\\x1B[31mred\\x07");
  CATCH_CHECK(printable(std::string("a\0b", 3)) == "a\\x00b");
  CATCH_CHECK(printable("x\x7Fy") == "x\\x7Fy");
  CATCH_CHECK(printable("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r");
  // A backslash is doubled, so an escape in the output always means an escaped byte.
  CATCH_CHECK(printable("C:\\x41") == "C:\\\\x41");
  // C1 controls (U+009B is a one-byte CSI for some terminals) and a bidi override (U+202E).
  CATCH_CHECK(printable("\xC2\x9B" "2J") == "\\xC2\\x9B2J");
  CATCH_CHECK(printable("abc\xE2\x80\xAE" "fed") == "abc\\xE2\\x80\\xAEfed");
  // Not UTF-8: stray continuation bytes, a truncated sequence, overlong forms, a surrogate.
  CATCH_CHECK(printable("\x80\xFF") == "\\x80\\xFF");
  CATCH_CHECK(printable("ok\xE2\x82") == "ok\\xE2\\x82");
  CATCH_CHECK(printable("\xC0\xAF") == "\\xC0\\xAF");
  CATCH_CHECK(printable("\xED\xA0\x80") == "\\xED\\xA0\\x80");
  // Long input is cut (never inside a character) and marked.
  CATCH_CHECK(printable(std::string(300, 'a'), 10) == "aaaaaaaaaa...");
  CATCH_CHECK(printable("abcdefgh\xC3\xA9xyz", 9) == "abcdefgh...");
}
