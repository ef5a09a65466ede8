// iha._iha: the Python door to the library (DESIGN.md section 14). A thin layer: tensors
// arrive through DLPack (torch, numpy, anything with __dlpack__) and are read and written in
// place; every check names the argument at fault and raises a Python exception, never aborts.
// Autograd, modules and the layout helper's Python face live in the pure-Python package.
#include <mpi.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attention/layer.h"
#include "core/config_size.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/tensor.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"
#include "parallel/mpi_handle.h"
#include "parallel/plan.h"
#include "ringattn/ringattn.h"
#if IHA_HAVE_CUDA
#include <cuda_runtime.h>
#include <pybind11/numpy.h>

#include "attention/backend_cuda.h"
#include "core/cuda_device.h"
#include "parallel/nccl_comm.h"
#endif

namespace py = pybind11;

namespace {

// ---- DLPack: the C ABI (dlpack.h, version 0.x, which torch 1.13 and numpy 1.24 export).
struct DLDevice {
  int32_t device_type;  // 1 = CPU, 2 = CUDA
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor*);
};

// An argument's memory, borrowed for one call: the capsule keeps the exporter's view alive and
// is never consumed, so the exporter still owns (and frees) the memory.
struct Arg {
  py::object capsule;
  void* data = nullptr;
  iha::DType dtype = iha::DType::f64;
  iha::Device device = iha::Device::cpu;
  iha::Shape shape;
  std::string name;
  int64_t numel() const { return iha::shape_numel(shape); }
};

[[noreturn]] void arg_error(const std::string& name, const std::string& why) {
  throw py::value_error("argument '" + name + "': " + why);
}

const char* device_word(iha::Device d) { return d == iha::Device::cuda ? "cuda" : "cpu"; }

// want: the device the caller computes on (nullopt: any, for data_pointer). A CUDA tensor is
// exported with stream=1 (DLPack's legacy default stream, where the CUDA backend queues its
// work), so the producer makes that stream wait for the work it has queued on its own.
Arg borrow(py::handle obj, const std::string& name, std::optional<iha::Device> want = iha::Device::cpu) {
  if (obj.is_none()) arg_error(name, "is None; a tensor is required");
  if (!py::hasattr(obj, "__dlpack__"))
    throw py::type_error("argument '" + name + "': expected a tensor (an object with __dlpack__, e.g. torch.Tensor "
                         "or numpy.ndarray), got " + std::string(py::str(obj.get_type().attr("__name__"))));
  Arg a;
  a.name = name;
  try {
    int32_t type = 1;
    if (py::hasattr(obj, "__dlpack_device__")) type = obj.attr("__dlpack_device__")().cast<py::tuple>()[0].cast<int32_t>();
    a.capsule = type == 2 ? obj.attr("__dlpack__")(py::arg("stream") = 1) : obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    arg_error(name, std::string("cannot be exported through DLPack (a strided, dense tensor is required): ") + e.what());
  }
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(a.capsule.ptr(), "dltensor"));
  if (m == nullptr) {
    PyErr_Clear();
    arg_error(name, "its __dlpack__ did not return a DLPack capsule");
  }
  const DLTensor& t = m->dl_tensor;
  if (t.device.device_type != 1 && t.device.device_type != 2)
    arg_error(name, "is on a device other than the CPU or a CUDA GPU (DLPack device type " +
                        std::to_string(t.device.device_type) + ")");
  const iha::Device got = t.device.device_type == 2 ? iha::Device::cuda : iha::Device::cpu;
  a.device = got;
  if (want && got != *want)
    arg_error(name, std::string("is a ") + (got == iha::Device::cuda ? "CUDA" : "CPU") +
                        " tensor; this computes on " + device_word(*want) + " tensors (a Core's device argument)");
#if IHA_HAVE_CUDA
  if (got == iha::Device::cuda && want) {
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess || current != t.device.device_id)
      arg_error(name, "is on CUDA device " + std::to_string(t.device.device_id) + "; the library computes on device " +
                          std::to_string(current) + " (torch.cuda.set_device before building the Core)");
  }
#endif
  if (t.dtype.lanes != 1 || t.dtype.code != 2 || (t.dtype.bits != 32 && t.dtype.bits != 64))
    arg_error(name, "has dtype code " + std::to_string(t.dtype.code) + " of " + std::to_string(t.dtype.bits) +
                        " bits; expected float32 or float64");
  a.dtype = t.dtype.bits == 64 ? iha::DType::f64 : iha::DType::f32;
  a.shape.assign(t.shape, t.shape + t.ndim);
  // An empty tensor has no element to misplace: any strides will do (torch gives odd ones).
  if (t.strides != nullptr && iha::shape_numel(a.shape) != 0) {
    int64_t expect = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      if (t.shape[i] != 1 && t.strides[i] != expect)
        arg_error(name, "is not contiguous (row-major); call .contiguous() first");
      expect *= t.shape[i];
    }
  }
  a.data = static_cast<char*>(t.data) + t.byte_offset;
  return a;
}

void expect_shape(const Arg& a, const iha::Shape& want, const std::string& meaning) {
  if (a.shape != want)
    arg_error(a.name, "has shape " + iha::shape_str(a.shape) + "; expected " + iha::shape_str(want) + " = " + meaning);
}

void expect_dtype(const Arg& a, iha::DType want) {
  if (a.dtype != want)
    arg_error(a.name, std::string("has dtype ") + iha::dtype_name(a.dtype) + "; expected " + iha::dtype_name(want) +
                          " (the core's dtype)");
}

iha::Tensor view(const Arg& a) { return iha::Tensor::view(a.data, a.shape, a.dtype, a.device); }

// ---- sizes: every product of arguments checked (core/config_size.h: an overflow is a
// ConfigError, a ValueError here, naming the argument), and what a call would allocate refused
// up front when it exceeds the memory this process can get.
const iha::FieldNames kArguments{"argument", "", {{"kv_heads", "Hkv"}}};
using Size = iha::ConfigSize;
Size arg_size(int64_t v, const std::string& name) { return Size(v, kArguments, name); }

// Refuses `need` (a lower bound of what `what` allocates) when it exceeds the memory
// available, naming the argument with the largest share.
void check_fits_memory(const Size& need, const std::string& what) {
  if (need.value() < (int64_t{64} << 20)) return;  // small: not worth reading /proc on every call
  const int64_t avail = iha::available_memory();
  if (need.value() > avail)
    throw py::value_error(std::string("argument '") + need.key() + "': " + what + " needs at least " +
                          iha::format_gib(need.value()) + " (" + need.expr() + " bytes), more than the " + iha::format_gib(avail) +
                          " this process can get");
}

iha::SegmentStarts segments_from(const py::object& o) {
  if (o.is_none()) return {};
  return o.cast<iha::SegmentStarts>();
}

