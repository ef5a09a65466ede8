#include "core/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include <yaml-cpp/yaml.h>

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
  std::ifstream in(file);
  IHA_CONFIG_CHECK(in.good(), "cannot open config file '", file, "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return from_string(ss.str(), file);
}

namespace {

// yaml-cpp keeps every entry of a mapping that repeats a key, and lookups see only the first:
// a repeated key (or section) would silently lose the later value. Refused, naming the key.
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
  YAML::Node n;
  try {
    n = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("config '" + name + "': YAML syntax error: " + e.what());
  }
  reject_duplicate_keys(n, "", name);
  if (n.IsNull()) n = YAML::Node(YAML::NodeType::Map);
  IHA_CONFIG_CHECK(n.IsMap(), "config '", name, "': the top level must be a mapping of keys");
  return ConfigNode(document_of(n), "");
}

std::string ConfigNode::key_path(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

bool ConfigNode::has(const std::string& key) const {
  const YAML::Node& n = node_->node;
  return n && n.IsMap() && n[key] && !n[key].IsNull();
}

namespace {

template <class T> const char* type_word();
template <> const char* type_word<bool>() { return "true or false"; }
template <> const char* type_word<int64_t>() { return "an integer"; }
template <> const char* type_word<int>() { return "an integer"; }
template <> const char* type_word<double>() { return "a number"; }
template <> const char* type_word<std::string>() { return "a string"; }
template <> const char* type_word<std::vector<int64_t>>() { return "a list of integers"; }

template <class T>
T convert_node(const YAML::Node& n, const std::string& key) {
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
      size_t pos = 0;
      long long v = 0;
      try {
        v = std::stoll(s, &pos, 0);
      } catch (...) {
        throw fail();
      }
      if (pos != s.size()) throw fail();
      if constexpr (std::is_same_v<T, int>) {
        if (v < INT32_MIN || v > INT32_MAX) throw fail();
      }
      return static_cast<T>(v);
    } else {
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
    IHA_CONFIG_CHECK(n.IsMap(), "config key '", key_path(key), "': expected a mapping of keys");
  } else {
    n = YAML::Node(YAML::NodeType::Map);
  }
  ConfigNode c(document_of(n), key_path(key));
  children_->push_back(c);
  return c;
}

void ConfigNode::finish() const {
  const YAML::Node& n = node_->node;
  if (n && n.IsMap()) {
    for (const auto& kv : n) {
      const std::string k = kv.first.as<std::string>();
      if (!used_->count(k)) throw ConfigError("unknown config key '" + key_path(k) + "'");
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
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError("override '" + assignment + "': cannot parse value: " + e.what());
  }
  std::vector<std::string> parts;
  std::stringstream ss(key);
  for (std::string p; std::getline(ss, p, '.');) {
    IHA_CONFIG_CHECK(!p.empty(), "override '", assignment, "': empty key component");
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
