#include "loratrain/util/strings.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace lt {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      size_t substitution = diagonal + (a[i - 1] == b[j - 1] ? 0 : 1);
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, substitution});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::optional<std::string> closest_match(std::string_view word,
                                         const std::vector<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_distance = SIZE_MAX;
  const std::string lowered = to_lower(word);
  for (const auto& candidate : candidates) {
    size_t d = edit_distance(lowered, to_lower(candidate));
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  // A suggestion is only useful when most of the word survives: allow about a third edited.
  size_t allowed = std::max<size_t>(2, word.size() / 3);
  if (best && best_distance <= allowed) return best;
  return std::nullopt;
}

std::optional<int64_t> parse_byte_size(std::string_view text) {
  std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (...) {
    return std::nullopt;
  }
  if (!(value >= 0) || !std::isfinite(value)) return std::nullopt;
  std::string unit = to_lower(trim(s.substr(pos)));
  double scale = 1;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kib") scale = 1024.0;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "m" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "g" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "t" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "tb") scale = 1e12;
  else return std::nullopt;
  double bytes = value * scale;
  if (bytes > 9.0e18) return std::nullopt;
  return static_cast<int64_t>(std::llround(bytes));
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes < 0 ? -bytes : bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof buf, "%s%lld B", bytes < 0 ? "-" : "", static_cast<long long>(v));
  else std::snprintf(buf, sizeof buf, "%s%.2f %s", bytes < 0 ? "-" : "", v, units[u]);
  return buf;
}

std::string to_lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t at = s.find(sep, start);
    parts.emplace_back(s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) break;
    start = at + 1;
  }
  return parts;
}

bool starts_with(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && s.compare(0, prefix.size(), prefix) == 0;
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

namespace {

// The length of the valid UTF-8 sequence starting at s[0] and its code point; 0 when invalid
// (truncated, overlong, a surrogate or beyond U+10FFFF).
size_t utf8_sequence(std::string_view s, uint32_t& code_point) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  size_t length = 0;
  uint32_t cp = 0;
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    cp = lead & 0x0F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    cp = lead & 0x07;
  } else {
    return 0;
  }
  if (s.size() < length) return 0;
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i) & 0x3F);
  }
  const uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < smallest[length] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return 0;
  code_point = cp;
  return length;
}

// Code points a terminal acts on instead of showing: C0/C1 controls, DEL, and the format
// characters that reorder or break text (bidi marks, embeddings, overrides, isolates, line and
// paragraph separators).
bool is_invisible_control(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F ||
         (cp >= 0x2028 && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string printable(std::string_view bytes, size_t max_bytes) {
  const bool shortened = bytes.size() > max_bytes;
  if (shortened) {
    // Cut before a character, not inside one.
    size_t cut = max_bytes;
    while (cut > 0 && max_bytes - cut < 3 && (static_cast<unsigned char>(bytes[cut]) & 0xC0) == 0x80) --cut;
    bytes = bytes.substr(0, cut);
  }
  std::string out;
  out.reserve(bytes.size());
  const auto escape_bytes = [&out](std::string_view raw) {
    for (unsigned char b : raw) {
      char buf[5];
      std::snprintf(buf, sizeof buf, "\\x%02X", b);
      out += buf;
    }
  };
  size_t i = 0;
  while (i < bytes.size()) {
    uint32_t cp = 0;
    const size_t length = utf8_sequence(bytes.substr(i), cp);
    if (length == 0) {
      // Not UTF-8 here (or cut off by max_bytes): this one byte is escaped, the next one tried.
      escape_bytes(bytes.substr(i, 1));
      ++i;
      continue;
    }
    if (cp == '\\') out += "\\\\";
    else if (cp == '\n') out += "\\n";
    else if (cp == '\r') out += "\\r";
    else if (cp == '\t') out += "\\t";
    else if (is_invisible_control(cp)) escape_bytes(bytes.substr(i, length));
    else out.append(bytes.substr(i, length));
    i += length;
  }
  if (shortened) out += "...";
  return out;
}

std::string flow_list(const std::vector<int>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

}  // namespace lt
