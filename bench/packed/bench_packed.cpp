// Packed documents (DESIGN.md section 10): what the document mask costs and saves.
//   1. Kernel work: pairs the CPU flash kernel computes (its own FlashStats counter) against
//      the visible pairs, for lognormal documents (sigma 1) of several means, at N*P = 8k and 16k.
//   2. Balance: max/mean visible pairs and tokens per rank of 64k-token sequences of lognormal
//      documents (mean 2k tokens) at R = 4 and 8 for contiguous, zigzag and balanced; worst and
//      mean over the seeds, each seed one micro-batch of one sequence.
//   3. Ring and halo plans with segments at R = world size: visiting blocks skipped and K/V
//      bytes not sent, from the engines' plans (SegmentSavings; no attention is run).
// Work and balance are counts, exact and machine-independent; run with
//   mpiexec -n 4 build/bench/packed/bench_packed   (and -n 8 --oversubscribe)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "attention/flash.h"
#include "attention/layer.h"
#include "parallel/comm.h"
#include "parallel/layout.h"
#include "ringattn/ringattn.h"

using namespace iha;

namespace {

// Document starts of a sequence of N tokens cut from a stream of lognormal documents: the
// first document starts at a uniform offset into one (a sequence is a window of the stream).
std::vector<int64_t> lognormal_starts(int64_t N, double mean, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const double sigma = 1.0, mu = std::log(mean) - sigma * sigma / 2;
  std::lognormal_distribution<double> len(mu, sigma);
  std::vector<int64_t> s = {0};
  int64_t t = -static_cast<int64_t>(std::uniform_real_distribution<double>(0, 1)(rng) * mean);
  while (true) {
    t += std::max<int64_t>(1, static_cast<int64_t>(std::llround(len(rng))));
    if (t >= N) break;
    if (t > 0) s.push_back(t);
  }
  return s;
}

void kernel_work() {
  std::printf("kernel work (float, d=64, P=2, flat_causal, default tiles): computed / visible pairs\n");
  std::printf("%8s %10s %8s %14s %14s %8s\n", "N*P", "doc mean", "docs", "visible", "computed", "ratio");
  const int64_t d = 64, P = 2;
  for (int64_t NP : {8192, 16384})
    for (double mean : {64.0, 512.0, 1024.0, 2048.0}) {
      const int64_t N = NP / P;
      const std::vector<int64_t> starts = lognormal_starts(N, mean, 11);
      std::vector<int64_t> tokens(N), pos(NP);
      for (int64_t i = 0; i < N; ++i) tokens[i] = i;
      for (int64_t t = 0; t < NP; ++t) pos[t] = t;
      const std::vector<int64_t> seg = row_segment_starts(starts, tokens, P);
      MaskSpec m{MaskKind::flat_causal, P, 0, 1.0};
      m.q_seg = seg.data();
      int64_t visible = 0;
      for (int64_t t = 0; t < NP; ++t) visible += t - seg[t] + 1;
      std::vector<float> q(NP * d, 0.01f), k(NP * d, 0.02f), v(NP * d, 0.5f), o(NP * d), lse(NP);
      const FlashStats st = flash_forward<float>(m, d, q.data(), pos.data(), NP, k.data(), v.data(), pos.data(), NP,
                                                 o.data(), lse.data());
      std::printf("%8lld %10.0f %8zu %14lld %14lld %8.4f\n", static_cast<long long>(NP), mean, starts.size(),
                  static_cast<long long>(visible), static_cast<long long>(st.pairs_computed),
                  static_cast<double>(st.pairs_computed) / static_cast<double>(visible));
    }
}

void balance() {
  const int64_t N = 65536, seeds = 8;
  const PairCost cost{2, 0, false};
  std::printf("\nbalance: N=%lld tokens, P=2, flat_causal, lognormal documents mean 2048, %lld sequences\n",
              static_cast<long long>(N), static_cast<long long>(seeds));
  std::printf("%4s %12s %16s %16s %16s %16s\n", "R", "layout", "pairs max/mean", "(worst seed)", "tokens max/mean",
              "(worst seed)");
  for (int64_t R : {4, 8})
    for (const char* name : {"contiguous", "zigzag", "balanced"}) {
      double pr_sum = 0, pr_worst = 0, tk_sum = 0, tk_worst = 0;
      for (int64_t sd = 0; sd < seeds; ++sd) {
        const std::vector<int64_t> st = lognormal_starts(N, 2048, 100 + sd);
        std::vector<std::vector<int64_t>> tok;
        if (std::string(name) == "balanced") {
          tok = balanced_tokens(N, R, {cost}, {st});
        } else {
          const SequenceLayout L(parse_layout(name), N, R);
          for (int64_t r = 0; r < R; ++r) tok.push_back(L.tokens_of(r));
        }
        std::vector<double> pairs, counts;
        for (const auto& t : tok) {
          double p = 0;
          for (int64_t n : t) p += static_cast<double>(token_pairs(cost, n, segment_start_of(st, n)));
          pairs.push_back(p);
          counts.push_back(static_cast<double>(t.size()));
        }
        auto ratio = [&](const std::vector<double>& x) {
          double s = 0, mx = 0;
          for (double v : x) s += v, mx = std::max(mx, v);
          return mx / (s / static_cast<double>(x.size()));
        };
        const double pr = ratio(pairs), tk = ratio(counts);
        pr_sum += pr, tk_sum += tk, pr_worst = std::max(pr_worst, pr), tk_worst = std::max(tk_worst, tk);
      }
      std::printf("%4lld %12s %16.4f %16.4f %16.4f %16.4f\n", static_cast<long long>(R), name, pr_sum / seeds,
                  pr_worst, tk_sum / seeds, tk_worst);
    }
}

int64_t sum_all(Communicator& c, int64_t v) {
  c.all_reduce(&v, 1, DType::i64, ReduceOp::sum, "bench.sum");
  return v;
}

void plan_savings(const std::shared_ptr<Communicator>& world) {
  const int64_t R = world->size();
  LayerConfig cfg;
  cfg.D = 64; cfg.H = 4; cfg.d = 16; cfg.P = 2;
  const int64_t B = 1, N = 65536, row_bytes = 2 * cfg.H * cfg.d * 4 * B;  // pre-mix K and V, float
  if (world->rank() == 0)
    std::printf("\nring / halo plans at R=%lld, N=%lld, P=2, lognormal documents (float K/V, H*d=%lld)\n",
                static_cast<long long>(R), static_cast<long long>(N), static_cast<long long>(cfg.H * cfg.d));
  if (world->rank() == 0)
    std::printf("%6s %10s %6s %10s %16s %16s %8s\n", "core", "layout", "mean", "blocks", "skipped", "MB sent",
                "saved");
  for (int64_t W : {int64_t(0), int64_t(4096)})
    for (LayoutKind L : {LayoutKind::contiguous, LayoutKind::zigzag})
      for (double mean : {512.0, 2048.0, 8192.0}) {
        LayerConfig lc = cfg;
        lc.window_virtual = W;
        auto core = make_sequence_parallel_core<float>(lc, N, world, {L, {}, 1});
        core->set_segments({lognormal_starts(N, mean, 7)});
        const SegmentSavings s = core->savings();
        const int64_t blocks = sum_all(*world, s.blocks_unmasked), skipped = sum_all(*world, s.blocks_skipped());
        const int64_t tokens = sum_all(*world, s.tokens), unmasked = sum_all(*world, s.tokens_unmasked);
        if (world->rank() == 0)
          std::printf("%6s %10s %6.0f %10lld %16lld %16.2f %7.1f%%\n", W > 0 ? "halo" : "ring", layout_name(L), mean,
                      static_cast<long long>(blocks), static_cast<long long>(skipped),
                      static_cast<double>(tokens * row_bytes) / 1e6,
                      unmasked ? 100.0 * static_cast<double>(unmasked - tokens) / static_cast<double>(unmasked) : 0.0);
      }
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  if (mpi.world()->rank() == 0) {
    kernel_work();
    balance();
  }
  plan_savings(mpi.world());
  return 0;
}
