#include "core/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "core/files.h"

namespace iha {

// ---- ConfigNode ----

// A yaml-cpp node is a handle onto shared document storage: copies see each other's writes,
// which is what apply_override relies on.
struct ConfigNode::Document {
  YAML::Node node;
};

namespace {

std::shared_ptr<const ConfigNode::Document> document_of(YAML::Node n) {
  return std::make_shared<const ConfigNode::Document>(ConfigNode::Document{n});
}

}  // namespace

ConfigNode::ConfigNode() : node_(document_of(YAML::Node())) {}

ConfigNode::ConfigNode(std::shared_ptr<const Document> node, std::string path)
    : node_(std::move(node)), path_(std::move(path)) {}

ConfigNode ConfigNode::from_file(const std::string& file) {
  // A directory would read as an empty config (every key missing), a FIFO would block: the
  // file is checked and read through one descriptor (core/files.h).
  const InputFile in(file, "config file");
  return from_string(in.read_all(), file);
}

namespace {

// The shape a config may have, checked on the parser's event stream before any node is
// built. Anchors and aliases are refused: yaml-cpp shares an aliased node between its keys, so
// an override of one key would change every key that names it, and walking nested aliases
// expands them exponentially. Keys are plain scalars of bounded length, nesting is bounded,
// and there is one document. Every message names the key and its line.
class ShapeCheck final : public YAML::EventHandler {
 public:
  static constexpr size_t kMaxKeyBytes = 128;
  static constexpr size_t kMaxDepth = 32;

  // base: where the text sits (an override's value sits under its key).
  ShapeCheck(std::string name, std::string base) : name_(std::move(name)), base_(std::move(base)) {}

