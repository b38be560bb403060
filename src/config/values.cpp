// Reading and writing single values: the type, range and allowed-value checks behind every key, and
// ${ENV} / [name] substitution. Every failure goes through Ctx::fail, so it carries file:line:col.
#include <yaml-cpp/yaml.h>

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "loratrain/util/error.h"
#include "loratrain/util/strings.h"
#include "schema_impl.h"

namespace lt::config::detail {

namespace {

// A value quoted inside a one-line message: controls escaped (newlines shown as \n), long values
// shortened.
std::string quote(const std::string& s) { return "'" + printable(s, 60) + "'"; }

std::string got(const YAML::Node& n, const std::string& text) {
  if (n.IsNull()) return "got an empty value";
  if (n.IsSequence()) return "got a list";
  if (n.IsMap()) return "got a mapping";
  return "got " + quote(text);
}

bool parse_int64(const std::string& text, int64_t& out) {
  std::string s;
  // YAML 1.1 (PyYAML, so AI Toolkit) reads 1_000 as 1000.
  for (size_t i = 0; i < text.size(); ++i)
    if (!(text[i] == '_' && i > 0 && i + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[i - 1]))))
      s += text[i];
  if (!s.empty() && s[0] == '+') s = s.substr(1);
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [p, ec] = std::from_chars(s.data(), end, out);
  return ec == std::errc() && p == end;
}

bool parse_double(const std::string& text, double& out) {
  std::string s = trim(text);
  if (s.empty()) return false;
  // YAML spellings of infinity/NaN are never a sensible setting here.
  std::string lower = to_lower(s);
  if (lower.find("inf") != std::string::npos || lower.find("nan") != std::string::npos) return false;
  if (s.find_first_not_of("0123456789+-.eE") != std::string::npos) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size() && std::isfinite(out);
}

void check_range(double value, const std::string& text, const Val& v, Ctx& c, const Rules& r) {
  const bool below = r.min && (r.min_exclusive ? !(value > *r.min) : value < *r.min);
  const bool above = r.max && value > *r.max;
  if (!below && !above) return;
  std::string want;
  if (r.min && r.max) want = "between " + format_bound(*r.min) + " and " + format_bound(*r.max);
  else if (r.min) want = (r.min_exclusive ? "greater than " : "at least ") + format_bound(*r.min);
  else want = "at most " + format_bound(*r.max);
  c.fail(v.mark, v.path, "out of range: must be " + want + ", got " + text);
}

const std::string& require_scalar(const Val& v, Ctx& c, const char* expected) {
  if (!v.node.IsScalar()) c.fail(v.mark, v.path, std::string("expected ") + expected + ", " + got(v.node, ""));
  return v.node.Scalar();
}

// Checks AI Toolkit values lora-train does not support yet, before any type conversion.
void check_not_yet_value(const std::string& text, const Val& v, Ctx& c, const Rules& r) {
  for (const auto& bad : r.not_yet_values) {
    if (to_lower(text) == to_lower(bad)) {
      std::string msg = quote(text) + " is an AI Toolkit setting that lora-train does not support yet";
      if (!r.one_of.empty()) msg += " (supported: " + Key<int>::join(r.one_of) + ")";
      c.fail(v.mark, v.path, msg);
    }
  }
}

bool looks_like_non_string(const std::string& s) {
  if (s.empty()) return true;
  const std::string l = to_lower(s);
  static const char* words[] = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "~"};
  for (const char* w : words)
    if (l == w) return true;
  double d;
  int64_t i;
  return parse_double(s, d) || parse_int64(s, i) || l == ".inf" || l == "-.inf" || l == ".nan";
}

}  // namespace