// The library's segment check, as a ValueError (it is the caller's input).
void check_segments(const iha::SegmentStarts& seg, int64_t B, int64_t N) {
  if (!seg.empty() && static_cast<int64_t>(seg.size()) != B)
    arg_error("segments", "has " + std::to_string(seg.size()) + " lists; expected one per sequence (B = " +
                              std::to_string(B) + ")");
  try {
    iha::check_segment_starts(seg, seg.empty() ? 0 : B, N, "argument 'segments'");
  } catch (const iha::Error& e) {
    throw py::value_error(e.what());
  }
}

// ---- communicators

struct Comm {
  std::shared_ptr<iha::Communicator> c;
};

Comm comm_from_address(uintptr_t address, int expected_size) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) throw py::value_error("argument 'comm': MPI is not initialised (import mpi4py.MPI first)");
  MPI_Comm raw;
  std::memcpy(&raw, reinterpret_cast<const void*>(address), sizeof raw);
  Comm out{iha::make_mpi_communicator(raw)};
  if (out.c->size() != expected_size)
    throw py::value_error("argument 'comm': mpi4py reports " + std::to_string(expected_size) +
                          " ranks but this library's MPI sees " + std::to_string(out.c->size()) +
                          " (mpi4py and the library were built against different MPI libraries)");
  return out;
}

// ---- cores

struct CoreCacheHandle {
  std::unique_ptr<iha::CoreCache> cache;
  int64_t B = 0;
};

// The backend of a Core on `device`: null (the CPU backend of the core's dtype) or the CUDA
// backend computing in float32, the one device dtype the Python route exchanges.
std::shared_ptr<const iha::Backend> backend_for(iha::Device device, iha::DType dtype) {
  if (device == iha::Device::cpu) return nullptr;
#if IHA_HAVE_CUDA
  if (dtype != iha::DType::f32)
    throw py::value_error("argument 'dtype': the CUDA backend computes in float32, got float64");
  if (iha::cuda_device_count() < 1)
    throw py::value_error("argument 'device': 'cuda', but no CUDA device is visible to this process");
  return iha::cuda_backend(iha::DType::f32);
#else
  (void)dtype;
  throw py::value_error("argument 'device': 'cuda' needs the library built with its CUDA backend (IHA_CUDA=ON); "
                        "this build has none");
#endif
}

std::string named(const std::string& arg, const std::function<std::string()>& parse) {
  try {
    return parse();
  } catch (const iha::Error& e) {
    throw py::value_error("argument '" + arg + "': " + e.what());
  }
}

// Every local check of a Core's arguments, before anything is built or exchanged (iha.torch
// runs it on every rank and agrees on the verdict before the collective construction):
// the config, N, sizes (checked products; the RoPE tables and token lists the core allocates
// must fit in the memory available), dtype, device (and its backend), layout, scheme, the
// head ranks against the communicator size (comm_size 0: no communicator).
struct CoreArgs {
  iha::DType dtype;
  iha::Device device;
  iha::LayoutKind layout;
};
CoreArgs check_core_args(const iha::LayerConfig& cfg, int64_t N, const std::string& dtype, const std::string& layout,
                         const std::string& scheme, int64_t head_ranks, int64_t ring_pieces, const std::string& device,
                         int64_t comm_size) {
  cfg.validate(kArguments);
  if (N < 1) throw py::value_error("argument 'N': the sequence length must be >= 1, got " + std::to_string(N));
  CoreArgs out;
  out.dtype = iha::parse_dtype(dtype);
  if (out.dtype != iha::DType::f32 && out.dtype != iha::DType::f64)
    throw py::value_error("argument 'dtype': expected float32 or float64, got " + dtype);
  if (device != "cpu" && device != "cuda")
    throw py::value_error("argument 'device': expected 'cpu' or 'cuda', got '" + device + "'");
  out.device = device == "cuda" ? iha::Device::cuda : iha::Device::cpu;
  // RoPE tables (cos and sin of N*P positions, d/2 each, in float64 at most) and the token
  // lists (several int64 per token): what building the core allocates, at least.
  const Size n = arg_size(N, "N"), P = arg_size(cfg.P, "P"), d = arg_size(cfg.d, "d");
  check_fits_memory(n * P * d * Size(8) + n * Size(32), "a core of N tokens");
  named("layout", [&] { out.layout = iha::parse_layout(layout); return std::string(); });
  named("scheme", [&] { iha::parse_scheme(scheme); return std::string(); });
  if (comm_size > 0) {
    if (head_ranks < 1 || comm_size % head_ranks != 0)
      throw py::value_error("argument 'head_ranks': " + std::to_string(head_ranks) +
                            " does not divide the communicator size " + std::to_string(comm_size));
    if (ring_pieces < 1)
      throw py::value_error("argument 'ring_pieces': must be >= 1, got " + std::to_string(ring_pieces));
  }
  return out;
}

// What one forward (backward: twice that) allocates for a batch of B sequences of n local
// tokens, at least: the mixed and rotated q, k, v, the output before the collapse (H + 2 Hkv
// + H rows of n*P*d) and the row log-sum-exps.
Size pass_bytes(const iha::LayerConfig& cfg, int64_t B, int64_t n, int64_t elem) {
  const Size b = arg_size(B, "q"), nn = arg_size(n, "N"), P = arg_size(cfg.P, "P"), d = arg_size(cfg.d, "d");
  const Size rows = arg_size(cfg.H, "H") * Size(2) + arg_size(cfg.kv_heads(), "kv_heads") * Size(2);
  return b * nn * P * (rows * d * Size(elem) + arg_size(cfg.H, "H") * Size(8));
}

