#include "core/tensor.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>

namespace iha {

namespace {

// A layer allocates and frees tens of MiB of activations per step. With glibc's defaults the
// freed memory goes back to the kernel (munmap of blocks over the dynamic mmap threshold, trim
// of the heap top) and every step faults the same pages in again: at N = 2048 that was the
// largest cost of a layer outside attention and the GEMMs (page faults, zeroing and unmapping
// in the kernel; bench/attention BM_layer_parts, docs/benchmarks.md). Blocks up to 32 MiB
// (glibc's own ceiling for the dynamic threshold) therefore come from the heap, and up to 1 GiB
// of free heap top is kept for the next step; what is in use is unchanged (mallinfo2, the
// memory benchmarks). A process that sets glibc's malloc tunables itself keeps them.
void keep_host_heap() {
#if defined(__GLIBC__)
  for (const char* v : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"})
    if (std::getenv(v)) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

}  // namespace

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::bf16: return "bf16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::u8: return "u8";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "float32") return DType::f32;
  if (name == "f64" || name == "float64") return DType::f64;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "i32" || name == "int32") return DType::i32;
  if (name == "i64" || name == "int64") return DType::i64;
  if (name == "u8" || name == "uint8") return DType::u8;
  throw ConfigError("unknown dtype '" + name + "' (expected f32, f64, bf16, i32, i64 or u8)");
}

bool is_floating(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16; }

const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t e : s) {
    IHA_CHECK(e >= 0, "negative extent in shape ", shape_str(s));
    n *= e;
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

namespace {
// Built on first use: the CUDA library registers from a static initialiser, which may run
// before this file's globals would have been constructed.
struct AllocatorRegistry {
  std::mutex mu;
  DeviceAllocator cuda;
  bool have_cuda = false;
};
AllocatorRegistry& registry() {
  static AllocatorRegistry r;
  return r;
}

const DeviceAllocator& cuda_allocator() {
  AllocatorRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  IHA_CHECK(r.have_cuda, "no CUDA device allocator: this build or process has no GPU support");
  return r.cuda;
}
}  // namespace

void register_device_allocator(Device d, DeviceAllocator a) {
  IHA_CHECK(d == Device::cuda, "only a cuda allocator can be registered");
  AllocatorRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.cuda = std::move(a);
  r.have_cuda = true;
}

bool has_device(Device d) {
  if (d == Device::cpu) return true;
  AllocatorRegistry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.have_cuda;
}

Tensor::Tensor(Shape shape, DType dtype, Device device) : Tensor(std::move(shape), dtype, device, true) {}

Tensor Tensor::uninitialized(Shape shape, DType dtype, Device device) {
  return Tensor(std::move(shape), dtype, device, false);
}

Tensor::Tensor(Shape shape, DType dtype, Device device, bool zero)
    : shape_(std::move(shape)), dtype_(dtype), device_(device) {
  numel_ = shape_numel(shape_);
  const size_t bytes = nbytes();
  if (device_ == Device::cpu) {
    static std::once_flag heap_configured;
    std::call_once(heap_configured, keep_host_heap);
    // 64-byte alignment for vector loads; calloc-like zero fill.
    const size_t padded = ((bytes + 63) / 64) * 64;
    void* p = padded ? std::aligned_alloc(64, padded) : nullptr;
    IHA_CHECK(padded == 0 || p != nullptr, "out of host memory allocating ", bytes, " bytes for ",
              dtype_name(dtype_), shape_str(shape_));
    if (p && zero) std::memset(p, 0, padded);
    storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    const DeviceAllocator& a = cuda_allocator();
    void* p = bytes ? a.alloc(bytes) : nullptr;
    if (p && zero) a.zero(p, bytes);
    auto free_fn = a.free;
    storage_ = std::shared_ptr<void>(p, [free_fn](void* q) { if (q) free_fn(q); });
  }
  data_ = storage_.get();
}

Tensor Tensor::view(void* data, Shape shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.numel_ = shape_numel(t.shape_);
  t.dtype_ = dtype;
  t.device_ = device;
  t.data_ = data;
  IHA_CHECK(data != nullptr || t.numel_ == 0, "view of null memory with shape ", shape_str(t.shape_));
  return t;
}

int64_t Tensor::dim(int i) const {
  IHA_CHECK(i >= 0 && i < ndim(), "dimension ", i, " out of range for shape ", shape_str(shape_));
  return shape_[i];
}

void Tensor::check_dtype(DType want) const {
  IHA_CHECK(want == dtype_, "tensor holds ", dtype_name(dtype_), ", accessed as ", dtype_name(want));
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  IHA_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
            "slice [", begin, ", ", end, ") out of range for shape ", shape_str(shape_));
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.numel_ = shape_numel(t.shape_);
  const int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  IHA_CHECK(shape_numel(shape) == numel_, "cannot reshape ", shape_str(shape_), " to ",
            shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::clone() const {
  Tensor t(shape_, dtype_, device_);
  t.copy_from(*this);
  return t;
}

void Tensor::zero() {
  if (nbytes() == 0) return;
  if (device_ == Device::cpu) std::memset(data_, 0, nbytes());
  else cuda_allocator().zero(data_, nbytes());
}

void Tensor::copy_from(const Tensor& src) {
  IHA_CHECK(src.numel_ == numel_ && src.dtype_ == dtype_, "copy_from: ", dtype_name(src.dtype_),
            shape_str(src.shape_), " into ", dtype_name(dtype_), shape_str(shape_));
  if (nbytes() == 0) return;
  if (device_ == Device::cpu && src.device_ == Device::cpu) {
    std::memcpy(data_, src.data_, nbytes());
  } else {
    cuda_allocator().copy(data_, device_, src.data_, src.device_, nbytes());
  }
}

namespace {
template <class To, class From>
To convert_one(From x) {
  if constexpr (std::is_same_v<To, bf16>) {
    if constexpr (std::is_same_v<From, double>) {
      // Round to odd into float, then to nearest even into bf16: one correct rounding.
      float f = static_cast<float>(x);
      if (static_cast<double>(f) != x && !std::isnan(x)) {
        if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
        uint32_t u;
        std::memcpy(&u, &f, 4);
        u |= 1u;
        std::memcpy(&f, &u, 4);
      }
      return bf16::from_float(f);
    } else {
      return bf16::from_float(static_cast<float>(x));
    }
  } else if constexpr (std::is_same_v<From, bf16>) {
    return static_cast<To>(x.to_float());
  } else {
    return static_cast<To>(x);
  }
}

template <class To, class From>
void convert_typed(const void* src, void* dst, int64_t n) {
  const From* s = static_cast<const From*>(src);
  To* d = static_cast<To*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = convert_one<To, From>(s[i]);
}
}  // namespace

void convert_elements(DType from, DType to, const void* src, void* dst, int64_t n) {
#define IHA_CONV(F, T, CF, CT) \
  if (from == F && to == T) return convert_typed<CT, CF>(src, dst, n);
  IHA_CONV(DType::bf16, DType::f32, bf16, float)
  IHA_CONV(DType::bf16, DType::f64, bf16, double)
  IHA_CONV(DType::f32, DType::f64, float, double)
  IHA_CONV(DType::f64, DType::f32, double, float)
  IHA_CONV(DType::f64, DType::bf16, double, bf16)
  IHA_CONV(DType::f32, DType::bf16, float, bf16)
  IHA_CONV(DType::i32, DType::i64, int32_t, int64_t)
  IHA_CONV(DType::u8, DType::i32, uint8_t, int32_t)
  IHA_CONV(DType::u8, DType::i64, uint8_t, int64_t)
#undef IHA_CONV
  IHA_FAIL("no conversion from ", dtype_name(from), " to ", dtype_name(to));
}

Tensor Tensor::to(DType dtype) const {
  IHA_CHECK(device_ == Device::cpu, "dtype conversion runs on the host only");
  IHA_CHECK((is_floating(dtype) && is_floating(dtype_)) || dtype == dtype_, "conversion from ",
            dtype_name(dtype_), " to ", dtype_name(dtype), " is not supported");
  if (dtype == dtype_) return clone();
  Tensor t(shape_, dtype, Device::cpu);
  convert_elements(dtype_, dtype, data_, t.data_, numel_);
  return t;
}

Tensor Tensor::to(Device device) const {
  Tensor t(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

}  // namespace iha