std::string join_path(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

std::string format_number(double v) {
  char buf[64];
  // Shortest text that reads back exactly; plain decimals for everyday magnitudes (lr: 0.0001).
  const double a = std::fabs(v);
  const bool fixed = a == 0.0 || (a >= 1e-5 && a < 1e15);
  auto [p, ec] = fixed ? std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::fixed)
                       : std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, p);
  // Keep floats recognisable as floats to PyYAML (YAML 1.1 needs a dot): 16 -> 16.0, 1e-06 -> 1.0e-06.
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  else if (s.find('.') == std::string::npos) s.insert(s.find('e'), ".0");
  return s;
}

std::string format_bound(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  return format_number(v);
}

// ---- Ctx -------------------------------------------------------------------------------------------

SourceLocation Ctx::where(const YAML::Mark& mark) const {
  if (!label.empty()) return SourceLocation{label, 0, 0};
  if (mark.line < 0) return SourceLocation{file, 0, 0};
  return SourceLocation{file, mark.line + 1, mark.column + 1};
}

void Ctx::fail(const YAML::Mark& mark, const std::string& path, const std::string& message) const {
  const SourceLocation at = where(mark);
  // An override's label already names its key; name the key only when it is a nested one.
  std::string text = message;
  if (!path.empty() && (label.empty() || path != override_key)) text = path + ": " + message;
  throw lt::ConfigError(at.file, at.line, at.column, text);
}

void Ctx::record(const std::string& path, const YAML::Mark& mark) const {
  if (origins) (*origins)[path] = where(mark);
}

std::string Ctx::scalar(const YAML::Node& node, const YAML::Mark& mark, const std::string& path) const {
  std::string text = node.Scalar();
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t start = text.find("${", pos);
    if (start == std::string::npos) break;
    size_t end = text.find('}', start + 2);
    if (end == std::string::npos) break;
    const std::string var = text.substr(start + 2, end - start - 2);
    const char* value = std::getenv(var.c_str());
    if (!value) {
      // Point at the ${...} itself when it sits on the value's first line.
      YAML::Mark at = mark;
      if (label.empty() && mark.line >= 0 && static_cast<size_t>(mark.line) < lines.size()) {
        const std::string& line = lines[static_cast<size_t>(mark.line)];
        size_t col = line.find("${" + var + "}", static_cast<size_t>(std::max(0, mark.column)));
        if (col != std::string::npos) at.column = static_cast<int>(col);
      }
      fail(at, path, "environment variable '" + var + "' is not set (used as ${" + var + "})");
    }
    out += text.substr(pos, start - pos) + value;
    pos = end + 1;
  }
  out += text.substr(pos);
  if (!name.empty()) {
    const std::string tag = "[name]";
    for (size_t at = out.find(tag); at != std::string::npos; at = out.find(tag, at + name.size()))
      out.replace(at, tag.size(), name);
  }
  return out;
}

// ---- readers ---------------------------------------------------------------------------------------

void read_value(bool& out, const Val& v, Ctx& c, const Rules& r) {
  require_scalar(v, c, "a boolean (true or false)");
  const std::string text = c.scalar(v.node, v.mark, v.path);
  const std::string l = to_lower(trim(text));
  // PyYAML (YAML 1.1, which AI Toolkit reads with) also takes yes/no/on/off.
  if (l == "true" || l == "yes" || l == "on") out = true;
  else if (l == "false" || l == "no" || l == "off") out = false;
  else c.fail(v.mark, v.path, "expected a boolean (true or false), " + got(v.node, text));
  check_not_yet_value(out ? "true" : "false", v, c, r);
}

void read_value(int64_t& out, const Val& v, Ctx& c, const Rules& r) {
  require_scalar(v, c, "an integer");
  const std::string text = trim(c.scalar(v.node, v.mark, v.path));
  check_not_yet_value(text, v, c, r);
  if (!parse_int64(text, out)) c.fail(v.mark, v.path, "expected an integer, " + got(v.node, text));
  check_range(static_cast<double>(out), text, v, c, r);
}

