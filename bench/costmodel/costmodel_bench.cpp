// Micro-benchmark driver of the cost model (docs/costmodel.md): times the library's own
// functions at the exact per-rank shapes of a training config, one thread per process, and
// writes the median seconds per call of each item as JSON. The cost model turns these into
// rates (GEMM GFLOP/s per shape, attention GFLOP/s on visible pairs, elements/s of the
// memory-bound ops, the ping-pong alpha-beta curve); it never sees a step time.
//
//   costmodel_bench --plan plan.json --json out.json            (one process: solo rates)
//   mpiexec -n 2 costmodel_bench --plan plan.json --json out.json
//
// The plan (written by bench/costmodel/costmodel.py plan) is a list of groups of items. Every process
// runs each group's items that belong to it: an item with a "rank" field belongs to process
// rank % processes (the per-rank attention calls of a ring or halo step), one without it to
// every process (GEMMs and element-wise ops, so with 2 processes both cores are busy, as in a
// 2-rank training step). Processes meet in a sleeping barrier between groups.
//
// Items (op: parameters; what one call is):
//   gemm: ta, tb, M, N, K, beta          iha::gemm<float>
//   flash_fwd / flash_bwd: heads, d, P, window, mask, q_runs, k_runs ([[first virtual
//       position, count], ...]), tile_q, tile_k: flash_forward / flash_backward over `heads`
//       independent heads (backward after an untimed forward and flash_drow)
//   mix_fwd / mix_bwd: n_tok, H, d, P    mix_forward / mix_backward (with d alpha)
//   rope_table: rows, d, pos0            RopeTable construction (float64 cos/sin)
//   rope_apply: rows, d                  RopeTable::apply
//   collapse_fwd / collapse_bwd: n_tok, H, d, P, form
//   merge: rows, d                       merge_partial_row on every row
//   drow: rows, d                        flash_drow
//   rmsnorm_fwd / rmsnorm_bwd: rows, D
//   swiglu_fwd / swiglu_bwd: rows, D, F  the whole library function (GEMMs and gating)
//   ce: rows, V                          cross_entropy_forward_backward
//   embed_fwd / embed_bwd: rows, D, V
//   adamw / sumsq / zero / scale: numel  AdamW::update, sum_of_squares, ParamSet::zero, and
//                                        the trainer's clip loop (g *= f)
//   alloc: floats (list)                 allocate (zeroed Tensors) and free that list
//   copy / add: floats                   std::copy; the residual loop dst += src
//   pingpong / exchange: bytes           ranks 0 and 1 through the library's Communicator:
//                                        round trip / 2; both sending at once (a ring step)
//   allreduce: count                     Communicator::all_reduce of float32 over all ranks
#include <mpi.h>
#include <sys/resource.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "attention/merge.h"
#include "attention/ops.h"
#include "common/bench_util.h"
#include "core/blas.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "model/ops.h"
#include "model/optim.h"
#include "model/params.h"
#include "parallel/comm.h"

using namespace iha;

namespace {

struct Timing {
  double median_s = 0;
  int reps = 0;
  std::map<std::string, double> extra;  // e.g. pairs_computed
};

struct Limits {
  double min_time_s = 0.05;
  int min_reps = 3;
  int max_reps = 50;
};

// Runs `call` once to warm up, then until min_time_s has passed and min_reps are done (at
// most max_reps); `reset` runs untimed before every call. Median seconds per call.
Timing time_calls(const Limits& lim, const std::function<void()>& call,
                  const std::function<void()>& reset = {}) {
  if (reset) reset();
  call();
  std::vector<double> t;
  double total = 0;
  while ((total < lim.min_time_s || static_cast<int>(t.size()) < lim.min_reps) &&
         static_cast<int>(t.size()) < lim.max_reps) {
    if (reset) reset();
    const double t0 = bench::now();
    call();
    const double s = bench::now() - t0;
    t.push_back(s);
    total += s;
  }
  Timing r;
  r.median_s = bench::median(t);
  r.reps = static_cast<int>(t.size());
  return r;
}

std::vector<float> random_floats(size_t n, uint64_t stream, double scale = 1.0) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(scale * normal01(17, stream, i));
  return x;
}

