#include "progress.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <vector>

#include "core/blas.h"
#include "core/error.h"
#include "core/files.h"
#if defined(IHA_HAVE_CUDA)
#include <cuda_runtime.h>

#include "core/cuda_blas.h"
#include "core/cuda_device.h"
#endif

namespace iha::app {

namespace {

template <class T>
double gemm_rate(Communicator& world, double seconds) {
  // 256^3 is large enough for OpenBLAS to reach its steady rate and small enough to repeat.
  const int64_t n = 256;
  std::vector<T> a(n * n, T(0.5)), b(n * n, T(0.25)), c(n * n, T(0));
  gemm<T>(false, false, n, n, n, T(1), a.data(), n, b.data(), n, T(0), c.data(), n);  // warm up
  world.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t reps = 0;
  double elapsed = 0;
  do {
    gemm<T>(false, false, n, n, n, T(1), a.data(), n, b.data(), n, T(0), c.data(), n);
    ++reps;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  return 2.0 * static_cast<double>(n * n * n) * static_cast<double>(reps) / elapsed;
}

}  // namespace

double measure_gemm_peak(Communicator& world, DType dt, double seconds) {
  return dt == DType::f64 ? gemm_rate<double>(world, seconds) : gemm_rate<float>(world, seconds);
}

double measure_gemm_peak_cuda(Communicator& world, DType ab, double seconds) {
#if defined(IHA_HAVE_CUDA)
  // The cuBLAS product the model's projections use (ab inputs, fp32 output and accumulation)
  // at a size that reaches the GPU's steady rate, on this rank's current device.
  const int64_t n = 4096;
  Tensor a({n, n}, ab, Device::cuda), b({n, n}, ab, Device::cuda), c({n, n}, DType::f32, Device::cuda);
  auto product = [&] {
    gemm_cuda(false, false, n, n, n, 1.0f, a.raw(), n, b.raw(), n, 0.0f, c.raw(), n, ab, DType::f32);
  };
  product();  // warm up (cuBLAS picks its kernel)
  IHA_CUDA_CHECK(cudaDeviceSynchronize());
  world.barrier();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t reps = 0;
  double elapsed = 0;
  do {
    for (int i = 0; i < 10; ++i) product();
    IHA_CUDA_CHECK(cudaDeviceSynchronize());
    reps += 10;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  return 2.0 * static_cast<double>(n * n * n) * static_cast<double>(reps) / elapsed;
#else
  (void)world, (void)ab, (void)seconds;
  IHA_FAIL("measure_gemm_peak_cuda: this build has no CUDA support");
#endif
}

MemoryUse memory_use() {
  MemoryUse m;
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return m;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    long kb = 0;
    if (std::sscanf(line, "VmRSS: %ld kB", &kb) == 1) m.rss_mib = kb / 1024.0;
    if (std::sscanf(line, "VmHWM: %ld kB", &kb) == 1) m.peak_rss_mib = kb / 1024.0;
  }
  std::fclose(f);
  return m;
}

MemoryUse max_memory_use(Communicator& world) {
  MemoryUse m = memory_use();
  double v[2] = {m.rss_mib, m.peak_rss_mib};
  world.all_reduce(v, 2, DType::f64, ReduceOp::max, "log.memory");
  return {v[0], v[1]};
}

void JsonLine::key(const std::string& k) {
  if (!body_.empty()) body_ += ",";
  body_ += "\"" + k + "\":";
}

JsonLine& JsonLine::add(const std::string& k, double v) {
  key(k);
  if (!std::isfinite(v)) {
    body_ += "null";  // JSON has no NaN or Inf
  } else {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);  // round-trips a double exactly
    body_ += buf;
  }
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, const std::string& v) {
  key(k);
  std::string esc;
  for (char c : v) {
    if (c == '"' || c == '\\') {
      esc += '\\';
      esc += c;
    } else if (c == '\n') {
      esc += "\\n";
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      esc += buf;
    } else {
      esc += c;
    }
  }
  body_ += "\"" + esc + "\"";
  return *this;
}

std::string format_duration(double s) {
  char buf[32];
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.1fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s / 60), static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s / 3600),
                  static_cast<int>(s / 60) % 60);
  }
  return buf;
}

Reporter::Reporter(bool active, const std::string& path) : active_(active), path_(path) {
  if (!active_ || path.empty()) return;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  // Appended to, never written through a symbolic link into another file, nor opened if a FIFO.
  require_new_output(path, "config key 'logging.jsonl': log file");
  jsonl_ = std::make_unique<std::ofstream>(path, std::ios::app);
  IHA_CONFIG_CHECK(jsonl_->good(), "config key 'logging.jsonl': cannot open '", path, "' for writing");
}

void Reporter::console(const std::string& line) {
  if (active_) std::cout << line << std::endl;
}

void Reporter::json(const JsonLine& j) {
  if (active_ && jsonl_) {
    *jsonl_ << j.str() << "\n";
    jsonl_->flush();
    // A log that cannot be written (disk full, file size limit) does not stop training: the
    // checkpoints are the run's state. But it is said, once, with the reason.
    if (!jsonl_->good()) {
      const int err = errno;
      std::cerr << "iha-train: warning: writing config key 'logging.jsonl' = '" << path_
                << "' failed (" << std::strerror(err) << "): the log ends before this line: "
                << j.str() << std::endl;
      jsonl_.reset();
    }
  }
}

}  // namespace iha::app