void read_value(int& out, const Val& v, Ctx& c, const Rules& r) {
  int64_t wide = 0;
  read_value(wide, v, c, r);
  if (wide < std::numeric_limits<int>::min() || wide > std::numeric_limits<int>::max())
    c.fail(v.mark, v.path, "out of range: " + std::to_string(wide) + " does not fit a 32-bit integer");
  out = static_cast<int>(wide);
}

void read_value(double& out, const Val& v, Ctx& c, const Rules& r) {
  require_scalar(v, c, "a number");
  const std::string text = trim(c.scalar(v.node, v.mark, v.path));
  check_not_yet_value(text, v, c, r);
  if (!parse_double(text, out)) c.fail(v.mark, v.path, "expected a number, " + got(v.node, text));
  check_range(out, text, v, c, r);
}

void read_value(std::string& out, const Val& v, Ctx& c, const Rules& r) {
  if (v.node.IsNull()) {
    out.clear();
  } else {
    require_scalar(v, c, "a string");
    out = c.scalar(v.node, v.mark, v.path);
  }
  check_not_yet_value(out, v, c, r);
  if (r.normalize) out = r.normalize(out, [&](const std::string& m) { c.fail(v.mark, v.path, m); });
  if (r.one_of.empty()) return;
  for (const auto& allowed : r.one_of) {
    if (to_lower(out) == to_lower(allowed)) {
      out = allowed;
      return;
    }
  }
  std::string msg = quote(out) + " is not an allowed value (allowed: " + Key<int>::join(r.one_of);
  if (auto near = closest_match(out, r.one_of)) msg += "; did you mean '" + *near + "'?";
  c.fail(v.mark, v.path, msg + ")");
}

void read_value(std::vector<int>& out, const Val& v, Ctx& c, const Rules& r) {
  std::vector<int> values;
  if (v.node.IsScalar()) {
    int x = 0;
    read_value(x, v, c, r);
    values.push_back(x);
  } else if (v.node.IsSequence()) {
    for (size_t i = 0; i < v.node.size(); ++i) {
      const YAML::Node item = v.node[i];
      if (!item.IsScalar())
        c.fail(item.Mark(), v.path, "expected a list of integers, but item " + std::to_string(i + 1) + " is " +
                                        (item.IsSequence() ? "a list" : item.IsMap() ? "a mapping" : "empty"));
      int x = 0;
      read_value(x, Val{item, item.Mark(), v.path}, c, r);
      values.push_back(x);
    }
  } else if (!v.node.IsNull()) {
    c.fail(v.mark, v.path, "expected an integer or a list of integers, " + got(v.node, ""));
  }
  if (values.size() < r.min_items)
    c.fail(v.mark, v.path, "expected at least " + std::to_string(r.min_items) + " value" +
                               (r.min_items == 1 ? "" : "s") + ", " + (v.node.IsNull() ? "got an empty value" : "got an empty list"));
  out = std::move(values);
}

void read_value(std::vector<std::string>& out, const Val& v, Ctx& c, const Rules& r) {
  std::vector<std::string> values;
  if (v.node.IsSequence()) {
    for (size_t i = 0; i < v.node.size(); ++i) {
      const YAML::Node item = v.node[i];
      if (!item.IsScalar())
        c.fail(item.Mark(), v.path, "expected a list of strings, but item " + std::to_string(i + 1) + " is " +
                                        (item.IsSequence() ? "a list" : item.IsMap() ? "a mapping" : "empty"));
      values.push_back(c.scalar(item, item.Mark(), v.path));
    }
  } else if (!v.node.IsNull()) {
    c.fail(v.mark, v.path, "expected a list of strings (each item starting with '- '), " +
                               got(v.node, v.node.IsScalar() ? v.node.Scalar() : ""));
  }
  if (values.size() < r.min_items)
    c.fail(v.mark, v.path, "expected at least " + std::to_string(r.min_items) + " item(s)");
  out = std::move(values);
}