// Keeps a constructed object alive to the end of the timed call.
template <class X>
void bench_keep(const X& x) {
  asm volatile("" : : "r"(&x) : "memory");
}

int64_t geti(const YAML::Node& n, const char* key) { return n[key].as<int64_t>(); }
int64_t geti(const YAML::Node& n, const char* key, int64_t def) { return n[key] ? n[key].as<int64_t>() : def; }

std::vector<int64_t> positions(const YAML::Node& runs) {
  std::vector<int64_t> pos;
  for (const auto& r : runs) {
    const int64_t first = r[0].as<int64_t>(), count = r[1].as<int64_t>();
    for (int64_t i = 0; i < count; ++i) pos.push_back(first + i);
  }
  return pos;
}

MaskSpec mask_of(const YAML::Node& it) {
  MaskSpec m;
  m.kind = it["mask"] && it["mask"].as<std::string>() == "token_causal" ? MaskKind::token_causal
                                                                         : MaskKind::flat_causal;
  m.P = geti(it, "P");
  m.window = geti(it, "window", 0);
  return m;
}

Timing run_gemm(const YAML::Node& it, const Limits& lim) {
  const bool ta = it["ta"].as<bool>(), tb = it["tb"].as<bool>();
  const int64_t M = geti(it, "M"), N = geti(it, "N"), K = geti(it, "K");
  const float beta = it["beta"] ? it["beta"].as<float>() : 0.0f;
  const auto a = random_floats(size_t(M) * K, 1), b = random_floats(size_t(K) * N, 2);
  std::vector<float> c(size_t(M) * N, 0.0f);
  const int64_t lda = ta ? M : K, ldb = tb ? K : N;
  return time_calls(lim, [&] { gemm<float>(ta, tb, M, N, K, 1.0f, a.data(), lda, b.data(), ldb, beta, c.data(), N); });
}

Timing run_flash(const YAML::Node& it, const Limits& lim, bool backward) {
  const MaskSpec m = mask_of(it);
  const int64_t heads = geti(it, "heads"), d = geti(it, "d");
  const FlashTiles tiles{geti(it, "tile_q", 128), geti(it, "tile_k", 128)};
  const std::vector<int64_t> qp = positions(it["q_runs"]), kp = positions(it["k_runs"]);
  const int64_t nq = static_cast<int64_t>(qp.size()), nk = static_cast<int64_t>(kp.size());
  const auto q = random_floats(size_t(heads) * nq * d, 3), k = random_floats(size_t(heads) * nk * d, 4),
             v = random_floats(size_t(heads) * nk * d, 5), dout = random_floats(size_t(heads) * nq * d, 6);
  std::vector<float> o(size_t(heads) * nq * d), lse(size_t(heads) * nq), drow(size_t(heads) * nq);
  std::vector<float> dq(o.size()), dk(k.size()), dv(v.size());
  int64_t pairs = 0;
  auto fwd = [&] {
    pairs = 0;
    for (int64_t h = 0; h < heads; ++h)
      pairs += flash_forward<float>(m, d, q.data() + h * nq * d, qp.data(), nq, k.data() + h * nk * d,
                                    v.data() + h * nk * d, kp.data(), nk, o.data() + h * nq * d,
                                    lse.data() + h * nq, tiles).pairs_computed;
  };
  Timing t;
  if (!backward) {
    t = time_calls(lim, fwd);
  } else {
    fwd();
    for (int64_t h = 0; h < heads; ++h)
      flash_drow<float>(o.data() + h * nq * d, dout.data() + h * nq * d, nq, d, drow.data() + h * nq);
    t = time_calls(lim, [&] {
      pairs = 0;
      for (int64_t h = 0; h < heads; ++h)
        pairs += flash_backward<float>(m, d, q.data() + h * nq * d, qp.data(), nq, k.data() + h * nk * d,
                                       v.data() + h * nk * d, kp.data(), nk, dout.data() + h * nq * d,
                                       lse.data() + h * nq, drow.data() + h * nq, dq.data() + h * nq * d,
                                       dk.data() + h * nk * d, dv.data() + h * nk * d, tiles)
                     .pairs_computed;
    });
  }
  t.extra["pairs_computed"] = static_cast<double>(pairs);
  return t;
}

