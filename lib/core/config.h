// A strict YAML reader that names the key at fault (unknown keys, wrong types, invalid values).
// (The layer configuration it reads is attention/layer_config.h.)
// defines: iha::ConfigNode, iha::config_keys
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"

namespace iha {

// The names of the configuration's keys under `prefix` (e.g. "model."), for the messages of a
// library struct's validation: "config key 'model.H'".
inline FieldNames config_keys(std::string prefix = "") { return {"config key", std::move(prefix), {}}; }

// A YAML mapping read strictly: every key must be consumed; finish() reports the first key
// nobody asked for. Type and value errors name the full dotted key. The YAML document lives
// behind an opaque pointer, so a program that includes this header needs no yaml-cpp.
class ConfigNode {
 public:
  ConfigNode();
  static ConfigNode from_file(const std::string& file);
  static ConfigNode from_string(const std::string& text, const std::string& name = "<string>");

  bool has(const std::string& key) const;
  // Typed reads: T in {bool, int64_t, int, double, std::string, std::vector<int64_t>}.
  template <class T> T get(const std::string& key, const T& fallback) const;
  template <class T> T require(const std::string& key) const;
  template <class T> std::optional<T> optional(const std::string& key) const;
  // A nested mapping (absent key gives an empty node whose reads return fallbacks).
  ConfigNode child(const std::string& key) const;
  std::string key_path(const std::string& key) const;
  // How messages name `key` of this mapping: "config key 'a.b'".
  std::string key_name(const std::string& key) const { return "config key '" + key_path(key) + "'"; }
  const std::string& path() const { return path_; }
  // Keys this mapping knows but does not read in the configuration at hand (a setting of
  // another data kind, say): finish() names such a key present with `why` ("config key
  // 'data.pairs' <why>") instead of calling it unknown.
  void inapplicable(const std::vector<std::string>& keys, const std::string& why) const;
  // Throws ConfigError "unknown config key 'a.b'" for any key never read, recursively (or the
  // inapplicable() reason, for such a key).
  void finish() const;

  // Apply an "a.b.c=value" override (value parsed as YAML) onto this mapping, in place: every
  // copy of this node, and the children already taken from it, see the new value.
  void apply_override(const std::string& assignment) const;
  // The mapping as YAML text (what a run records as its configuration).
  std::string to_yaml() const;

  struct Document;  // the yaml-cpp node, opaque here (defined in config.cpp)

 private:
  ConfigNode(std::shared_ptr<const Document> node, std::string path);

  std::shared_ptr<const Document> node_;
  std::string path_;
  std::shared_ptr<std::set<std::string>> used_ = std::make_shared<std::set<std::string>>();
  std::shared_ptr<std::map<std::string, std::string>> why_unused_ = std::make_shared<std::map<std::string, std::string>>();
  std::shared_ptr<std::vector<ConfigNode>> children_ = std::make_shared<std::vector<ConfigNode>>();
};

}  // namespace iha