  void OnDocumentStart(const YAML::Mark& m) override {
    if (++documents_ > 1) fail(m, "holds more than one YAML document ('---'); a config is one mapping");
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t a) override { value(m, a, "null"); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override {
    fail(m, "uses an alias (*name) at key '" + key_here() + "'; aliases and anchors are not "
            "accepted in a config (write the value at each key)");
  }
  void OnAnchor(const YAML::Mark& m, const std::string& anchor) override {
    fail(m, "defines an anchor (&" + anchor + ") at key '" + key_here() + "'; aliases and anchors "
            "are not accepted in a config (write the value at each key)");
  }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t a, const std::string& v) override {
    value(m, a, v);
  }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t a,
                       YAML::EmitterStyle::value) override {
    open(m, a, false);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t a,
                  YAML::EmitterStyle::value) override {
    open(m, a, true);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Frame {
    bool is_map = true;
    bool at_key = true;  // a mapping alternates key, value
    std::string key;     // the mapping's current key, or "[i]" in a list
    size_t index = 0;
  };

  [[noreturn]] void fail(const YAML::Mark& m, const std::string& what) const {
    throw ConfigError("config '" + name_ + "'" +
                      (m.line >= 0 ? " (line " + std::to_string(m.line + 1) + ")" : "") + ": " + what);
  }
  std::string key_here() const {
    std::string k = base_;
    for (const Frame& f : stack_) {
      if (f.key.empty()) continue;
      if (!f.is_map) k += f.key;
      else k += (k.empty() ? "" : ".") + f.key;
    }
    return k.empty() ? "<top level>" : k;
  }
  void value(const YAML::Mark& m, YAML::anchor_t a, const std::string& scalar) {
    if (a != YAML::NullAnchor) fail(m, "uses an anchor at key '" + key_here() + "'; not accepted in a config");
    if (stack_.empty()) return;  // a bare scalar document: from_string names it
    Frame& f = stack_.back();
    if (f.is_map && f.at_key) {
      if (scalar.size() > kMaxKeyBytes)
        fail(m, "has a key of " + std::to_string(scalar.size()) + " bytes under '" + key_here() + "' (it begins '" +
                    scalar.substr(0, 32) + "'; at most " + std::to_string(kMaxKeyBytes) + " bytes): not a config key");
      f.key = scalar;
      f.at_key = false;
      return;
    }
    advance();
  }
  void open(const YAML::Mark& m, YAML::anchor_t a, bool is_map) {
    if (a != YAML::NullAnchor) fail(m, "uses an anchor at key '" + key_here() + "'; not accepted in a config");
    if (!stack_.empty() && stack_.back().is_map && stack_.back().at_key)
      fail(m, "has a list or mapping as a key under '" + key_here() + "'; keys are plain names");
    if (stack_.size() >= kMaxDepth)
      fail(m, "nests deeper than " + std::to_string(kMaxDepth) + " levels at key '" + key_here() + "'");
    if (!stack_.empty() && !stack_.back().is_map)
      stack_.back().key = "[" + std::to_string(stack_.back().index) + "]";
    Frame f;
    f.is_map = is_map;
    if (!is_map) f.key = "[0]";
    stack_.push_back(f);
  }
  void close() {
    stack_.pop_back();
    advance();
  }
  // A value finished: a mapping expects its next key, a list its next element.
  void advance() {
    if (stack_.empty()) return;
    Frame& f = stack_.back();
    if (f.is_map) {
      f.at_key = true;
    } else {
      ++f.index;
      f.key = "[" + std::to_string(f.index) + "]";
    }
  }

  std::string name_, base_;
  int documents_ = 0;
  std::vector<Frame> stack_;
};

// A YAML syntax error, with the text of the line it points at (its first bytes): yaml-cpp's
// message gives only the position, and for a plain key past 1024 bytes (which YAML itself refuses)
// not even a hint of which key.
ConfigError syntax_error(const std::string& name, const std::string& text, const YAML::Exception& e) {
  std::string msg = "config '" + name + "': YAML syntax error: " + e.what();
  if (e.mark.line >= 0) {
    std::istringstream in(text);
    std::string line;
    for (int i = 0; i <= e.mark.line && std::getline(in, line); ++i) {
    }
    if (in || !line.empty()) {
      msg += " (line " + std::to_string(e.mark.line + 1) + " begins '" + line.substr(0, 48) + "'";
      if (line.size() > ShapeCheck::kMaxKeyBytes)
        msg += ", " + std::to_string(line.size()) + " bytes long; config keys are at most " +
               std::to_string(ShapeCheck::kMaxKeyBytes) + " bytes";
      msg += ")";
    }
  }
  return ConfigError(msg);
}

void check_shape(const std::string& text, const std::string& name, const std::string& base = "") {
  std::istringstream in(text);
  ShapeCheck check(name, base);
  try {
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(check)) {
    }
  } catch (const YAML::Exception& e) {
    throw syntax_error(name, text, e);
  }
}

// yaml-cpp keeps every entry of a mapping that repeats a key, and lookups see only the first:
// a repeated key (or section) would silently lose the later value. Refused, naming the key.
// `path` is where n sits (an override's value sits under its key).
void reject_duplicate_keys(const YAML::Node& n, const std::string& path, const std::string& name) {
  if (n.IsMap()) {
    std::set<std::string> seen;
    for (const auto& kv : n) {
      const std::string k = kv.first.IsScalar() ? kv.first.Scalar() : std::string("<non-scalar key>");
      const std::string full = path.empty() ? k : path + "." + k;
      if (!seen.insert(k).second) {
        const YAML::Mark m = kv.first.Mark();
        throw ConfigError("config '" + name + "': duplicate key '" + full + "'" +
                          (m.line >= 0 ? " (line " + std::to_string(m.line + 1) + ")" : "") +
                          ": each key may appear once in a mapping");
      }
      reject_duplicate_keys(kv.second, full, name);
    }
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) reject_duplicate_keys(n[i], path + "[" + std::to_string(i) + "]", name);
  }
}

}  // namespace

