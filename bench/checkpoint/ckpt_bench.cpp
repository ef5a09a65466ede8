// Checkpoint save/load throughput next to the raw sequential bandwidth of the same disk,
// measured in the same run (DESIGN.md section 9).
//
//   mpiexec -n R ckpt_bench [--dir DIR] [--mib 1024] [--reps 3] [--threads T] [--json FILE]
//
// State: ~1 GiB the way training holds it across R ranks: f32 weights split by rows
// (hyperslabs), bf16 weights replicated (written once, the replicas share the writing), an
// f32 embedding split by rows, and two f32 optimizer states as flat ranges (ZeRO).
// Baselines, rank 0 alone on one plain file of the same size in DIR: write() in 8 MiB blocks
// then fsync (the file grows with every write); the same into a file first sized with
// ftruncate (the way checkpoints are written, often much faster on ext4); read() in 8 MiB
// blocks after posix_fadvise(DONTNEED) dropped its cached pages. The save ratio is taken
// against the faster of the two raw writes.
// Save: Checkpointer::save (hashing, file creation, writes, fsyncs, rename, latest).
// Load: Checkpointer::load with verification on, after dropping the file's cached pages.
//
//   GB/s  = tensor bytes / wall seconds / 1e9   (wall: barrier to barrier, the slowest rank)
//   ratio = checkpoint GB/s / raw GB/s          (target >= 0.5 for save and for load)
// Medians over --reps repetitions are printed, each repetition in the order raw write, raw
// read, save, load. --json FILE also writes the medians, ratios and every repetition's times
// (rank 0), so a report can take spreads.
#include <fcntl.h>
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/blas.h"
#include "parallel/layout.h"

namespace fs = std::filesystem;
using namespace iha;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Wall time of body across all ranks: barrier, run, barrier.
template <class F>
double timed(Communicator& c, F&& body) {
  c.barrier();
  const double t0 = now();
  body();
  c.barrier();
  return now() - t0;
}

void die(const std::string& what) {
  std::perror(what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
}

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) die("open " + path);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

constexpr size_t kBlock = size_t(8) << 20;

void raw_write(const std::string& path, const std::vector<char>& block, uint64_t bytes,
               bool presize) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) die("open " + path);
  if (presize && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) die("ftruncate " + path);
  for (uint64_t done = 0; done < bytes;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, bytes - done));
    const ssize_t w = ::write(fd, block.data(), n);
    if (w <= 0) die("write " + path);
    done += static_cast<uint64_t>(w);
  }
  if (::fsync(fd) != 0) die("fsync " + path);
  ::close(fd);
}

void raw_read(const std::string& path, std::vector<char>& block) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) die("open " + path);
  while (::read(fd, block.data(), block.size()) > 0) {
  }
  ::close(fd);
}

struct Bench {
  std::vector<Tensor> tensors;  // keeps the local shards alive
  int64_t bytes = 0;            // global tensor bytes
  int count = 0;
};

