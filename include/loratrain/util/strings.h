#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lt {

// Edit distance (insertions, deletions, substitutions), for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word`, if it is close enough to be a plausible typo.
std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates);

// "1.5GiB", "800MiB", "24GB", "1024" (bytes) -> bytes. nullopt when not a size.
std::optional<int64_t> parse_byte_size(std::string_view text);

// 1610612736 -> "1.50 GiB"
std::string format_bytes(int64_t bytes);

std::string to_lower(std::string_view s);
std::string trim(std::string_view s);
std::vector<std::string> split(std::string_view s, char sep);
bool starts_with(std::string_view s, std::string_view prefix);
bool ends_with(std::string_view s, std::string_view suffix);
// "[512, 768]": a list of integers in YAML's (and JSON's) flow style.
std::string flow_list(const std::vector<int>& values);

// Bytes read from a file (a header, a key, a caption), made safe to quote in a message: printable
// UTF-8 stays as it is; control characters, DEL, C1 controls, bidirectional overrides and bytes
// that are not valid UTF-8 become \xNN (\n, \r and \t by name, a backslash doubled), so a
// hostile file cannot move the cursor, recolour the terminal or hide text. At most `max_bytes` of
// the input are shown, then "...".
std::string printable(std::string_view bytes, size_t max_bytes = 200);

}  // namespace lt