// One attention core of either dtype: local, sequence-parallel (ring for global layers, halo
// for window layers) or head x sequence parallel (Ulysses, 2D), on the CPU or (float32) on
// the CUDA backend, reading and writing the callers' tensors on that device in place.
class Core {
 public:
  Core(const iha::LayerConfig& cfg, int64_t N, const std::string& dtype, const Comm* comm,
       const std::string& layout, const std::string& scheme, int64_t head_ranks, int64_t ring_pieces,
       const std::string& device)
      : cfg_(cfg), N_(N) {
    const CoreArgs args = check_core_args(cfg_, N, dtype, layout, scheme, head_ranks, ring_pieces, device,
                                          comm == nullptr ? 0 : comm->c->size());
    dtype_ = args.dtype;
    device_ = args.device;
    const auto be = backend_for(device_, dtype_);
    kind_ = args.layout;
    if (comm == nullptr) {
      tokens_.resize(N);
      for (int64_t n = 0; n < N; ++n) tokens_[n] = n;
      if (be)
        c32_ = iha::make_local_core<float>(cfg_, N, be);
      else if (dtype_ == iha::DType::f64)
        c64_ = iha::make_local_core<double>(cfg_, N);
      else
        c32_ = iha::make_local_core<float>(cfg_, N);
      return;
    }
    const int64_t R = comm->c->size();
    if (head_ranks < 1 || R % head_ranks != 0)
      throw py::value_error("argument 'head_ranks': " + std::to_string(head_ranks) +
                            " does not divide the communicator size " + std::to_string(R));
    iha::MeshShape shape;
    shape.hp = head_ranks;
    shape.sp = R / head_ranks;
    std::shared_ptr<iha::Communicator> world = comm->c;
#if IHA_HAVE_CUDA
    // The device communicator (NCCL with a GPU per rank, else host staging over MPI), as the
    // trainer makes it; it selects this rank's GPU.
    if (be) world = iha::make_device_world(world);
#endif
    mesh_ = std::make_unique<iha::ProcessMesh>(world, shape);
    auto groups = iha::ReplicaGroups::from(*mesh_);
    const auto sch = iha::parse_scheme(scheme);
    iha::SeqParallelOptions opt(kind_);
    opt.ring_pieces = ring_pieces;
    opt.backend = be;
    if (dtype_ == iha::DType::f64)
      c64_ = iha::make_replica_core<double>(cfg_, N, groups, sch, opt);
    else
      c32_ = iha::make_replica_core<float>(cfg_, N, groups, sch, opt);
    tokens_ = iha::replica_token_map(kind_, N, groups.S, groups.T)[groups.sp_index * groups.T + groups.hp_index];
  }

  int64_t local_tokens() const { return c64_ ? c64_->local_tokens() : c32_->local_tokens(); }
  const std::vector<int64_t>& tokens() const { return tokens_; }
  const iha::LayerConfig& config() const { return cfg_; }
  std::string dtype() const { return iha::dtype_name(dtype_); }
  std::string device() const { return device_word(device_); }

  void set_token_map(const std::vector<std::vector<int64_t>>& parts) {
    if (c64_) c64_->set_token_map(parts); else c32_->set_token_map(parts);
    // The rank's part: in the replica numbering (sequence index s, head index t -> s*T + t).
    const int64_t part = mesh_ ? mesh_->sp_index() * mesh_->shape().head_group() + mesh_->head_index() : 0;
    tokens_ = parts.at(static_cast<size_t>(part));
  }

  // Every local check of a forward call (no computing, no exchange): what forward checks
  // before it starts, for iha.torch's agreement across ranks.
  void check_forward(py::handle q, py::handle k, py::handle v, py::handle aq, py::handle ak, py::handle av,
                     py::handle c, const py::object& segments, bool backward) {
    Arg aq_, ak_, av_, c_;
    Arg q_ = take(q, "q"), k_ = take(k, "k"), v_ = take(v, "v");
    const int64_t B = check_qkv(q_, k_, v_);
    mix_args(aq, ak, av, c, aq_, ak_, av_, c_);
    check_segments(segments_from(segments), B, N_);
    check_pass_memory(B, backward);
  }

  std::shared_ptr<CoreCacheHandle> forward(py::handle q, py::handle k, py::handle v, py::handle aq, py::handle ak,
                                           py::handle av, py::handle c, py::handle out, const py::object& segments) {
    Arg aq_, ak_, av_, c_;
    Arg q_ = take(q, "q"), k_ = take(k, "k"), v_ = take(v, "v"), o_ = take(out, "out");
    const int64_t B = check_qkv(q_, k_, v_);
    expect_shape(o_, q_.shape, "[B, n_local, H*d] (like q)");
    expect_dtype(o_, dtype_);
    mix_args(aq, ak, av, c, aq_, ak_, av_, c_);
    auto seg = segments_from(segments);
    check_pass_memory(B, false);
    auto h = std::make_shared<CoreCacheHandle>();
    h->B = B;
    if (c64_) run_forward(*c64_, B, q_, k_, v_, aq_, ak_, av_, c_, o_, seg, *h);
    else run_forward(*c32_, B, q_, k_, v_, aq_, ak_, av_, c_, o_, seg, *h);
    return h;
  }

  void backward(CoreCacheHandle& h, py::handle q, py::handle k, py::handle v, py::handle dout, py::handle aq,
                py::handle ak, py::handle av, py::handle c, py::handle dq, py::handle dk, py::handle dv, py::handle daq,
                py::handle dak, py::handle dav, py::handle dc) {
    if (!h.cache) throw py::value_error("argument 'cache': already consumed (one backward per forward)");
    Arg q_ = take(q, "q"), k_ = take(k, "k"), v_ = take(v, "v"), g_ = take(dout, "dout");
    Arg dq_ = take(dq, "dq"), dk_ = take(dk, "dk"), dv_ = take(dv, "dv");
    const int64_t B = check_qkv(q_, k_, v_);
    if (B != h.B) arg_error("q", "batch " + std::to_string(B) + " differs from the forward's " + std::to_string(h.B));
    check_pass_memory(B, true);
    expect_shape(g_, q_.shape, "[B, n_local, H*d] (like q)");
    expect_shape(dq_, q_.shape, "q's shape");
    expect_shape(dk_, k_.shape, "k's shape");
    expect_shape(dv_, v_.shape, "v's shape");
    for (const Arg* a : {&g_, &dq_, &dk_, &dv_}) expect_dtype(*a, dtype_);
    Arg aq_, ak_, av_, c_, daq_, dak_, dav_, dc_;
    mix_args(aq, ak, av, c, aq_, ak_, av_, c_);
    if (cfg_.mixing) {
      daq_ = take(daq, "daq"), dak_ = take(dak, "dak"), dav_ = take(dav, "dav"), dc_ = take(dc, "dc");
      expect_shape(daq_, aq_.shape, "aq's shape");
      expect_shape(dak_, ak_.shape, "ak's shape");
      expect_shape(dav_, av_.shape, "av's shape");
      expect_shape(dc_, c_.shape, "c's shape");
      for (const Arg* a : {&daq_, &dak_, &dav_, &dc_}) expect_dtype(*a, dtype_);
    }
    if (c64_) run_backward(*c64_, h, q_, k_, v_, g_, aq_, ak_, av_, c_, dq_, dk_, dv_, daq_, dak_, dav_, dc_);
    else run_backward(*c32_, h, q_, k_, v_, g_, aq_, ak_, av_, c_, dq_, dk_, dv_, daq_, dak_, dav_, dc_);
  }

  // Sums the named gradients (in place) over the ranks sharing this layer's sequences, by the
  // core's own rule (sequence group; head and sequence groups under Ulysses).
  void reduce_gradients(const py::dict& grads) {
    std::vector<Arg> args;
    for (auto item : grads) args.push_back(take(item.second, py::str(item.first)));
    for (const Arg& a : args) expect_dtype(a, dtype_);
    if (c64_) run_reduce(*c64_, args); else run_reduce(*c32_, args);
  }

