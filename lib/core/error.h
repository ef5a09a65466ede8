// Errors: one exception type carrying where (file:line) and why.
// defines: iha::Error, iha::ConfigError, iha::error_text, IHA_CHECK, IHA_FAIL, IHA_CONFIG_CHECK
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

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