namespace {
// Substitutes inside every scalar of a free-form value and returns its YAML flow text.
YAML::Node substituted(const YAML::Node& n, const std::string& path, Ctx& c) {
  if (n.IsScalar()) {
    YAML::Node s(c.scalar(n, n.Mark(), path));
    return s;
  }
  if (n.IsSequence()) {
    YAML::Node s(YAML::NodeType::Sequence);
    for (size_t i = 0; i < n.size(); ++i) s.push_back(substituted(n[i], path, c));
    return s;
  }
  if (n.IsMap()) {
    YAML::Node s(YAML::NodeType::Map);
    for (auto it = n.begin(); it != n.end(); ++it) s[it->first.Scalar()] = substituted(it->second, path, c);
    return s;
  }
  return YAML::Node();
}
}  // namespace

void read_value(ParamMap& out, const Val& v, Ctx& c, const Rules&) {
  ParamMap values;
  if (v.node.IsMap()) {
    for (auto it = v.node.begin(); it != v.node.end(); ++it) {
      if (!it->first.IsScalar()) c.fail(it->first.Mark(), v.path, "expected a key name");
      const std::string path = join_path(v.path, it->first.Scalar());
      const YAML::Node& raw = it->second;
      ParamValue value;
      if (raw.IsScalar()) {
        value.text = c.scalar(raw, raw.Mark(), path);
        value.quoted = raw.Tag() == "!";  // 'quoted' in the file: stays a string when written back
      } else if (!raw.IsNull()) {
        YAML::Emitter e;
        e << YAML::Flow << substituted(raw, path, c);
        value.text = e.c_str();
        value.collection = true;
      }
      values[it->first.Scalar()] = value;
    }
  } else if (!v.node.IsNull()) {
    c.fail(v.mark, v.path, "expected a mapping of keys, " + got(v.node, v.node.IsScalar() ? v.node.Scalar() : ""));
  }
  out = std::move(values);
}

void read_value(ByteSize& out, const Val& v, Ctx& c, const Rules&) {
  if (v.node.IsNull()) {
    out.bytes = 0;
    return;
  }
  require_scalar(v, c, "a size like 1.5GiB or 800MiB");
  const std::string text = trim(c.scalar(v.node, v.mark, v.path));
  auto bytes = parse_byte_size(text);
  if (!bytes) c.fail(v.mark, v.path, "expected a size like 1.5GiB, 800MiB or 24GB (0 = off), got " + quote(text));
  out.bytes = *bytes;
}

// ---- writers ---------------------------------------------------------------------------------------

void emit_value(YAML::Emitter& e, bool v) { e << (v ? "true" : "false"); }
void emit_value(YAML::Emitter& e, int v) { e << v; }
void emit_value(YAML::Emitter& e, int64_t v) { e << static_cast<long long>(v); }
void emit_value(YAML::Emitter& e, double v) { e << format_number(v); }
void emit_value(YAML::Emitter& e, const std::string& v) {
  // A string that YAML would read as a number, boolean or null is quoted, so Python sees a string.
  if (looks_like_non_string(v)) e << YAML::DoubleQuoted << v;
  else e << v;
}
void emit_value(YAML::Emitter& e, const std::vector<int>& v) {
  e << YAML::Flow << YAML::BeginSeq;
  for (int x : v) e << x;
  e << YAML::EndSeq;
}
void emit_value(YAML::Emitter& e, const std::vector<std::string>& v) {
  if (v.empty()) {
    e << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
    return;
  }
  e << YAML::BeginSeq;
  for (const auto& x : v) emit_value(e, x);
  e << YAML::EndSeq;
}
void emit_value(YAML::Emitter& e, const ParamMap& v) {
  if (v.empty()) {
    e << YAML::Flow << YAML::BeginMap << YAML::EndMap;
    return;
  }
  e << YAML::BeginMap;
  for (const auto& [k, value] : v) {
    e << YAML::Key << k << YAML::Value;
    if (value.collection) e << YAML::Flow << YAML::Load(value.text);
    else if (value.quoted) e << YAML::DoubleQuoted << value.text;
    else if (value.text.empty()) e << YAML::Null;
    else e << value.text;
  }
  e << YAML::EndMap;
}