Collapse form_of(const YAML::Node& it) {
  return it["form"] && it["form"].as<std::string>() == "per_head" ? Collapse::per_head : Collapse::global;
}

std::vector<float> identity_alpha(int64_t H, int64_t P) {
  // Identity plus a little noise: the values do not change the cost, only keep them finite.
  std::vector<float> a = random_floats(size_t(H) * H * P, 7, 0.01);
  for (int64_t m = 0; m < H; ++m)
    for (int64_t j = 0; j < P; ++j) a[(m * H + m) * P + j] += 1.0f;
  return a;
}

Timing run_elementwise(const std::string& op, const YAML::Node& it, const Limits& lim) {
  if (op == "mix_fwd" || op == "mix_bwd") {
    const int64_t n = geti(it, "n_tok"), H = geti(it, "H"), d = geti(it, "d"), P = geti(it, "P");
    const int64_t hs = n * P * d;
    const auto pre = random_floats(size_t(n) * H * d, 8), alpha = identity_alpha(H, P);
    std::vector<float> virt = random_floats(size_t(H) * hs, 9), dpre(pre.size()), dalpha(alpha.size());
    if (op == "mix_fwd")
      return time_calls(lim, [&] { mix_forward<float>(pre.data(), H * d, n, H, d, P, alpha.data(), 0, H, virt.data(), hs); });
    return time_calls(lim, [&] {
      mix_backward<float>(virt.data(), hs, pre.data(), H * d, n, H, d, P, alpha.data(), 0, H, dpre.data(), H * d,
                          dalpha.data());
    });
  }
  if (op == "rope_table" || op == "rope_apply") {
    const int64_t rows = geti(it, "rows"), d = geti(it, "d"), pos0 = geti(it, "pos0", 0);
    std::vector<int64_t> pos(rows);
    for (int64_t r = 0; r < rows; ++r) pos[r] = pos0 + r;
    const RopeSpec spec{true, it["rope_base"] ? it["rope_base"].as<double>() : 500000.0, 1.0};
    if (op == "rope_table")
      return time_calls(lim, [&] { RopeTable<float> t(spec, d, pos.data(), rows); bench_keep(t); });
    const RopeTable<float> table(spec, d, pos.data(), rows);
    std::vector<float> x = random_floats(size_t(rows) * d, 10);
    return time_calls(lim, [&] { table.apply(x.data(), rows, false); });
  }
  if (op == "collapse_fwd" || op == "collapse_bwd") {
    const int64_t n = geti(it, "n_tok"), H = geti(it, "H"), d = geti(it, "d"), P = geti(it, "P");
    const Collapse form = form_of(it);
    const int64_t hs = n * P * d, cols = form == Collapse::global ? H * P : P;
    const auto y = random_floats(size_t(H) * hs, 11), C = random_floats(size_t(H) * cols, 12, 0.5);
    std::vector<float> out(size_t(n) * H * d), dy(y.size()), dC(C.size());
    const auto dout = random_floats(out.size(), 13);
    if (op == "collapse_fwd")
      return time_calls(lim, [&] { collapse_forward<float>(y.data(), hs, n, H, d, P, form, C.data(), out.data(), H * d); });
    return time_calls(lim, [&] {
      collapse_backward<float>(dout.data(), H * d, y.data(), hs, n, H, d, P, form, C.data(), dy.data(), dC.data());
    });
  }
  if (op == "merge") {
    const int64_t rows = geti(it, "rows"), d = geti(it, "d");
    std::vector<float> o = random_floats(size_t(rows) * d, 14), lse = random_floats(rows, 15);
    const auto op_ = random_floats(size_t(rows) * d, 16), lp = random_floats(rows, 17);
    const std::vector<float> o0 = o, lse0 = lse;
    return time_calls(lim, [&] { for (int64_t r = 0; r < rows; ++r) merge_partial_row(o.data() + r * d, lse[r], op_.data() + r * d, lp[r], d); },
                      [&] { o = o0; lse = lse0; });
  }
  if (op == "drow") {
    const int64_t rows = geti(it, "rows"), d = geti(it, "d");
    const auto o = random_floats(size_t(rows) * d, 18), g = random_floats(size_t(rows) * d, 19);
    std::vector<float> dr(rows);
    return time_calls(lim, [&] { flash_drow<float>(o.data(), g.data(), rows, d, dr.data()); });
  }
  if (op == "rmsnorm_fwd" || op == "rmsnorm_bwd") {
    const int64_t rows = geti(it, "rows"), D = geti(it, "D");
    const auto x = random_floats(size_t(rows) * D, 20), g = random_floats(D, 21), dy = random_floats(size_t(rows) * D, 22);
    std::vector<float> y(x.size()), inv(rows), dx(x.size()), dg(D);
    rmsnorm_forward<float>(x.data(), rows, D, g.data(), 1e-5, y.data(), inv.data());
    if (op == "rmsnorm_fwd")
      return time_calls(lim, [&] { rmsnorm_forward<float>(x.data(), rows, D, g.data(), 1e-5, y.data(), inv.data()); });
    return time_calls(lim, [&] { rmsnorm_backward<float>(x.data(), dy.data(), rows, D, g.data(), inv.data(), dx.data(), dg.data()); });
  }
  if (op == "swiglu_fwd" || op == "swiglu_bwd") {
    const int64_t rows = geti(it, "rows"), D = geti(it, "D"), F = geti(it, "F");
    const auto x = random_floats(size_t(rows) * D, 23), wg = random_floats(size_t(D) * F, 24, 0.05),
               wu = random_floats(size_t(D) * F, 25, 0.05), wd = random_floats(size_t(F) * D, 26, 0.05),
               dy = random_floats(size_t(rows) * D, 27);
    std::vector<float> y(x.size()), dx(x.size()), dwg(wg.size()), dwu(wu.size()), dwd(wd.size());
    SwigluCache cache;
    swiglu_forward<float>(x.data(), rows, D, F, wg.data(), wu.data(), wd.data(), y.data(), cache);
    if (op == "swiglu_fwd")
      return time_calls(lim, [&] { SwigluCache c; swiglu_forward<float>(x.data(), rows, D, F, wg.data(), wu.data(), wd.data(), y.data(), c); });
    return time_calls(lim, [&] {
      swiglu_backward<float>(x.data(), dy.data(), rows, D, F, wg.data(), wu.data(), wd.data(), cache, dx.data(),
                             dwg.data(), dwu.data(), dwd.data());
    });
  }
  if (op == "ce") {
    const int64_t rows = geti(it, "rows"), V = geti(it, "V");
    const auto logits0 = random_floats(size_t(rows) * V, 28);
    std::vector<float> logits = logits0;
    std::vector<int32_t> targets(rows);
    for (int64_t r = 0; r < rows; ++r) targets[r] = static_cast<int32_t>(r % V);
    return time_calls(lim, [&] { cross_entropy_forward_backward<float>(logits.data(), rows, V, targets.data(), nullptr, 1e-3); },
                      [&] { logits = logits0; });
  }
  if (op == "embed_fwd" || op == "embed_bwd") {
    const int64_t rows = geti(it, "rows"), D = geti(it, "D"), V = geti(it, "V");
    const auto table = random_floats(size_t(V) * D, 29);
    std::vector<float> x(size_t(rows) * D), dtable(table.size());
    std::vector<int32_t> tok(rows);
    for (int64_t r = 0; r < rows; ++r) tok[r] = static_cast<int32_t>(mix64(r) % static_cast<uint64_t>(V));
    if (op == "embed_fwd")
      return time_calls(lim, [&] { embedding_forward<float>(tok.data(), rows, table.data(), V, D, x.data()); });
    return time_calls(lim, [&] { embedding_backward<float>(tok.data(), rows, x.data(), D, dtable.data()); });
  }
  if (op == "adamw" || op == "sumsq" || op == "zero" || op == "scale") {
    const int64_t numel = geti(it, "numel");
    auto layout = std::make_shared<ParamLayout>();
    layout->add("w", {numel}, true);
    ParamSet<float> p(layout), g(layout);
    const auto g0 = random_floats(numel, 30, 1e-3);
    std::copy(g0.begin(), g0.end(), g.data());
    if (op == "adamw") {
      AdamW<float> opt(layout);
      OptimConfig oc;
      oc.weight_decay = 0.01;
      int64_t t = 0;
      return time_calls(lim, [&] { opt.update(oc, ++t, 1e-3, p, g); });
    }
    if (op == "sumsq") {
      double s = 0;
      Timing r = time_calls(lim, [&] { s += sum_of_squares<float>(g.data(), numel); });
      r.extra["checksum"] = s;
      return r;
    }
    if (op == "zero") return time_calls(lim, [&] { g.zero(); });
    float* gp = g.data();
    return time_calls(lim, [&] { for (int64_t i = 0; i < numel; ++i) gp[i] *= 0.999f; });
  }
  if (op == "alloc") {
    std::vector<int64_t> sizes;
    for (const auto& s : it["floats"]) sizes.push_back(s.as<int64_t>());
    return time_calls(lim, [&] {
      std::vector<Tensor> held;
      for (int64_t n : sizes) held.emplace_back(Shape{n}, DType::f32);
    });
  }
  if (op == "copy" || op == "add") {
    const int64_t n = geti(it, "floats");
    const auto src = random_floats(n, 31);
    std::vector<float> dst(n, 0.0f);
    if (op == "copy") return time_calls(lim, [&] { std::copy(src.begin(), src.end(), dst.begin()); });
    return time_calls(lim, [&] { for (int64_t i = 0; i < n; ++i) dst[i] += src[i]; });
  }
  IHA_FAIL("costmodel_bench: unknown op '", op, "'");
}

