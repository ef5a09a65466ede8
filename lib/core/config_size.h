// Sizes computed from config values with every operation checked: an overflow is a
// ConfigError naming the key (or field) whose value made it too large, never a wrapped size.
//
//   ConfigSize n(cfg.seq_len, "sequence.length"), D(cfg.model.D, "model.D");
//   const int64_t elems = (n * D * ConfigSize(4)).value();   // throws on overflow
// defines: iha::ConfigSize
#pragma once

#include <cstdint>
#include <string>

#include "core/error.h"

namespace iha {

class ConfigSize {
 public:
  // A constant (no key).
  explicit ConfigSize(int64_t v) : v_(v) {}
  // The value of config key `key`; must be >= 0 (validated where it was read).
  ConfigSize(int64_t v, const std::string& key) : ConfigSize(v, FieldNames{"config key", "", {}}, key) {}
  // The value of field `field` as its caller names it (core/error.h's FieldNames).
  ConfigSize(int64_t v, const FieldNames& names, const std::string& field)
      : v_(v), expr_(names.spelled(field)), key_(names.spelled(field)), name_(names(field)), key_value_(v) {}

  int64_t value() const { return v_; }
  // The product or sum spelled in keys, e.g. "model.D * model.ffn".
  const std::string& expr() const { return expr_; }
  // The key with the largest value among the factors (the one to blame).
  const std::string& key() const { return key_; }

  friend ConfigSize operator*(const ConfigSize& a, const ConfigSize& b) {
    ConfigSize r = combine(a, b, " * ");
    if (__builtin_mul_overflow(a.v_, b.v_, &r.v_)) overflow(r);
    return r;
  }
  friend ConfigSize operator+(const ConfigSize& a, const ConfigSize& b) {
    ConfigSize r = combine(a, b, " + ");
    if (__builtin_add_overflow(a.v_, b.v_, &r.v_)) overflow(r);
    return r;
  }
  // Rounded-up quotient (d > 0).
  friend ConfigSize ceil_div(const ConfigSize& a, const ConfigSize& d) {
    ConfigSize r = combine(a, d, " / ");
    r.v_ = d.v_ > 0 ? a.v_ / d.v_ + (a.v_ % d.v_ != 0) : 0;
    return r;
  }

 private:
  static ConfigSize combine(const ConfigSize& a, const ConfigSize& b, const char* op) {
    ConfigSize r(0);
    const std::string ea = a.expr_.empty() ? std::to_string(a.v_) : a.expr_;
    const std::string eb = b.expr_.empty() ? std::to_string(b.v_) : b.expr_;
    r.expr_ = "(" + ea + op + eb + ")";
    const bool take_a = !a.key_.empty() && (b.key_.empty() || a.key_value_ >= b.key_value_);
    r.key_ = take_a ? a.key_ : b.key_;
    r.key_value_ = take_a ? a.key_value_ : b.key_value_;
    r.name_ = take_a ? a.name_ : b.name_;
    return r;
  }
  [[noreturn]] static void overflow(const ConfigSize& r) {
    throw ConfigError(r.name_ + " = " + std::to_string(r.key_value_) +
                      " is too large: the size " + r.expr_ + " does not fit in 64 bits");
  }

  int64_t v_ = 0;
  std::string expr_;
  std::string key_;
  std::string name_;  // key_ as messages name it, e.g. "config key 'model.D'"
  int64_t key_value_ = 0;
};

}  // namespace iha
