// Tensor: shape, dtype, device; contiguous row-major; owning or view. No autograd: layers
// have explicit forward and backward (as in llm.c) and take tensors or raw typed pointers.
// defines: iha::DType, iha::Device, iha::Shape, iha::Tensor, iha::dtype_of<T>, iha::DTypeOf<T>,
//          iha::dtype_size, iha::dtype_name, iha::parse_dtype, iha::is_floating, iha::device_name,
//          iha::shape_numel, iha::shape_str, iha::DeviceAllocator, iha::register_device_allocator,
//          iha::has_device, iha::convert_elements
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/bf16.h"
#include "core/error.h"

namespace iha {

// Floating types for compute; integer types for token data, indices and flags.
enum class DType : uint8_t { f32, f64, bf16, i32, i64, u8 };
enum class Device : uint8_t { cpu, cuda };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType parse_dtype(const std::string& name);  // "f32"|"float32", "f64"|"float64", "bf16", ...
bool is_floating(DType t);
const char* device_name(Device d);

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::f32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::f64; };
template <> struct DTypeOf<bf16> { static constexpr DType value = DType::bf16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::i32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::i64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::u8; };
template <class T> constexpr DType dtype_of() { return DTypeOf<T>::value; }

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// Device memory comes from an allocator the CUDA library registers at load time; a CPU-only
// build has none, and creating a cuda tensor there is an error.
struct DeviceAllocator {
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> free;
  std::function<void(void* dst, Device dst_device, const void* src, Device src_device,
                     size_t bytes)> copy;
  std::function<void(void* dst, size_t bytes)> zero;
};
void register_device_allocator(Device d, DeviceAllocator a);
bool has_device(Device d);

// n host elements of dtype `from` at src into dtype `to` at dst: floats widen exactly and
// narrow to the nearest (ties to even; f64 -> bf16 rounds once, not through f32); integers
// widen (i32 -> i64, u8 -> i32/i64). Any other pair is an Error naming both dtypes.
void convert_elements(DType from, DType to, const void* src, void* dst, int64_t n);

class Tensor {
 public:
  Tensor() = default;
  // Owning, zero-filled.
  Tensor(Shape shape, DType dtype, Device device = Device::cpu);
  // Owning, contents undefined: for buffers whose every element is written before it is read
  // (no fill pass over memory the first writer overwrites anyway).
  static Tensor uninitialized(Shape shape, DType dtype, Device device = Device::cpu);
  // Non-owning view of memory the caller keeps alive.
  static Tensor view(void* data, Shape shape, DType dtype, Device device = Device::cpu);

  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  bool defined() const { return data_ != nullptr || numel_ == 0; }
  bool owning() const { return static_cast<bool>(storage_); }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  // Typed access; throws if T does not match the dtype.
  template <class T> T* data() {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(data_);
  }
  template <class T> const T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<const T*>(data_);
  }

  // View of rows [begin, end) of the first dimension.
  Tensor slice(int64_t begin, int64_t end) const;
  // View with another shape of the same numel.
  Tensor reshape(Shape shape) const;
  // Deep copy (same device).
  Tensor clone() const;
  // Copy into another dtype (CPU only), rounding when narrowing (floating types only;
  // convert_elements).
  Tensor to(DType dtype) const;
  // Copy to another device.
  Tensor to(Device device) const;
  void zero();
  // Copies all elements from src, which must have the same numel, dtype and device.
  void copy_from(const Tensor& src);

 private:
  void check_dtype(DType want) const;
  Tensor(Shape shape, DType dtype, Device device, bool zero);
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  Device device_ = Device::cpu;
};

}  // namespace iha