Timing run_comm(const std::string& op, const YAML::Node& it, const Limits& lim, Communicator& c) {
  const int me = c.rank();
  if (op == "allreduce") {
    const int64_t count = geti(it, "count");
    std::vector<float> buf = random_floats(count, 32, 1e-3);
    std::vector<double> t;
    for (int i = 0; i < lim.min_reps + 2; ++i) {
      c.barrier();
      const double t0 = bench::now();
      c.all_reduce(buf.data(), count, DType::f32, ReduceOp::sum, "costmodel.allreduce");
      if (i >= 2) t.push_back(bench::now() - t0);
    }
    Timing r;
    r.median_s = bench::median(t);
    r.reps = static_cast<int>(t.size());
    return r;
  }
  const size_t bytes = static_cast<size_t>(geti(it, "bytes"));
  std::vector<char> a(std::max<size_t>(bytes, 1), 1), b(std::max<size_t>(bytes, 1), 0);
  const int reps = bytes > (size_t(1) << 20) ? std::max(lim.min_reps, 10) : std::max(lim.min_reps, 50);
  std::vector<double> t;
  for (int i = 0; i < reps + 2; ++i) {
    c.barrier();
    const double t0 = bench::now();
    if (op == "pingpong") {
      if (me == 0) {
        c.exchange({{a.data(), bytes, 1}}, {}, "costmodel.pingpong");
        c.exchange({}, {{b.data(), bytes, 1}}, "costmodel.pingpong");
      } else if (me == 1) {
        c.exchange({}, {{b.data(), bytes, 0}}, "costmodel.pingpong");
        c.exchange({{b.data(), bytes, 0}}, {}, "costmodel.pingpong");
      }
      if (i >= 2) t.push_back((bench::now() - t0) / 2);
    } else {  // exchange: both send to each other at once, as the two ranks of a ring step
      if (me <= 1) {
        const int peer = 1 - me;
        c.exchange({{a.data(), bytes, peer}}, {{b.data(), bytes, peer}}, "costmodel.exchange");
      }
      if (i >= 2) t.push_back(bench::now() - t0);
    }
  }
  Timing r;
  r.median_s = bench::median(t);
  r.reps = static_cast<int>(t.size());
  return r;
}

