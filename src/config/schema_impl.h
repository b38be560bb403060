// The machinery behind the key tables: one typed Key<S> per YAML key of section struct S, which knows
// how to read a node into the field (type, range and allowed-value checks with file:line:col), how to
// write the field back, and how to describe itself (KeyInfo) for docs/config.md.
#pragma once
#include <yaml-cpp/yaml.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "loratrain/config/config.h"
#include "loratrain/config/schema.h"

namespace lt::config::detail {

// Where values come from while reading: the file (with its lines, for exact ${VAR} columns) or one
// command-line override; plus what substitution needs.
struct Ctx {
  std::string file;                                   // display path of the config
  std::vector<std::string> lines;                     // the file's text, by line
  std::string label;                                  // non-empty for overrides: "--set k=v"
  std::string override_key;                           // the dotted key of that override
  std::string name;                                   // config.name, for [name]
  std::map<std::string, SourceLocation>* origins = nullptr;
  // While reading the file: dotted keys that a --set replaces. The file's value of such a key is
  // not read (nor checked), so an override can replace a value the file gets wrong.
  const std::set<std::string>* overridden = nullptr;

  [[noreturn]] void fail(const YAML::Mark& mark, const std::string& path, const std::string& message) const;
  SourceLocation where(const YAML::Mark& mark) const;
  void record(const std::string& path, const YAML::Mark& mark) const;
  // The scalar's text with ${ENV} and [name] substituted (an unset variable is an error).
  std::string scalar(const YAML::Node& node, const YAML::Mark& mark, const std::string& path) const;
};

// One value to read: the node, where to point errors at, and the key's dotted path.
struct Val {
  const YAML::Node& node;
  YAML::Mark mark;
  std::string path;
};

struct Rules {
  std::optional<double> min;
  std::optional<double> max;
  bool min_exclusive = false;
  size_t min_items = 0;                      // lists
  std::vector<std::string> one_of;           // allowed values (case-insensitive; stored as listed)
  std::vector<std::string> not_yet_values;   // AI Toolkit values not supported yet
  // Rewrites a string before the allowed-value check ("txt" -> ".txt", "flex1" -> "flux"); may call
  // fail(message) to reject it.
  std::function<std::string(const std::string&, const std::function<void(const std::string&)>&)> normalize;
};

template <class S>
struct Key {
  KeyInfo info;  // path holds the key name only; tables prefix it for all_keys()
  Rules rules;
  std::function<void(S&, const Val&, Ctx&, const Rules&)> read;
  std::function<void(const S&, YAML::Emitter&)> emit;  // empty: not written to the effective config
  // For sections: sets a key below this one ("ema_config.use_ema").
  std::function<void(S&, const std::vector<std::string>&, size_t, const Val&, Ctx&)> descend;
  // For sections: the keys below, for all_keys().
  std::function<void(std::vector<KeyInfo>&, const std::string& prefix)> nested;

  Key& min(double v) { rules.min = v; info.allowed = allowed_text(); return *this; }
  Key& above(double v) { rules.min = v; rules.min_exclusive = true; info.allowed = allowed_text(); return *this; }
  Key& max(double v) { rules.max = v; info.allowed = allowed_text(); return *this; }
  Key& range(double lo, double hi) { rules.min = lo; rules.max = hi; info.allowed = allowed_text(); return *this; }
  Key& min_items(size_t n) { rules.min_items = n; return *this; }
  Key& one_of(std::vector<std::string> v) { rules.one_of = std::move(v); info.allowed = allowed_text(); return *this; }
  Key& not_yet(std::vector<std::string> v) {
    rules.not_yet_values = std::move(v);
    info.not_yet_values = join(rules.not_yet_values);
    return *this;
  }
  Key& normalize(decltype(Rules::normalize) f) { rules.normalize = std::move(f); return *this; }
  Key& lever() { info.memory_lever = true; return *this; }
  Key& ours() { info.ours = true; return *this; }
  Key& no_effect() { info.support = Support::kNoEffect; return *this; }
  Key& default_is(std::string text) { info.default_value = std::move(text); return *this; }
  Key& allowed_is(std::string text) { info.allowed = std::move(text); return *this; }

