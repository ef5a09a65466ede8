// Errors: one exception type carrying where (file:line) and why.
// defines: iha::Error, iha::ConfigError, iha::FieldNames, iha::error_text, IHA_CHECK, IHA_FAIL,
//          IHA_CONFIG_CHECK
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace iha {

// Every library failure is an iha::Error. The message names the thing at fault (config key,
// dataset, tensor, rank); what() is printed by the apps, which then exit non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// A config or input value that is invalid; apps exit with code 2 for these.
class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& msg) : Error(msg) {}
};

// How the caller of a library names the fields of a value it hands over, for the library's
// messages: the library says what is wrong with a field, the caller says where the field came
// from. The configuration module names YAML keys (config_keys("model.") in core/config.h gives
// "config key 'model.H'"), iha-layer the attributes of its file, Python the arguments of a call;
// the default names the C++ struct's fields ("field 'H'").
struct FieldNames {
  std::string noun = "field";  // singular; the plural adds an s
  std::string prefix;          // prepended to every field name
  // Fields the caller spells differently, as (field, caller's name): Python's Hkv is the
  // struct's kv_heads.
  std::vector<std::pair<std::string, std::string>> renamed;

  // The field as the caller spells it, with the prefix: "model.H".
  std::string spelled(const std::string& field) const {
    for (const auto& [f, name] : renamed)
      if (f == field) return prefix + name;
    return prefix + field;
  }
  std::string operator()(const std::string& field) const { return noun + " '" + spelled(field) + "'"; }
  // Two fields named together: "fields 'window' and 'window_virtual'".
  std::string both(const std::string& a, const std::string& b) const {
    return noun + "s '" + spelled(a) + "' and '" + spelled(b) + "'";
  }
  // The fields of a nested value: the same noun, the prefix extended by `field.`.
  FieldNames nested(const std::string& field) const { return {noun, spelled(field) + ".", {}}; }
};

// What an app prints for an exception: its what(), except where that names nothing (a
// std::bad_alloc says only "std::bad_alloc"): then what ran out and which limits apply.
std::string error_text(const std::exception& e);

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace iha

// IHA_CHECK(cond, parts...) throws iha::Error("file:line: parts...") when cond is false.
#define IHA_CHECK(cond, ...)                                                          \
  do {                                                                                \
    if (!(cond)) ::iha::detail::throw_error(__FILE__, __LINE__,                       \
                                            ::iha::detail::concat(__VA_ARGS__));      \
  } while (0)
#define IHA_FAIL(...) ::iha::detail::throw_error(__FILE__, __LINE__, ::iha::detail::concat(__VA_ARGS__))

// IHA_CONFIG_CHECK(cond, parts...) throws iha::ConfigError(parts...): bad user input, where the
// message itself names the key or file at fault and a source location would only be noise.
#define IHA_CONFIG_CHECK(cond, ...)                                                   \
  do {                                                                                \
    if (!(cond)) throw ::iha::ConfigError(::iha::detail::concat(__VA_ARGS__));        \
  } while (0)