ConfigNode ConfigNode::from_string(const std::string& text, const std::string& name) {
  check_shape(text, name);
  YAML::Node n;
  try {
    n = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw syntax_error(name, text, e);
  }
  reject_duplicate_keys(n, "", name);
  if (n.IsNull()) n = YAML::Node(YAML::NodeType::Map);
  IHA_CONFIG_CHECK(n.IsMap(), "config '", name, "': the top level must be a mapping of keys");
  return ConfigNode(document_of(n), "");
}

std::string ConfigNode::key_path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

// Present means written, even with an empty or null value: such a key is an error when read
// (a value the user meant to give), never the default.
bool ConfigNode::has(const std::string& key) const {
  const YAML::Node& n = node_->node;
  return n && n.IsMap() && n[key];
}

namespace {

template <class T> const char* type_word();
template <> const char* type_word<bool>() { return "true or false"; }
template <> const char* type_word<int64_t>() { return "an integer"; }
template <> const char* type_word<int>() { return "an integer"; }
template <> const char* type_word<double>() { return "a number"; }
template <> const char* type_word<std::string>() { return "a string"; }
template <> const char* type_word<std::vector<int64_t>>() { return "a list of integers"; }

// Numbers are decimal: a leading zero reads as octal in YAML 1.1 and in C ("010" is 8), and
// "0x" as hex, so "010" is refused rather than read as either 8 or 10. ("0", "0.5" pass.)
void reject_leading_zero(const std::string& s, const std::string& key) {
  const size_t at = !s.empty() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (s.size() > at + 1 && s[at] == '0' && s[at + 1] != '.' && s[at + 1] != 'e' && s[at + 1] != 'E')
    throw ConfigError("config key '" + key + "': '" + s + "' has a leading zero; write the number in "
                      "decimal without one");
}

template <class T>
T convert_node(const YAML::Node& n, const std::string& key) {
  // One rule for an empty or null value: never the default. A string key reads it as the
  // empty string (`--set logging.jsonl=` turns the log off); any other type is an error.
  if constexpr (std::is_same_v<T, std::string>) {
    if (n.IsNull()) return std::string();
  }
  if (n.IsNull())
    throw ConfigError("config key '" + key + "' has an empty (null) value: give it " + type_word<T>() +
                      ", or remove the key to use the default");
  auto fail = [&]() -> ConfigError {
    std::string got = n.IsScalar() ? "'" + n.Scalar() + "'" : (n.IsSequence() ? "a list" : "a mapping");
    return ConfigError("config key '" + key + "': expected " + type_word<T>() + ", got " + got);
  };
  if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    if (!n.IsSequence()) throw fail();
    std::vector<int64_t> out;
    for (const auto& e : n) out.push_back(convert_node<int64_t>(e, key));
    return out;
  } else {
    if (!n.IsScalar()) throw fail();
    if constexpr (std::is_same_v<T, std::string>) {
      return n.Scalar();
    } else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, int>) {
      // yaml-cpp accepts "1.5" as an int by truncation in some versions; be strict.
      const std::string& s = n.Scalar();
      reject_leading_zero(s, key);
      size_t pos = 0;
      long long v = 0;
      try {
        v = std::stoll(s, &pos, 10);
      } catch (...) {
        throw fail();
      }
      if (pos != s.size()) throw fail();
      if constexpr (std::is_same_v<T, int>) {
        if (v < INT32_MIN || v > INT32_MAX) throw fail();
      }
      return static_cast<T>(v);
    } else {
      if constexpr (std::is_same_v<T, double>) reject_leading_zero(n.Scalar(), key);
      try {
        return n.as<T>();
      } catch (const YAML::Exception&) {
        throw fail();
      }
    }
  }
}

}  // namespace

template <class T>
std::optional<T> ConfigNode::optional(const std::string& key) const {
  used_->insert(key);
  if (!has(key)) return std::nullopt;
  return convert_node<T>(node_->node[key], key_path(key));
}

template <class T>
T ConfigNode::get(const std::string& key, const T& fallback) const {
  auto v = optional<T>(key);
  return v ? *v : fallback;
}

