// A byte buffer for shipping small structures (catalogs, registries, shapes) between ranks
// in one broadcast, and for canonical digests of metadata. Internal to lib/checkpoint.
// defines: iha::ckpt::BlobWriter, iha::ckpt::BlobReader
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"

namespace iha::ckpt {

class BlobWriter {
 public:
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(const std::string& s) {
    u64(s.size());
    raw(s.data(), s.size());
  }
  template <class T> void vec(const std::vector<T>& v) {
    static_assert(sizeof(T) == 8, "8-byte elements only");
    u64(v.size());
    raw(v.data(), v.size() * 8);
  }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
  }
  std::vector<uint8_t>& bytes() { return bytes_; }

 private:
  std::vector<uint8_t> bytes_;
};

class BlobReader {
 public:
  explicit BlobReader(const std::vector<uint8_t>& b) : b_(b) {}
  uint64_t u64() { uint64_t v; raw(&v, 8); return v; }
  int64_t i64() { int64_t v; raw(&v, 8); return v; }
  double f64() { double v; raw(&v, 8); return v; }
  std::string str() {
    const uint64_t n = u64();
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  template <class T> std::vector<T> vec() {
    const uint64_t n = u64();
    need(n * 8);
    std::vector<T> v(n);
    raw(v.data(), n * 8);
    return v;
  }
  void raw(void* p, size_t n) {
    need(n);
    std::memcpy(p, b_.data() + pos_, n);
    pos_ += n;
  }

 private:
  void need(uint64_t n) const {
    IHA_CHECK(n <= b_.size() - pos_, "internal: truncated message between ranks");
  }
  const std::vector<uint8_t>& b_;
  size_t pos_ = 0;
};

}  // namespace iha::ckpt