 private:
  Arg take(py::handle obj, const std::string& name) const { return borrow(obj, name, device_); }

  void check_pass_memory(int64_t B, bool backward) const {
    const Size need = pass_bytes(cfg_, B, local_tokens(), dtype_ == iha::DType::f64 ? 8 : 4) *
                      Size(backward ? 2 : 1);
    if (device_ == iha::Device::cpu) check_fits_memory(need, backward ? "the backward pass" : "the forward pass");
  }

  int64_t check_qkv(const Arg& q, const Arg& k, const Arg& v) const {
    if (q.shape.size() != 3) arg_error("q", "has shape " + iha::shape_str(q.shape) + "; expected [B, n_local, H*d]");
    const int64_t B = q.shape[0], n = local_tokens();
    expect_shape(q, {B, n, cfg_.H * cfg_.d}, "[B, n_local, H*d]");
    expect_shape(k, {B, n, cfg_.kv_heads() * cfg_.d}, "[B, n_local, Hkv*d]");
    expect_shape(v, {B, n, cfg_.kv_heads() * cfg_.d}, "[B, n_local, Hkv*d]");
    for (const Arg* a : {&q, &k, &v}) expect_dtype(*a, dtype_);
    return B;
  }

  void mix_args(py::handle aq, py::handle ak, py::handle av, py::handle c, Arg& aq_, Arg& ak_, Arg& av_, Arg& c_) const {
    if (!cfg_.mixing) {
      for (auto [h, n] : {std::pair{aq, "aq"}, {ak, "ak"}, {av, "av"}, {c, "c"}})
        if (!h.is_none()) arg_error(n, "must be None for an mha layer (it has no mixing or collapse)");
      return;
    }
    aq_ = take(aq, "aq"), ak_ = take(ak, "ak"), av_ = take(av, "av"), c_ = take(c, "c");
    const int64_t H = cfg_.H, G = cfg_.kv_heads(), P = cfg_.P;
    expect_shape(aq_, {H, H, P}, "[H, H, P]");
    expect_shape(ak_, {G, G, P}, "[Hkv, Hkv, P]");
    expect_shape(av_, {G, G, P}, "[Hkv, Hkv, P]");
    expect_shape(c_, {H, cfg_.collapse_cols()}, cfg_.collapse == iha::Collapse::global ? "[H, H*P]" : "[H, P]");
    for (const Arg* a : {&aq_, &ak_, &av_, &c_}) expect_dtype(*a, dtype_);
  }

  template <class T>
  iha::IhaWeights<T> mix_weights(const Arg& aq, const Arg& ak, const Arg& av, const Arg& c) const {
    iha::IhaWeights<T> w;
    if (cfg_.mixing) w.aq = view(aq), w.ak = view(ak), w.av = view(av), w.collapse = view(c);
    return w;
  }

  template <class T>
  void run_forward(iha::AttentionCore<T>& core, int64_t B, const Arg& q, const Arg& k, const Arg& v, const Arg& aq,
                   const Arg& ak, const Arg& av, const Arg& c, const Arg& out, iha::SegmentStarts& seg,
                   CoreCacheHandle& h) {
    // Segments are core state: set them for every call, so a call without them has none.
    check_segments(seg, B, N_);
    core.set_segments(seg);
    auto w = mix_weights<T>(aq, ak, av, c);
    h.cache = core.make_cache();
    if (B == 0) return;  // an empty batch (on every rank: iha.torch agreed on B): nothing to compute
    py::gil_scoped_release nogil;
    core.forward(w, B, static_cast<const T*>(q.data), static_cast<const T*>(k.data), static_cast<const T*>(v.data),
                 static_cast<T*>(out.data), *h.cache);
    // The caller's next op may run on any stream: results are complete when a call returns.
    core.backend().synchronize();
  }

  template <class T>
  void run_backward(iha::AttentionCore<T>& core, CoreCacheHandle& h, const Arg& q, const Arg& k, const Arg& v,
                    const Arg& g, const Arg& aq, const Arg& ak, const Arg& av, const Arg& c, const Arg& dq,
                    const Arg& dk, const Arg& dv, const Arg& daq, const Arg& dak, const Arg& dav, const Arg& dc) {
    auto w = mix_weights<T>(aq, ak, av, c);
    auto grads = mix_weights<T>(daq, dak, dav, dc);
    if (h.B == 0) {  // an empty batch: no gradient (the caller's tensors are zero or empty)
      h.cache.reset();
      return;
    }
    {
      py::gil_scoped_release nogil;
      core.backward(w, h.B, static_cast<const T*>(q.data), static_cast<const T*>(k.data),
                    static_cast<const T*>(v.data), static_cast<const T*>(g.data), static_cast<T*>(dq.data),
                    static_cast<T*>(dk.data), static_cast<T*>(dv.data), grads, *h.cache);
      core.backend().synchronize();
    }
    h.cache.reset();
  }

  template <class T>
  void run_reduce(iha::AttentionCore<T>& core, const std::vector<Arg>& args) {
    // The core sums whatever IhaWeights slots are defined; carry each gradient in one slot.
    for (const Arg& a : args) {
      iha::IhaWeights<T> g;
      g.wq = view(a);
      py::gil_scoped_release nogil;
      core.reduce_gradients(g);
      core.backend().synchronize();
    }
  }

  iha::LayerConfig cfg_;
  int64_t N_;
  iha::DType dtype_ = iha::DType::f64;
  iha::Device device_ = iha::Device::cpu;
  iha::LayoutKind kind_ = iha::LayoutKind::contiguous;
  std::unique_ptr<iha::ProcessMesh> mesh_;
  std::shared_ptr<iha::AttentionCore<double>> c64_;
  std::shared_ptr<iha::AttentionCore<float>> c32_;
  std::vector<int64_t> tokens_;
};

// ---- the whole C++ layer (projections included), for tests and the overhead benchmark