// Registers ~mib MiB of state; returns the local tensors.
Bench build_state(Checkpointer& ck, int64_t mib, int rank, int R) {
  Bench b;
  const int64_t unit = mib << 20;  // bytes
  auto rows_of = [&](const std::string& name, DType dt, int64_t rows, int64_t cols) {
    const int64_t r0 = chunk_begin(rows, R, rank), r1 = chunk_begin(rows, R, rank + 1);
    Tensor t({r1 - r0, cols}, dt);
    ck.add_tensor(name, t, {rows, cols}, ShardSpec::hyperslab({r0, 0}, {r1 - r0, cols}));
    b.tensors.push_back(t);
    b.bytes += rows * cols * static_cast<int64_t>(dtype_size(dt));
    ++b.count;
  };
  auto flat_of = [&](const std::string& name, DType dt, int64_t rows, int64_t cols) {
    const int64_t n = rows * cols, e0 = chunk_begin(n, R, rank), e1 = chunk_begin(n, R, rank + 1);
    Tensor t({e1 - e0}, dt);
    ck.add_tensor(name, t, {rows, cols}, ShardSpec::flat_range(e0, e1));
    b.tensors.push_back(t);
    b.bytes += n * static_cast<int64_t>(dtype_size(dt));
    ++b.count;
  };
  auto replicated = [&](const std::string& name, DType dt, int64_t rows, int64_t cols) {
    Tensor t({rows, cols}, dt);
    ck.add_tensor(name, t, {rows, cols});
    b.tensors.push_back(t);
    b.bytes += rows * cols * static_cast<int64_t>(dtype_size(dt));
    ++b.count;
  };
  // Shares of the total: weights 1/4 (f32 rows), bf16 copy 1/8 (replicated), embedding 1/8
  // (f32 rows), exp_avg 1/4 and exp_avg_sq 1/4 (f32 flat ranges); 4 layers.
  const int64_t cols = 1024;
  const int64_t layer_rows = unit / 16 / (4 * cols);  // f32 rows per layer weight
  for (int l = 0; l < 4; ++l) {
    const std::string p = "layers." + std::to_string(l) + "/";
    rows_of("model/" + p + "w", DType::f32, layer_rows, cols);
    replicated("model_bf16/" + p + "w", DType::bf16, layer_rows, cols);
    flat_of("opt/exp_avg/" + p + "w", DType::f32, layer_rows, cols);
    flat_of("opt/exp_avg_sq/" + p + "w", DType::f32, layer_rows, cols);
  }
  rows_of("model/embed", DType::f32, unit / 8 / (4 * cols), cols);
  // Non-trivial contents, the same on every rank for the replicated tensors (replicas are
  // identical in training; which replica's bytes reach the file is not specified).
  for (Tensor& t : b.tensors) {
    auto* p = static_cast<uint64_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes() / 8; ++i) p[i] = (i + 1) * 0x9E3779B97F4A7C15ull;
  }
  return b;
}