  static std::string join(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }
  std::string allowed_text() const;
};

std::string format_number(double v);  // shortest round-trip text, always with a dot
std::string format_bound(double v);   // range bounds: 1 rather than 1.0

template <class S>
std::string Key<S>::allowed_text() const {
  if (!rules.one_of.empty()) return join(rules.one_of);
  std::string s;
  if (rules.min) s = (rules.min_exclusive ? "> " : ">= ") + format_bound(*rules.min);
  if (rules.max) s += (s.empty() ? "" : ", ") + std::string("<= ") + format_bound(*rules.max);
  return s;
}

template <class S>
using Table = std::vector<Key<S>>;

// ---- typed readers and writers --------------------------------------------------------------------

void read_value(bool& out, const Val& v, Ctx& c, const Rules& r);
void read_value(int& out, const Val& v, Ctx& c, const Rules& r);
void read_value(int64_t& out, const Val& v, Ctx& c, const Rules& r);
void read_value(double& out, const Val& v, Ctx& c, const Rules& r);
void read_value(std::string& out, const Val& v, Ctx& c, const Rules& r);
void read_value(std::vector<int>& out, const Val& v, Ctx& c, const Rules& r);
void read_value(std::vector<std::string>& out, const Val& v, Ctx& c, const Rules& r);
void read_value(ParamMap& out, const Val& v, Ctx& c, const Rules& r);
void read_value(ByteSize& out, const Val& v, Ctx& c, const Rules& r);
template <class T>
void read_value(std::optional<T>& out, const Val& v, Ctx& c, const Rules& r) {
  if (v.node.IsNull()) {
    out.reset();
    return;
  }
  T value{};
  read_value(value, v, c, r);
  out = std::move(value);
}

void emit_value(YAML::Emitter& e, bool v);
void emit_value(YAML::Emitter& e, int v);
void emit_value(YAML::Emitter& e, int64_t v);
void emit_value(YAML::Emitter& e, double v);
void emit_value(YAML::Emitter& e, const std::string& v);
void emit_value(YAML::Emitter& e, const std::vector<int>& v);
void emit_value(YAML::Emitter& e, const std::vector<std::string>& v);
void emit_value(YAML::Emitter& e, const ParamMap& v);
void emit_value(YAML::Emitter& e, const ByteSize& v);
template <class T>
void emit_value(YAML::Emitter& e, const std::optional<T>& v) {
  if (v) emit_value(e, *v);
  else e << YAML::Null;
}

inline const char* type_name(bool*) { return "boolean"; }
inline const char* type_name(int*) { return "integer"; }
inline const char* type_name(int64_t*) { return "integer"; }
inline const char* type_name(double*) { return "number"; }
inline const char* type_name(std::string*) { return "string"; }
inline const char* type_name(std::vector<int>*) { return "list of integers"; }
inline const char* type_name(std::vector<std::string>*) { return "list of strings"; }
inline const char* type_name(ParamMap*) { return "mapping"; }
inline const char* type_name(ByteSize*) { return "byte size"; }
template <class T>
const char* type_name(std::optional<T>*) { return type_name(static_cast<T*>(nullptr)); }

// YAML text of one value, as the docs show defaults.
template <class T>
std::string value_text(const T& v) {
  YAML::Emitter e;
  e.SetNullFormat(YAML::LowerNull);
  e << YAML::Flow;
  emit_value(e, v);
  return e.c_str();
}

// ---- sections -------------------------------------------------------------------------------------

// `section_name` names the mapping in messages ("train", "datasets.0", "the process").
template <class S>
void read_section(S& s, const Table<S>& table, const Val& v, Ctx& c, const std::string& section_name);

template <class S>
void emit_section(const S& s, const Table<S>& table, YAML::Emitter& e) {
  e << YAML::BeginMap;
  for (const auto& k : table) {
    if (!k.emit) continue;
    e << YAML::Key << k.info.name << YAML::Value;
    k.emit(s, e);
  }
  e << YAML::EndMap;
}

// Finds a key by name, or fails with "unknown key" and the closest valid name.
template <class S>
const Key<S>& find_or_fail(const Table<S>& table, const std::string& name, const YAML::Mark& mark,
                           const std::string& path, const std::string& section_name, Ctx& c);

[[noreturn]] void fail_unknown_key(const std::string& name, const std::vector<std::string>& candidates,
                                   const YAML::Mark& mark, const std::string& path,
                                   const std::string& section_name, const Ctx& c);

// The mark of a map value; yaml-cpp points an empty value at the next token, so use the key's.
inline YAML::Mark value_mark(const YAML::Node& key, const YAML::Node& value) {
  return value.IsNull() ? key.Mark() : value.Mark();
}

std::string join_path(const std::string& prefix, const std::string& name);

template <class S>
const Key<S>& find_or_fail(const Table<S>& table, const std::string& name, const YAML::Mark& mark,
                           const std::string& path, const std::string& section_name, Ctx& c) {
  for (const auto& k : table)
    if (k.info.name == name) return k;
  std::vector<std::string> names;
  for (const auto& k : table) names.push_back(k.info.name);
  fail_unknown_key(name, names, mark, path, section_name, c);
}

template <class S>
void read_section(S& s, const Table<S>& table, const Val& v, Ctx& c, const std::string& section_name) {
  if (v.node.IsNull()) return;  // `logging:` with nothing below: all defaults
  if (!v.node.IsMap()) c.fail(v.mark, v.path, "expected a mapping of keys (the " + section_name + " section)");
  std::map<std::string, int> seen_line;
  for (auto it = v.node.begin(); it != v.node.end(); ++it) {
    const YAML::Node& key = it->first;
    if (!key.IsScalar()) c.fail(key.Mark(), v.path, "expected a key name");
    const std::string name = key.Scalar();
    const std::string path = join_path(v.path, name);
    if (auto dup = seen_line.find(name); dup != seen_line.end())
      c.fail(key.Mark(), "", "key '" + name + "' appears twice in " + section_name + " (first on line " +
                                   std::to_string(dup->second) + ")");
    seen_line[name] = key.Mark().line + 1;
    const Key<S>& k = find_or_fail(table, name, key.Mark(), path, section_name, c);
    c.record(path, key.Mark());
    if (c.overridden && c.overridden->count(path)) continue;  // the --set supplies this value
    k.read(s, Val{it->second, value_mark(key, it->second), path}, c, k.rules);
  }
}

// ---- key builders ---------------------------------------------------------------------------------

template <class S, class T>
Key<S> field(const char* name, T S::*member, const char* doc) {
  Key<S> k;
  k.info.name = name;
  k.info.type = type_name(static_cast<T*>(nullptr));
  k.info.default_value = value_text(S{}.*member);
  k.info.doc = doc;
  k.read = [member](S& s, const Val& v, Ctx& c, const Rules& r) { read_value(s.*member, v, c, r); };
  k.emit = [member](const S& s, YAML::Emitter& e) { emit_value(e, s.*member); };
  return k;
}

// A key read by a custom function and not written back (aliases, legacy flags).
template <class S>
Key<S> input_only(const char* name, const char* type, const char* default_text, const char* doc,
                  std::function<void(S&, const Val&, Ctx&, const Rules&)> read) {
  Key<S> k;
  k.info.name = name;
  k.info.type = type;
  k.info.default_value = default_text;
  k.info.doc = doc;
  k.read = std::move(read);
  return k;
}

// An AI Toolkit key that lora-train does not support yet: accepted only at its default value.
bool equals_default(const YAML::Node& node, const std::string& default_yaml, Ctx& c, const Val& v);
std::string not_yet_message(const std::string& path, const std::string& default_yaml);

template <class S>
Key<S> not_yet(const char* name, const char* type, const char* default_yaml, const char* doc) {
  Key<S> k;
  k.info.name = name;
  k.info.type = type;
  k.info.default_value = default_yaml;
  k.info.doc = doc;
  k.info.support = Support::kNotYet;
  std::string d = default_yaml;
  k.read = [d](S&, const Val& v, Ctx& c, const Rules&) {
    if (!equals_default(v.node, d, c, v)) c.fail(v.mark, "", not_yet_message(v.path, d));  // names the key
  };
  return k;
}

// A key that serves only AI Toolkit's UI or bookkeeping: any value is accepted and nothing is read.
template <class S>
Key<S> ignored(const char* name, const char* type, const char* default_yaml, const char* doc) {
  Key<S> k;
  k.info.name = name;
  k.info.type = type;
  k.info.default_value = default_yaml;
  k.info.doc = doc;
  k.info.support = Support::kIgnored;
  k.read = [](S&, const Val&, Ctx&, const Rules&) {};
  return k;
}

// An AI Toolkit key whose value changes nothing here: checked like a T (with the key's rules),
// then dropped. For keys worth keeping in the effective config, use field(...).no_effect().
template <class S, class T>
Key<S> accepted(const char* name, T default_value, const char* doc) {
  Key<S> k;
  k.info.name = name;
  k.info.type = type_name(static_cast<T*>(nullptr));
  k.info.default_value = value_text(default_value);
  k.info.doc = doc;
  k.info.support = Support::kNoEffect;
  k.read = [](S&, const Val& v, Ctx& c, const Rules& r) {
    T value{};
    read_value(value, v, c, r);
  };
  return k;
}

// Sets the key parts[i..] below section `s` (the --set path), validated like a file value.
template <class S>
void set_in(S& s, const Table<S>& table, const std::vector<std::string>& parts, size_t i, const Val& v,
            Ctx& c) {
  std::string path;
  for (size_t j = 0; j <= i; ++j) path = join_path(path, parts[j]);
  const std::string section_name = i == 0 ? std::string("the process") : path.substr(0, path.rfind('.'));
  const Key<S>& k = find_or_fail(table, parts[i], v.mark, path, section_name, c);
  if (i + 1 == parts.size()) {
    k.read(s, Val{v.node, v.mark, path}, c, k.rules);
    return;
  }
  if (!k.descend)
    c.fail(v.mark, path, "'" + path + "' is a " + k.info.type + ", not a section with a key '" + parts[i + 1] + "'");
  k.descend(s, parts, i + 1, v, c);
}

template <class S>
void collect_keys(const Table<S>& table, const std::string& prefix, std::vector<KeyInfo>& out) {
  for (const auto& k : table) {
    KeyInfo info = k.info;
    info.path = prefix + k.info.name;
    info.section = prefix.empty() ? std::string("process") : prefix.substr(0, prefix.size() - 1);
    out.push_back(info);
    if (k.nested) k.nested(out, info.path + ".");
  }
}

template <class S, class Sub>
Key<S> section(const char* name, Sub S::*member, const Table<Sub>& (*table)(), const char* doc) {
  Key<S> k;
  k.info.name = name;
  k.info.type = "section";
  k.info.default_value = "";
  k.info.doc = doc;
  k.read = [member, table](S& s, const Val& v, Ctx& c, const Rules&) {
    read_section(s.*member, table(), v, c, v.path);
  };
  k.emit = [member, table](const S& s, YAML::Emitter& e) { emit_section(s.*member, table(), e); };
  k.descend = [member, table](S& s, const std::vector<std::string>& parts, size_t i, const Val& v, Ctx& c) {
    set_in(s.*member, table(), parts, i, v, c);
  };
  k.nested = [table](std::vector<KeyInfo>& out, const std::string& prefix) { collect_keys(table(), prefix, out); };
  return k;
}

// A list of sections (datasets, sample.samples); --set addresses items by index ("datasets.0.x").
template <class S, class Sub>
Key<S> section_list(const char* name, std::vector<Sub> S::*member, const Table<Sub>& (*table)(),
                    const char* doc) {
  Key<S> k;
  k.info.name = name;
  k.info.type = "list of sections";
  k.info.default_value = "[]";
  k.info.doc = doc;
  k.read = [member, table](S& s, const Val& v, Ctx& c, const Rules&) {
    std::vector<Sub> items;
    if (!v.node.IsNull()) {
      if (!v.node.IsSequence())
        c.fail(v.mark, v.path, "expected a list (each item starting with '- ')");
      for (size_t j = 0; j < v.node.size(); ++j) {
        const YAML::Node item = v.node[j];
        const std::string path = v.path + "." + std::to_string(j);
        c.record(path, item.Mark());
        Sub sub{};
        if (!item.IsMap()) c.fail(item.Mark(), path, "expected a mapping of keys (one item of " + v.path + ")");
        read_section(sub, table(), Val{item, item.Mark(), path}, c, path);
        items.push_back(std::move(sub));
      }
    }
    s.*member = std::move(items);
  };
  k.emit = [member, table](const S& s, YAML::Emitter& e) {
    if ((s.*member).empty()) {
      e << YAML::Flow << YAML::BeginSeq << YAML::EndSeq;
      return;
    }
    e << YAML::BeginSeq;
    for (const auto& item : s.*member) emit_section(item, table(), e);
    e << YAML::EndSeq;
  };
  k.descend = [member, table](S& s, const std::vector<std::string>& parts, size_t i, const Val& v, Ctx& c) {
    std::string path;
    for (size_t j = 0; j < i; ++j) path = join_path(path, parts[j]);
    auto& items = s.*member;
    const std::string& index = parts[i];
    size_t n = 0;
    bool numeric = !index.empty() && index.size() < 9 &&
                   index.find_first_not_of("0123456789") == std::string::npos;
    if (numeric) n = std::stoul(index);
    if (!numeric || n >= items.size())
      c.fail(v.mark, path, "'" + index + "' does not name an item of " + path + " (the config has " +
                               std::to_string(items.size()) + "; use " + path + ".0, " + path + ".1, ...)");
    if (i + 1 == parts.size()) {
      Sub sub = items[n];
      read_section(sub, table(), Val{v.node, v.mark, path + "." + index}, c, path + "." + index);
      items[n] = std::move(sub);
      return;
    }
    set_in(items[n], table(), parts, i + 1, v, c);
  };
  k.nested = [table, name](std::vector<KeyInfo>& out, const std::string& prefix) {
    collect_keys(table(), prefix.substr(0, prefix.size() - 1) + "[].", out);
  };
  return k;
}

}  // namespace lt::config::detail