template <class T>
py::dict layer_run(const iha::LayerConfig& cfg, const py::dict& weights, py::handle x, py::handle dz, bool backward,
                  iha::SegmentStarts segments, int64_t reps = 1) {
  Arg x_ = borrow(x, "x");
  if (x_.shape.size() != 3) arg_error("x", "has shape " + iha::shape_str(x_.shape) + "; expected [B, N, D]");
  const int64_t B = x_.shape[0], N = x_.shape[1];
  expect_shape(x_, {B, N, cfg.D}, "[B, N, D]");
  expect_dtype(x_, iha::DTypeOf<T>::value);
  iha::IhaWeights<T> w;
  std::vector<Arg> keep;
  auto take = [&](const char* name, iha::Tensor& slot, const iha::Shape& want, const char* meaning) {
    if (!weights.contains(name)) arg_error(std::string("weights['") + name + "']", "is missing");
    Arg a = borrow(weights[name], std::string("weights['") + name + "']");
    expect_shape(a, want, meaning);
    expect_dtype(a, iha::DTypeOf<T>::value);
    slot = view(a);
    keep.push_back(std::move(a));
  };
  const int64_t H = cfg.H, G = cfg.kv_heads(), d = cfg.d, P = cfg.P;
  take("wq", w.wq, {cfg.D, H * d}, "[D, H*d]");
  take("wk", w.wk, {cfg.D, G * d}, "[D, Hkv*d]");
  take("wv", w.wv, {cfg.D, G * d}, "[D, Hkv*d]");
  take("wo", w.wo, {H * d, cfg.D}, "[H*d, D]");
  if (cfg.mixing) {
    take("aq", w.aq, {H, H, P}, "[H, H, P]");
    take("ak", w.ak, {G, G, P}, "[Hkv, Hkv, P]");
    take("av", w.av, {G, G, P}, "[Hkv, Hkv, P]");
    take("c", w.collapse, {H, cfg.collapse_cols()}, "collapse shape");
  }
  iha::IhaLayer<T> layer(cfg, iha::make_local_core<T>(cfg, N));
  check_segments(segments, B, N);
  layer.core().set_segments(std::move(segments));
  typename iha::IhaLayer<T>::Cache cache;
  iha::Tensor z, dx;
  iha::IhaWeights<T> grads = iha::IhaWeights<T>::zeros(cfg);
  Arg dz_;
  if (backward) {
    dz_ = borrow(dz, "dz");
    expect_shape(dz_, x_.shape, "x's shape");
    expect_dtype(dz_, iha::DTypeOf<T>::value);
  }
  {
    py::gil_scoped_release nogil;
    for (int64_t r = 0; r < reps; ++r) {
      // Timing loops (reps > 1) re-run the same step; the last one's results are returned.
      if (r + 1 == reps) grads.zero();
      layer.forward(w, view(x_), z, cache);
      if (backward) layer.backward(w, view(dz_), cache, dx, grads);
    }
  }
  auto to_py = [](const iha::Tensor& t) {
    // Owning tensors handed to Python as bytes + shape; the package wraps them (one copy of
    // the result, never of an input).
    return py::make_tuple(py::bytes(static_cast<const char*>(t.raw()), t.nbytes()), t.shape(),
                          iha::dtype_name(t.dtype()));
  };
  py::dict out;
  out["z"] = to_py(z);
  if (backward) {
    out["dx"] = to_py(dx);
    for (auto& [name, t] : grads.named()) out[py::str(name == "collapse" ? "c" : name)] = to_py(*t);
  }
  return out;
}

// A field of a Python value, typed: a TypeError naming the field, never pybind's "Unable to
// cast". Numbers: int or float (not bool, not str); integers: int (not bool, not float).
std::string type_name(py::handle v) { return py::str(v.get_type().attr("__name__")); }
double number_field(py::handle v, const std::string& field) {
  if (PyBool_Check(v.ptr()) || !(PyFloat_Check(v.ptr()) || PyLong_Check(v.ptr()) || py::hasattr(v, "__float__")) ||
      PyUnicode_Check(v.ptr()))
    throw py::type_error("argument '" + field + "': expected a number, got " + type_name(v) + " " +
                         std::string(py::repr(v)));
  return v.cast<double>();
}
int64_t int_field(py::handle v, const std::string& field) {
  if (PyBool_Check(v.ptr()) || !py::hasattr(v, "__index__"))
    throw py::type_error("argument '" + field + "': expected an integer, got " + type_name(v) + " " +
                         std::string(py::repr(v)));
  try {
    return py::reinterpret_steal<py::object>(PyNumber_Index(v.ptr())).cast<int64_t>();
  } catch (const py::cast_error&) {
    throw py::value_error("argument '" + field + "': " + std::string(py::repr(v)) + " does not fit in 64 bits");
  }
}
std::string str_field(py::handle v, const std::string& field) {
  if (!PyUnicode_Check(v.ptr()))
    throw py::type_error("argument '" + field + "': expected a str, got " + type_name(v) + " " +
                         std::string(py::repr(v)));
  return v.cast<std::string>();
}

iha::RopeScaling rope_scaling_from(const py::dict& d) {
  iha::RopeScaling r;
  for (auto item : d) {
    const std::string k = py::str(item.first);
    const std::string f = "rope_scaling." + k;
    py::handle v = item.second;
    if (k == "type") r.type = iha::parse_rope_scaling_type(str_field(v, f), "argument '" + f + "'");
    else if (k == "factor") r.factor = number_field(v, f);
    else if (k == "original_length") r.original_length = int_field(v, f);
    else if (k == "beta_fast") r.beta_fast = number_field(v, f);
    else if (k == "beta_slow") r.beta_slow = number_field(v, f);
    else if (k == "ramp") r.ramp = iha::parse_yarn_ramp(str_field(v, f), "argument '" + f + "'");
    else if (k == "low_freq_factor") r.low_freq_factor = number_field(v, f);
    else if (k == "high_freq_factor") r.high_freq_factor = number_field(v, f);
    else throw py::value_error("argument 'rope_scaling': unknown key '" + k + "'");
  }
  r.validate(iha::FieldNames{"argument", "rope_scaling.", {}});
  return r;
}

iha::LayerConfig make_layer_config(int64_t D, int64_t H, int64_t P, int64_t d, int64_t Hkv, const std::string& kind,
                                   const std::string& collapse, const std::string& mask, int64_t window_virtual,
                                   bool rope, double rope_base, double rope_scale, const py::object& rope_scaling) {
  iha::LayerConfig c;
  c.D = D, c.H = H, c.P = P, c.Hkv = Hkv;
  c.d = d > 0 ? d : (H > 0 ? D / H : 0);
  if (kind != "iha" && kind != "mha")
    throw py::value_error("argument 'kind': expected 'iha' or 'mha', got '" + kind + "'");
  c.mixing = kind == "iha";
  c.collapse = iha::parse_collapse(collapse, kArguments("collapse"));
  c.mask = iha::parse_mask(mask, kArguments("mask"));
  c.window_virtual = window_virtual;
  c.rope = rope, c.rope_base = rope_base, c.rope_scale = rope_scale;
  if (!rope_scaling.is_none()) {
    if (!py::isinstance<py::dict>(rope_scaling))
      throw py::type_error("argument 'rope_scaling': expected a dict (or None), got " + type_name(rope_scaling));
    c.rope_scaling = rope_scaling_from(rope_scaling.cast<py::dict>());
  }
  c.validate(kArguments);
  return c;
}

