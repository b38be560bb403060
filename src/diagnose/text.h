// Small text helpers shared by the diagnose parsers. ASCII case folding only: the words the
// analyzer looks for are ASCII, other bytes pass through untouched.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lt::diagnose::detail {

inline char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }
inline bool is_digit(char c) { return c >= '0' && c <= '9'; }
inline bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
inline bool is_word(char c) { return is_alpha(c) || is_digit(c) || c == '_'; }
inline bool contains(std::string_view s, std::string_view w) { return s.find(w) != std::string_view::npos; }
inline bool starts_with(std::string_view s, std::string_view w) { return s.substr(0, w.size()) == w; }
inline bool ends_with(std::string_view s, std::string_view w) {
  return s.size() >= w.size() && s.substr(s.size() - w.size()) == w;
}
// No word character right before `pos` nor right at `end`.
inline bool whole_word(std::string_view s, size_t pos, size_t end) {
  return (pos == 0 || !is_word(s[pos - 1])) && (end >= s.size() || !is_word(s[end]));
}

// Valid UTF-8, cut to about `max` bytes (never inside a sequence), "..." when cut.
std::string snippet(std::string_view text, size_t max = 400);

// "<number> <unit>" at `pos` (spaces allowed before the unit): bytes, KiB..TiB, KB..TB (binary).
std::optional<int64_t> parse_size_at(std::string_view s, size_t pos, size_t* end = nullptr);

// First integer at or after `pos` within `window` bytes (a '-' right before it makes it negative).
std::optional<int64_t> int_after(std::string_view s, size_t pos, size_t window = 24);

// The line without common log prefixes: "[rank0]: ", "> " quotes, timestamps, "INFO:"-style levels
// (ERROR and CRITICAL are kept: they mark error lines).
std::string_view strip_prefix(std::string_view s);

// "torch.OutOfMemoryError: ...", "RuntimeError: ..." -> the exception class, else "".
std::string_view exception_class(std::string_view s);

}  // namespace lt::diagnose::detail