double cpu_seconds() {
  rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string read_loadavg() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a + " " + b + " " + c;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char ch : s) {
    if (ch == '"' || ch == '\\') o += '\\';
    o += ch;
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator& world = *mpi.world();
  bench::Args args(argc, argv);
  const int procs = world.size(), me = world.rank();
  const std::string plan_path = args.str("plan", ""), out_path = args.str("json", "");
  if (plan_path.empty()) {
    if (me == 0) std::fprintf(stderr, "usage: costmodel_bench --plan plan.json [--json out.json]\n");
    return 2;
  }
  set_num_threads(1);
  YAML::Node plan;
  try {
    plan = YAML::LoadFile(plan_path);
  } catch (const std::exception& e) {
    if (me == 0) std::fprintf(stderr, "costmodel_bench: cannot read plan '%s': %s\n", plan_path.c_str(), e.what());
    return 2;
  }
  Limits lim;
  if (plan["min_time_s"]) lim.min_time_s = plan["min_time_s"].as<double>();
  if (plan["min_reps"]) lim.min_reps = plan["min_reps"].as<int>();
  if (plan["max_reps"]) lim.max_reps = plan["max_reps"].as<int>();

  const std::string load_before = read_loadavg();
  const double t_start = bench::now(), cpu_start = cpu_seconds();
  std::ostringstream items;  // this process's result lines
  bool first = true;
  int done = 0;
  for (const auto& group : plan["groups"]) {
    bench::idle_barrier(world);
    for (const auto& it : group) {
      const std::string op = it["op"].as<std::string>();
      const bool comm = op == "pingpong" || op == "exchange" || op == "allreduce";
      if (comm && procs < 2) continue;
      if (!comm && it["rank"] && it["rank"].as<int64_t>() % procs != me) continue;
      Timing t;
      try {
        if (comm) t = run_comm(op, it, lim, world);
        else if (op == "gemm") t = run_gemm(it, lim);
        else if (op == "flash_fwd" || op == "flash_bwd") t = run_flash(it, lim, op == "flash_bwd");
        else t = run_elementwise(op, it, lim);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "costmodel_bench (process %d): item '%s': %s\n", me,
                     it["id"].as<std::string>().c_str(), e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      if (comm && me != 0) continue;  // rank 0 reports the communication items
      items << (first ? "" : ",\n") << "  {\"id\": \"" << json_escape(it["id"].as<std::string>())
            << "\", \"process\": " << me << ", \"seconds\": " << t.median_s << ", \"reps\": " << t.reps;
      for (const auto& [k, v] : t.extra) items << ", \"" << k << "\": " << v;
      items << "}";
      first = false;
      ++done;
    }
  }
  // CPU share of this process while it measured (barrier sleeps excluded): well below 1 means
  // another user's job took part of its core.
  const double elapsed_mine = bench::now() - t_start, cpu_mine = cpu_seconds() - cpu_start;
  bench::idle_barrier(world);
  const double elapsed = bench::now() - t_start;
  double share = cpu_mine / elapsed_mine;
  std::vector<double> shares(procs);
  MPI_Gather(&share, 1, MPI_DOUBLE, shares.data(), 1, MPI_DOUBLE, 0, mpi_handle(world));

  // Gather every process's lines on process 0.
  const std::string mine = items.str();
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(procs);
  MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, mpi_handle(world));
  std::vector<int> offs(procs, 0);
  int total = 0;
  for (int p = 0; p < procs; ++p) {
    offs[p] = total;
    total += lens[p];
  }
  std::string all(me == 0 ? total : 0, ' ');
  MPI_Gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), offs.data(), MPI_CHAR, 0, mpi_handle(world));
  if (me == 0) {
    std::ostringstream out;
    out << "{\"processes\": " << procs << ", \"plan\": \"" << json_escape(plan_path)
        << "\", \"loadavg_before\": \"" << load_before << "\", \"loadavg_after\": \"" << read_loadavg()
        << "\", \"elapsed_s\": " << elapsed << ", \"cpu_share\": [";
    for (int p = 0; p < procs; ++p) out << (p ? ", " : "") << shares[p];
    out << "],\n \"items\": [\n";
    bool f = true;
    for (int p = 0; p < procs; ++p) {
      if (lens[p] == 0) continue;
      out << (f ? "" : ",\n") << all.substr(offs[p], lens[p]);
      f = false;
    }
    out << "\n]}\n";
    if (out_path.empty()) std::fputs(out.str().c_str(), stdout);
    else std::ofstream(out_path) << out.str();
    std::fprintf(stderr, "costmodel_bench: %d processes, %.1f s, load %s -> %s\n", procs, elapsed,
                 load_before.c_str(), read_loadavg().c_str());
  }
  return 0;
}