// RoPE scaling as a dict of its fields (what LayerConfig.rope_scaling and the state hold).
py::dict rope_scaling_dict(const iha::RopeScaling& r) {
  py::dict d;
  d["type"] = iha::rope_scaling_type_name(r.type);
  d["factor"] = r.factor;
  d["original_length"] = r.original_length;
  d["beta_fast"] = r.beta_fast;
  d["beta_slow"] = r.beta_slow;
  d["ramp"] = iha::yarn_ramp_name(r.ramp);
  d["low_freq_factor"] = r.low_freq_factor;
  d["high_freq_factor"] = r.high_freq_factor;
  return d;
}

// The config as the keyword arguments that rebuild it (pickling, copying, agreement).
py::dict layer_config_state(const iha::LayerConfig& c) {
  py::dict st;
  st["D"] = c.D, st["H"] = c.H, st["P"] = c.P, st["d"] = c.d, st["Hkv"] = c.kv_heads();
  st["kind"] = c.mixing ? "iha" : "mha";
  st["collapse"] = iha::collapse_name(c.collapse);
  st["mask"] = iha::mask_name(c.mask);
  st["window_virtual"] = c.window_virtual;
  st["rope"] = c.rope, st["rope_base"] = c.rope_base, st["rope_scale"] = c.rope_scale;
  if (c.rope_scaling.on())
    st["rope_scaling"] = rope_scaling_dict(c.rope_scaling);
  else
    st["rope_scaling"] = py::none();
  return st;
}

iha::LayerConfig layer_config_from_state(const py::dict& st) {
  auto get = [&](const char* k) -> py::object {
    if (!st.contains(k)) throw py::value_error(std::string("LayerConfig state: missing '") + k + "'");
    return st[k];
  };
  return make_layer_config(int_field(get("D"), "D"), int_field(get("H"), "H"), int_field(get("P"), "P"),
                           int_field(get("d"), "d"), int_field(get("Hkv"), "Hkv"), str_field(get("kind"), "kind"),
                           str_field(get("collapse"), "collapse"), str_field(get("mask"), "mask"),
                           int_field(get("window_virtual"), "window_virtual"), get("rope").cast<bool>(),
                           number_field(get("rope_base"), "rope_base"), number_field(get("rope_scale"), "rope_scale"),
                           get("rope_scaling"));
}

#if IHA_HAVE_CUDA
// ---- a test-only producer of CUDA tensors (DLPack), so the CUDA route's tests run on a GPU
// machine without a CUDA build of torch (tests/python/test_cuda_dlpack.py). It owns a
// cudaMalloc'd row-major float32/float64 buffer on the current device, copies from and to host
// numpy arrays, and exports itself through __dlpack__ / __dlpack_device__ like torch does.
struct DeviceBuffer {
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
};

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw py::value_error(std::string("TestDeviceArray: ") + what + ": " + cudaGetErrorString(e));
}