uint64_t checksum(const Bench& b) {
  uint64_t s = 0;
  for (const Tensor& t : b.tensors) {
    const auto* p = static_cast<const uint8_t*>(t.raw());
    for (size_t i = 0; i < t.nbytes(); i += 4093) s = s * 31 + p[i];
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime runtime(&argc, &argv);
  Communicator& c = *runtime.world();
  const int R = c.size(), me = c.rank();
  std::string dir = (fs::temp_directory_path() / "iha_ckpt_bench").string();
  int64_t mib = 1024;
  int reps = 3;
  bool verify = true;
  std::string json;
  int threads = 1;  // hashing runs at ~12 GB/s per core with AVX-512: one is plenty
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--dir") dir = argv[i + 1];
    else if (a == "--mib") mib = std::stoll(argv[i + 1]);
    else if (a == "--reps") reps = std::stoi(argv[i + 1]);
    else if (a == "--threads") threads = std::stoi(argv[i + 1]);
    else if (a == "--verify") verify = std::stoi(argv[i + 1]) != 0;
    else if (a == "--json") json = argv[i + 1];
  }
  set_num_threads(threads);
  const std::string root = dir + "/ckpt", raw = dir + "/raw.bin";
  if (me == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  c.barrier();

  CheckpointOptions opt;
  opt.keep_last = 1;
  Checkpointer ck(runtime.world(), opt);
  Bench b = build_state(ck, mib, me, R);
  const uint64_t saved_sum = checksum(b);
  std::vector<char> block(kBlock);
  for (size_t i = 0; i < block.size(); ++i) block[i] = static_cast<char>(i * 7);

  std::vector<double> t_write, t_write_sized, t_read, t_save, t_load;
  int64_t step = 0;
  for (int rep = 0; rep < reps; ++rep) {
    if (me == 0) fs::remove(raw);
    t_write.push_back(timed(c, [&] {
      if (me == 0) raw_write(raw, block, static_cast<uint64_t>(b.bytes), false);
    }));
    if (me == 0) fs::remove(raw);
    t_write_sized.push_back(timed(c, [&] {
      if (me == 0) raw_write(raw, block, static_cast<uint64_t>(b.bytes), true);
    }));
    if (me == 0) drop_cache(raw);
    t_read.push_back(timed(c, [&] {
      if (me == 0) raw_read(raw, block);
    }));
    if (me == 0) fs::remove(raw);
    ++step;
    t_save.push_back(timed(c, [&] { ck.save(root, step); }));
    for (Tensor& t : b.tensors) t.zero();
    drop_cache(root + "/step_" + std::to_string(step) + "/state.h5");
    LoadOptions lopt;
    lopt.verify = verify;
    t_load.push_back(timed(c, [&] { ck.load(root, lopt); }));
    if (checksum(b) != saved_sum) {
      std::fprintf(stderr, "rank %d: loaded state differs from the saved one\n", me);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  // One asynchronous save: how long training is held up (the copy to host buffers).
  CheckpointOptions aopt = opt;
  aopt.async = true;
  Checkpointer ack(runtime.world(), aopt);
  Bench ab = build_state(ack, mib, me, R);
  // The first async save allocates its host buffers; the second reuses them (steady state).
  ack.save(root, ++step);
  ack.wait();
  const double t_async_return = timed(c, [&] { ack.save(root, ++step); });
  ack.wait();

  if (me == 0) {
    const double gb = static_cast<double>(b.bytes) / 1e9;
    const double w0 = gb / median(t_write), w1 = gb / median(t_write_sized);
    const double w = std::max(w0, w1), r = gb / median(t_read);
    const double s = gb / median(t_save), l = gb / median(t_load);
    std::printf("checkpoint benchmark: %d rank(s), %.3f GiB of state in %d tensors, dir %s,\n"
                "  %d hash thread(s) per rank, median of %d repetitions\n",
                R, static_cast<double>(b.bytes) / (1 << 30), b.count, dir.c_str(), threads, reps);
    std::printf("  raw sequential write+fsync (rank 0, 8 MiB writes)  %7.3f GB/s\n", w0);
    std::printf("  raw write+fsync into a pre-sized file               %7.3f GB/s\n", w1);
    std::printf("  raw sequential read (page cache dropped)            %7.3f GB/s\n", r);
    std::printf("  checkpoint save (hash, write, fsync, commit)        %7.3f GB/s  ratio %.2f of the faster raw write\n", s, s / w);
    std::printf("  checkpoint load (verify on, page cache dropped)     %7.3f GB/s  ratio %.2f of raw read\n", l, l / r);
    std::printf("  async save (buffers reused) returns after %.3f s (copy to host %.2f GB/s)\n", t_async_return,
                gb / t_async_return);
    std::printf("  formula: GB/s = tensor bytes / wall seconds / 1e9 (barrier to barrier); "
                "ratio = checkpoint GB/s / raw GB/s\n");
    std::printf("  all runs (s): write");
    for (double x : t_write) std::printf(" %.3f", x);
    std::printf(" | write pre-sized");
    for (double x : t_write_sized) std::printf(" %.3f", x);
    std::printf(" | read");
    for (double x : t_read) std::printf(" %.3f", x);
    std::printf(" | save");
    for (double x : t_save) std::printf(" %.3f", x);
    std::printf(" | load");
    for (double x : t_load) std::printf(" %.3f", x);
    std::printf("\n");
    if (!json.empty()) {
      std::ofstream f(json);
      f.precision(12);
      auto arr = [&f](const char* key, const std::vector<double>& v) {
        f << ", \"" << key << "\": [";
        for (size_t i = 0; i < v.size(); ++i) f << (i ? ", " : "") << v[i];
        f << "]";
      };
      f << "{\"ranks\": " << R << ", \"bytes\": " << b.bytes << ", \"tensors\": " << b.count
        << ", \"reps\": " << reps << ", \"hash_threads\": " << threads << ", \"dir\": \"" << dir
        << "\", \"raw_write_GBps\": " << w0 << ", \"raw_write_presized_GBps\": " << w1
        << ", \"raw_read_GBps\": " << r << ", \"save_GBps\": " << s << ", \"load_GBps\": " << l
        << ", \"save_ratio\": " << s / w << ", \"load_ratio\": " << l / r
        << ", \"async_return_s\": " << t_async_return;
      arr("t_write", t_write);
      arr("t_write_presized", t_write_sized);
      arr("t_read", t_read);
      arr("t_save", t_save);
      arr("t_load", t_load);
      f << "}\n";
    }
    fs::remove_all(dir);
  }
  return 0;
}