void emit_value(YAML::Emitter& e, const ByteSize& v) {
  if (v.bytes == 0) {
    e << 0;
    return;
  }
  // The shortest text in the largest unit that reads back as exactly the same byte count.
  const std::pair<const char*, double> units[] = {{"TiB", 1099511627776.0}, {"GiB", 1073741824.0},
                                                  {"MiB", 1048576.0}, {"KiB", 1024.0}};
  for (const auto& [unit, scale] : units) {
    const double value = static_cast<double>(v.bytes) / scale;
    if (value < 1.0) continue;
    for (int precision = 1; precision <= 12; ++precision) {
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.*g%s", precision, value, unit);
      auto back = parse_byte_size(buf);
      if (back && *back == v.bytes) {
        e << buf;
        return;
      }
    }
  }
  e << static_cast<long long>(v.bytes);
}

// ---- not-yet keys ----------------------------------------------------------------------------------

bool equals_default(const YAML::Node& node, const std::string& default_yaml, Ctx& c, const Val& v) {
  const YAML::Node d = YAML::Load(default_yaml);
  const bool empty = node.IsNull() || (node.IsSequence() && node.size() == 0) || (node.IsMap() && node.size() == 0) ||
                     (node.IsScalar() && node.Scalar().empty());
  if (d.IsNull() || (d.IsSequence() && d.size() == 0) || (d.IsMap() && d.size() == 0)) return empty;
  if (!node.IsScalar() || !d.IsScalar()) return false;
  const std::string text = trim(c.scalar(node, v.mark, v.path));
  const std::string l = to_lower(text), dl = to_lower(d.Scalar());
  auto as_bool = [](const std::string& s) -> int {
    if (s == "true" || s == "yes" || s == "on") return 1;
    if (s == "false" || s == "no" || s == "off") return 0;
    return -1;
  };
  if (as_bool(dl) >= 0) return as_bool(l) == as_bool(dl);
  double a, b;
  if (parse_double(dl, b)) return parse_double(text, a) && a == b;
  return l == dl;
}

std::string not_yet_message(const std::string& path, const std::string& default_yaml) {
  const YAML::Node d = YAML::Load(default_yaml);
  std::string msg = "key '" + path + "' is an AI Toolkit setting that lora-train does not support yet";
  if (d.IsNull() || (d.IsSequence() && d.size() == 0) || (d.IsMap() && d.size() == 0)) return msg + "; remove it";
  return msg + "; remove it or leave it at " + default_yaml;
}

[[noreturn]] void fail_unknown_key(const std::string& name, const std::vector<std::string>& candidates,
                                   const YAML::Mark& mark, const std::string& path,
                                   const std::string& section_name, const Ctx& c) {
  std::string msg = "unknown key " + quote(name) + " in " + (section_name.empty() ? "the process" : section_name);
  // The common YAML slip is indentation: a key that exists, but in another section.
  std::vector<std::string> sections;
  for (const auto& k : all_keys())
    if (k.name == name && k.section != "(top level)" && k.support != Support::kNotYet)
      sections.push_back(k.section == "process" ? "the process" : k.section);
  std::string elsewhere;
  for (size_t i = 0; i < sections.size(); ++i)
    elsewhere += (i == 0 ? "" : i + 1 == sections.size() ? " or " : ", ") + sections[i];
  if (name == "<<") msg += " (YAML merge keys are not supported; write the keys out)";
  else if (!elsewhere.empty()) msg += " ('" + name + "' belongs in " + elsewhere + "; check the indentation)";
  else if (auto near = closest_match(name, candidates)) msg += " (did you mean '" + *near + "'?)";
  // The message names the key; point at it without repeating the path.
  const SourceLocation at = c.where(mark);
  throw lt::ConfigError(at.file, at.line, at.column, msg);
}

}  // namespace lt::config::detail