class TestDeviceArray {
 public:
  TestDeviceArray(std::vector<int64_t> shape, int bits) : shape_(std::move(shape)), bits_(bits) {
    if (bits != 32 && bits != 64) throw py::value_error("TestDeviceArray: dtype must be float32 or float64");
    for (int64_t s : shape_)
      if (s < 0) throw py::value_error("TestDeviceArray: negative dimension");
    cuda_ok(cudaGetDevice(&device_), "cudaGetDevice");
    buf_ = std::make_shared<DeviceBuffer>();
    if (bytes() > 0) cuda_ok(cudaMalloc(&buf_->ptr, bytes()), "cudaMalloc");
    if (bytes() > 0) cuda_ok(cudaMemset(buf_->ptr, 0, bytes()), "cudaMemset");
  }
  static TestDeviceArray from_host(const py::array& a) {
    const bool f64 = a.dtype().is(py::dtype::of<double>());
    if (!f64 && !a.dtype().is(py::dtype::of<float>()))
      throw py::value_error("TestDeviceArray.from_host: expected a float32 or float64 array");
    py::array c = py::array::ensure(a, py::array::c_style);
    TestDeviceArray out(std::vector<int64_t>(c.shape(), c.shape() + c.ndim()), f64 ? 64 : 32);
    if (out.bytes() > 0) cuda_ok(cudaMemcpy(out.buf_->ptr, c.data(), out.bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
    return out;
  }
  py::array to_host() const {
    cuda_ok(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    py::array out = bits_ == 64 ? py::array(py::dtype::of<double>(), shape_) : py::array(py::dtype::of<float>(), shape_);
    if (bytes() > 0) cuda_ok(cudaMemcpy(out.mutable_data(), buf_->ptr, bytes(), cudaMemcpyDeviceToHost), "cudaMemcpy");
    return out;
  }
  // DLPack: a capsule "dltensor" whose deleter keeps the buffer alive until the consumer (or
  // the capsule, if never consumed) lets go. The copies in and out are synchronous, and the
  // library synchronises before it returns, so the stream argument needs no work here.
  py::object dlpack(const py::object& /*stream*/) const {
    struct Ctx {
      std::shared_ptr<DeviceBuffer> keep;
      std::vector<int64_t> shape;
      DLManagedTensor m;
    };
    auto* ctx = new Ctx{buf_, shape_, {}};
    DLTensor& t = ctx->m.dl_tensor;
    t.data = buf_->ptr;
    t.device = {2, device_};
    t.ndim = static_cast<int32_t>(shape_.size());
    t.dtype = {2, static_cast<uint8_t>(bits_), 1};
    t.shape = ctx->shape.data();
    t.strides = nullptr;  // compact row-major
    t.byte_offset = 0;
    ctx->m.manager_ctx = ctx;
    ctx->m.deleter = [](DLManagedTensor* self) { delete static_cast<Ctx*>(self->manager_ctx); };
    PyObject* cap = PyCapsule_New(&ctx->m, "dltensor", [](PyObject* o) {
      if (PyCapsule_IsValid(o, "dltensor")) {  // never consumed: the capsule owns the tensor
        auto* mt = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(o, "dltensor"));
        mt->deleter(mt);
      }
    });
    if (cap == nullptr) {
      delete ctx;
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(cap);
  }
  py::tuple dlpack_device() const { return py::make_tuple(2, device_); }
  uintptr_t ptr() const { return reinterpret_cast<uintptr_t>(buf_->ptr); }
  const std::vector<int64_t>& shape() const { return shape_; }
  std::string dtype() const { return bits_ == 64 ? "float64" : "float32"; }

 private:
  size_t bytes() const {
    size_t n = static_cast<size_t>(bits_ / 8);
    for (int64_t s : shape_) n *= static_cast<size_t>(s);
    return n;
  }
  std::vector<int64_t> shape_;
  int bits_ = 32;
  int device_ = 0;
  std::shared_ptr<DeviceBuffer> buf_;
};
#endif

}  // namespace

PYBIND11_MODULE(_iha, m) {
  m.doc() = "IHA C++ library bindings (use iha.torch)";
#if IHA_HAVE_CUDA
  m.attr("cuda_built") = true;
  m.def("cuda_device_count", [] { return iha::cuda_device_count(); }, "Visible CUDA devices (0 without a driver).");
  py::class_<TestDeviceArray>(m, "TestDeviceArray",
                              "Test only: a CUDA buffer exported through DLPack (the CUDA route's tests without torch).")
      .def(py::init([](std::vector<int64_t> shape, const std::string& dtype) {
             if (dtype != "float32" && dtype != "float64")
               throw py::value_error("argument 'dtype': expected 'float32' or 'float64', got '" + dtype + "'");
             return TestDeviceArray(std::move(shape), dtype == "float64" ? 64 : 32);
           }),
           py::arg("shape"), py::arg("dtype") = "float32", "Zeros of this shape on the current CUDA device.")
      .def_static("from_host", &TestDeviceArray::from_host, py::arg("array"))
      .def("to_host", &TestDeviceArray::to_host)
      .def("__dlpack__", &TestDeviceArray::dlpack, py::arg("stream") = py::none())
      .def("__dlpack_device__", &TestDeviceArray::dlpack_device)
      .def_property_readonly("ptr", &TestDeviceArray::ptr)
      .def_property_readonly("shape", &TestDeviceArray::shape)
      .def_property_readonly("dtype", &TestDeviceArray::dtype);
#else
  m.attr("cuda_built") = false;
  m.def("cuda_device_count", [] { return 0; }, "Visible CUDA devices: 0 (built without the CUDA backend).");
#endif
  // Registered base first: pybind11 tries translators newest first, so a ConfigError (bad
  // input: a ValueError) is not caught as its base iha::Error (a RuntimeError).
  py::register_exception<iha::Error>(m, "Error", PyExc_RuntimeError);
  py::register_exception<iha::ConfigError>(m, "ConfigError", PyExc_ValueError);

  // Arguments are taken as Python objects and converted by field: a wrong type is a TypeError
  // naming the argument (pybind's own conversion names none).
  py::class_<iha::LayerConfig>(m, "LayerConfig")
      .def(py::init([](py::handle D, py::handle H, py::handle P, py::handle d, py::handle Hkv, py::handle kind,
                       py::handle collapse, py::handle mask, py::handle window_virtual, py::handle rope,
                       py::handle rope_base, py::handle rope_scale, const py::object& rope_scaling) {
             if (!PyBool_Check(rope.ptr()))
               throw py::type_error("argument 'rope': expected a bool, got " + type_name(rope));
             return make_layer_config(int_field(D, "D"), int_field(H, "H"), int_field(P, "P"), int_field(d, "d"),
                                      int_field(Hkv, "Hkv"), str_field(kind, "kind"), str_field(collapse, "collapse"),
                                      str_field(mask, "mask"), int_field(window_virtual, "window_virtual"),
                                      rope.cast<bool>(), number_field(rope_base, "rope_base"),
                                      number_field(rope_scale, "rope_scale"), rope_scaling);
           }),
           py::arg("D"), py::arg("H"), py::arg("P") = 1, py::arg("d") = 0, py::arg("Hkv") = 0,
           py::arg("kind") = "iha", py::arg("collapse") = "global", py::arg("mask") = "flat_causal",
           py::arg("window_virtual") = 0, py::arg("rope") = true, py::arg("rope_base") = 500000.0,
           py::arg("rope_scale") = 1.0, py::arg("rope_scaling") = py::none())
      // Pickling and copy.deepcopy (IhaAttention holds one): the state is the keyword arguments.
      .def(py::pickle([](const iha::LayerConfig& c) { return layer_config_state(c); },
                      [](const py::dict& st) { return layer_config_from_state(st); }))
      .def("state", &layer_config_state, "The keyword arguments that rebuild this config (plain Python data).")
      .def("__eq__", [](const iha::LayerConfig& a, const iha::LayerConfig& b) {
        return layer_config_state(a).equal(layer_config_state(b));
      })
      .def("__hash__", [](const iha::LayerConfig& c) { return py::hash(py::repr(layer_config_state(c))); })
      .def("__repr__", [](const iha::LayerConfig& c) {
        std::string out = "LayerConfig(";
        bool first = true;
        for (auto item : layer_config_state(c)) {
          out += (first ? "" : ", ") + std::string(py::str(item.first)) + "=" + std::string(py::repr(item.second));
          first = false;
        }
        return out + ")";
      })
      .def_readonly("D", &iha::LayerConfig::D)
      .def_readonly("H", &iha::LayerConfig::H)
      .def_readonly("d", &iha::LayerConfig::d)
      .def_readonly("P", &iha::LayerConfig::P)
      .def_property_readonly("Hkv", &iha::LayerConfig::kv_heads)
      .def_readonly("mixing", &iha::LayerConfig::mixing)
      .def_property_readonly("collapse", [](const iha::LayerConfig& c) { return iha::collapse_name(c.collapse); })
      .def_property_readonly("mask", [](const iha::LayerConfig& c) { return iha::mask_name(c.mask); })
      .def_readonly("window_virtual", &iha::LayerConfig::window_virtual)
      .def_readonly("rope", &iha::LayerConfig::rope)
      .def_readonly("rope_base", &iha::LayerConfig::rope_base)
      .def_readonly("rope_scale", &iha::LayerConfig::rope_scale)
      .def_property_readonly("logit_scale", &iha::LayerConfig::logit_scale)
      .def_property_readonly("collapse_cols", &iha::LayerConfig::collapse_cols)
      .def_property_readonly("rope_scaling", [](const iha::LayerConfig& c) { return rope_scaling_dict(c.rope_scaling); });

  py::class_<Comm>(m, "Comm")
      .def_static("from_mpi4py_address", &comm_from_address, py::arg("address"), py::arg("expected_size"))
      .def_property_readonly("rank", [](const Comm& c) { return c.c->rank(); })
      .def_property_readonly("size", [](const Comm& c) { return c.c->size(); })
      .def("all_reduce_sum", [](const Comm& c, py::handle t) {
        Arg a = borrow(t, "tensor");
        py::gil_scoped_release nogil;
        c.c->all_reduce(a.data, a.numel(), a.dtype, iha::ReduceOp::sum, "python.all_reduce");
      }, py::arg("tensor"));

  py::class_<CoreCacheHandle, std::shared_ptr<CoreCacheHandle>>(m, "CoreCache");

  py::class_<Core>(m, "Core")
      .def(py::init([](const iha::LayerConfig& cfg, int64_t N, const std::string& dtype, const Comm* comm,
                       const std::string& layout, const std::string& scheme, int64_t head_ranks, int64_t ring_pieces,
                       const std::string& device) {
             return std::make_unique<Core>(cfg, N, dtype, comm, layout, scheme, head_ranks, ring_pieces, device);
           }),
           py::arg("config"), py::arg("N"), py::arg("dtype") = "float64", py::arg("comm") = nullptr,
           py::arg("layout") = "zigzag", py::arg("scheme") = "sequence", py::arg("head_ranks") = 1,
           py::arg("ring_pieces") = 4, py::arg("device") = "cpu")
      .def_property_readonly("local_tokens", &Core::local_tokens)
      .def_property_readonly("tokens", &Core::tokens)
      .def_property_readonly("config", &Core::config)
      .def_property_readonly("dtype", &Core::dtype)
      .def_property_readonly("device", &Core::device)
      .def("set_token_map", &Core::set_token_map, py::arg("parts"))
      .def("check_forward", &Core::check_forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("aq"),
           py::arg("ak"), py::arg("av"), py::arg("c"), py::arg("segments") = py::none(), py::arg("backward") = false,
           "Every local check of forward (and with backward=True, of the memory backward needs); computes nothing.")
      .def("forward", &Core::forward, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("aq"), py::arg("ak"),
           py::arg("av"), py::arg("c"), py::arg("out"), py::arg("segments") = py::none())
      .def("backward", &Core::backward, py::arg("cache"), py::arg("q"), py::arg("k"), py::arg("v"), py::arg("dout"),
           py::arg("aq"), py::arg("ak"), py::arg("av"), py::arg("c"), py::arg("dq"), py::arg("dk"), py::arg("dv"),
           py::arg("daq"), py::arg("dak"), py::arg("dav"), py::arg("dc"))
      .def("reduce_gradients", &Core::reduce_gradients, py::arg("grads"));

  m.def("available_memory", &iha::available_memory,
        "Bytes this process can still get (MemAvailable, bounded by a cgroup v2 memory.max).");
  m.def("check_core_args", [](const iha::LayerConfig& cfg, int64_t N, const std::string& dtype,
                              const std::string& layout, const std::string& scheme, int64_t head_ranks,
                              int64_t ring_pieces, const std::string& device, int64_t comm_size) {
    const CoreArgs a = check_core_args(cfg, N, dtype, layout, scheme, head_ranks, ring_pieces, device, comm_size);
    backend_for(a.device, a.dtype);
  }, py::arg("config"), py::arg("N"), py::arg("dtype"), py::arg("layout"), py::arg("scheme"), py::arg("head_ranks"),
     py::arg("ring_pieces"), py::arg("device"), py::arg("comm_size"),
     "Every local check of Core's arguments (sizes and memory included); builds and exchanges nothing.");

  m.def("layer_forward_backward", [](const iha::LayerConfig& cfg, const py::dict& weights, py::handle x, py::handle dz,
                                     const py::object& segments) {
    Arg probe = borrow(x, "x");
    auto seg = segments_from(segments);
    return probe.dtype == iha::DType::f64 ? layer_run<double>(cfg, weights, x, dz, !dz.is_none(), seg)
                                          : layer_run<float>(cfg, weights, x, dz, !dz.is_none(), seg);
  }, py::arg("config"), py::arg("weights"), py::arg("x"), py::arg("dz") = py::none(), py::arg("segments") = py::none(),
     "The C++ IhaLayer (projections included) on one process: z, and with dz, dx and every gradient.");

  m.def("layer_seconds", [](const iha::LayerConfig& cfg, const py::dict& weights, py::handle x, py::handle dz,
                            int64_t reps) {
    if (reps < 1) throw py::value_error("argument 'reps': must be >= 1");
    Arg probe = borrow(x, "x");
    const auto t0 = std::chrono::steady_clock::now();
    if (probe.dtype == iha::DType::f64) layer_run<double>(cfg, weights, x, dz, true, {}, reps);
    else layer_run<float>(cfg, weights, x, dz, true, {}, reps);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(reps);
  }, py::arg("config"), py::arg("weights"), py::arg("x"), py::arg("dz"), py::arg("reps"),
     "Seconds per forward + backward of the C++ IhaLayer, timed in C++ (the overhead benchmark's baseline).");

  m.def("data_pointer", [](py::handle t) { return reinterpret_cast<uintptr_t>(borrow(t, "tensor", std::nullopt).data); },
        py::arg("tensor"), "The address the library reads for this tensor (no-copy checks).");

  // The layout map (parallel/layout.h): Python never restates the rule.
  m.def("layout_tokens", [](const std::string& kind, int64_t N, int64_t S, int64_t T, int64_t s, int64_t t) {
    if (N < 1 || S < 1 || T < 1) throw py::value_error("layout_tokens: N, S and T must be >= 1");
    if (s < 0 || s >= S || t < 0 || t >= T) throw py::value_error("layout_tokens: index out of range");
    check_fits_memory(arg_size(N, "N") * Size(16), "the token map of N tokens");
    const auto k = iha::parse_layout(named("kind", [&] { return kind; }));
    return iha::replica_token_map(k, N, S, T)[s * T + t];
  }, py::arg("kind"), py::arg("N"), py::arg("S"), py::arg("T") = 1, py::arg("s") = 0, py::arg("t") = 0);
  m.def("balanced_parts", [](int64_t N, int64_t R, int64_t P, int64_t window_virtual, bool token_causal,
                             const iha::SegmentStarts& starts) {
    if (N < 1) throw py::value_error("argument 'N': the sequence length must be >= 1, got " + std::to_string(N));
    if (R < 1) throw py::value_error("argument 'R': the rank count must be >= 1, got " + std::to_string(R));
    if (P < 1) throw py::value_error("argument 'P': must be >= 1, got " + std::to_string(P));
    if (window_virtual < 0)
      throw py::value_error("argument 'window_virtual': must be >= 0 (0: a global layer), got " +
                            std::to_string(window_virtual));
    (arg_size(N, "N") * arg_size(P, "P")).value();
    check_fits_memory(arg_size(N, "N") * Size(16), "the token map of N tokens");
    // Each sequence's document starts: ascending, the first 0, all inside [0, N).
    try {
      iha::check_segment_starts(starts, static_cast<int64_t>(starts.size()), N, "argument 'segments'");
    } catch (const iha::Error& e) {
      throw py::value_error(e.what());
    }
    iha::PairCost cost;
    cost.P = P, cost.window = window_virtual, cost.token_causal = token_causal;
    return iha::balanced_tokens(N, R, {cost}, starts);
  }, py::arg("N"), py::arg("R"), py::arg("P"), py::arg("window_virtual") = 0, py::arg("token_causal") = false,
     py::arg("starts") = iha::SegmentStarts{});
}