template <class T>
T ConfigNode::require(const std::string& key) const {
  auto v = optional<T>(key);
  if (!v) throw ConfigError("config key '" + key_path(key) + "' is required but missing");
  return *v;
}

#define IHA_CONFIG_INSTANTIATE(T)                                                    \
  template T ConfigNode::get<T>(const std::string&, const T&) const;                \
  template T ConfigNode::require<T>(const std::string&) const;                      \
  template std::optional<T> ConfigNode::optional<T>(const std::string&) const;
IHA_CONFIG_INSTANTIATE(bool)
IHA_CONFIG_INSTANTIATE(int)
IHA_CONFIG_INSTANTIATE(int64_t)
IHA_CONFIG_INSTANTIATE(double)
IHA_CONFIG_INSTANTIATE(std::string)
IHA_CONFIG_INSTANTIATE(std::vector<int64_t>)
#undef IHA_CONFIG_INSTANTIATE

ConfigNode ConfigNode::child(const std::string& key) const {
  used_->insert(key);
  YAML::Node n;
  if (has(key)) {
    n = node_->node[key];
    IHA_CONFIG_CHECK(!n.IsNull(), "config key '", key_path(key), "' has an empty (null) value: give "
                     "it a mapping of keys, or remove it to use the defaults");
    IHA_CONFIG_CHECK(n.IsMap(), "config key '", key_path(key), "': expected a mapping of keys");
  } else {
    n = YAML::Node(YAML::NodeType::Map);
  }
  ConfigNode c(document_of(n), key_path(key));
  children_->push_back(c);
  return c;
}

void ConfigNode::inapplicable(const std::vector<std::string>& keys, const std::string& why) const {
  for (const auto& k : keys) (*why_unused_)[k] = why;
}

void ConfigNode::finish() const {
  const YAML::Node& n = node_->node;
  if (n && n.IsMap()) {
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      if (used_->count(k)) continue;
      if (auto it = why_unused_->find(k); it != why_unused_->end())
        throw ConfigError("config key '" + key_path(k) + "' " + it->second);
      throw ConfigError("unknown config key '" + key_path(k) + "'");
    }
  }
  for (const auto& c : *children_) c.finish();
}

void ConfigNode::apply_override(const std::string& assignment) const {
  YAML::Node root = node_->node;
  const auto eq = assignment.find('=');
  IHA_CONFIG_CHECK(eq != std::string::npos && eq > 0, "override '", assignment,
                   "': expected key=value (e.g. optim.lr=1e-3)");
  const std::string key = assignment.substr(0, eq);
  const std::string value = assignment.substr(eq + 1);
  const std::string origin = "--set " + key;
  check_shape(value, origin, key);
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError("override '" + assignment + "': cannot parse value: " + e.what());
  }
  reject_duplicate_keys(parsed, key, origin);
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) {
    IHA_CONFIG_CHECK(!p.empty(), "override '", assignment, "': empty key component");
    IHA_CONFIG_CHECK(p.size() <= ShapeCheck::kMaxKeyBytes, "override '", assignment.substr(0, 64),
                     "...': a key component of ", p.size(), " bytes (at most ",
                     ShapeCheck::kMaxKeyBytes, "): not a config key");
    parts.push_back(p);
  }
  // Walk with explicit copies: yaml-cpp node assignment rebinds, so use reset-free descent.
  std::vector<YAML::Node> chain{root};
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    YAML::Node next = chain.back()[parts[i]];
    if (!next || next.IsNull()) {
      chain.back()[parts[i]] = YAML::Node(YAML::NodeType::Map);
      next = chain.back()[parts[i]];
    }
    IHA_CONFIG_CHECK(next.IsMap(), "override '", assignment, "': '", parts[i], "' is not a mapping");
    chain.push_back(next);
  }
  chain.back()[parts.back()] = parsed;
}

std::string ConfigNode::to_yaml() const {
  YAML::Emitter out;
  out << node_->node;
  return out.c_str();
}

}  // namespace iha
