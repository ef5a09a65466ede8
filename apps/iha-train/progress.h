// Progress reporting of iha-train: the machine's peak measured at startup with a short GEMM on
// every rank at once, resident memory per rank, and the console / JSON-lines output of rank 0.
// defines: iha::app::measure_gemm_peak, iha::app::measure_gemm_peak_cuda, iha::app::MemoryUse, iha::app::memory_use,
//          iha::app::JsonLine, iha::app::Reporter, iha::app::format_duration
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "parallel/comm.h"

namespace iha::app {

// FLOP/s of a square GEMM of dtype dt on this rank, measured while every rank of `world` runs
// the same GEMM (so shared cores are shared as in training). Collective.
double measure_gemm_peak(Communicator& world, DType dt, double seconds = 0.3);
// The same on this rank's GPU: a cuBLAS product with ab inputs (the run's compute dtype) and
// fp32 accumulation, as the model's projections use. Collective. CUDA builds only.
double measure_gemm_peak_cuda(Communicator& world, DType ab, double seconds = 0.3);

struct MemoryUse {
  double rss_mib = 0;       // resident now
  double peak_rss_mib = 0;  // high-water mark since start
};
// This process's resident memory from /proc/self/status.
MemoryUse memory_use();
// Maximum over the ranks of world (collective).
MemoryUse max_memory_use(Communicator& world);

// A flat JSON object built field by field.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, double v);
  JsonLine& add(const std::string& key, int64_t v);
  JsonLine& add(const std::string& key, const std::string& v);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

std::string format_duration(double seconds);  // "1h02m", "3m07s", "12.3s"

// Rank 0 writes console lines and JSON lines (file opened for append); other ranks write
// nothing.
class Reporter {
 public:
  Reporter(bool active, const std::string& jsonl_path);
  bool active() const { return active_; }
  void console(const std::string& line);
  void json(const JsonLine& j);

 private:
  bool active_;
  std::unique_ptr<std::ofstream> jsonl_;
  std::string path_;
};

}  // namespace iha::app
