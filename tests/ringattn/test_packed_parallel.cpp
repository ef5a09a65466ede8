// Packed documents through the distributed cores (DESIGN.md section 10), under mpiexec with
// 1-4 ranks: ring, halo and the windowed ring (pre-mix exchange, contiguous and zigzag), and
// the replica cores on every mesh of the world (sequence scheme, and the head scheme: Ulysses
// and 2D), each against every segment run as its own sequence on one device, float64 within
// 1e-12. Documents: one-token ones, ones longer than a chunk and than a window, windows longer
// than a document, empty chunks (N < 2R). Also what the segments save: blocks skipped and
// bytes not sent, against the communicator's byte counters.
#include <gtest/gtest.h>

#include "attention/layer.h"
#include "mpi_env.h"
#include "parallel/mesh.h"
#include "reference/compare.h"
#include "reference/fixtures.h"
#include "reference/packed.h"
#include "ringattn/ringattn.h"

namespace iha {
namespace {

using test::close_normwise;
using test::local_rows;
using test::max_abs;
using test::world;

struct Case {
  MaskKind mask;
  int64_t P, N, window;
  int variant;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(mask_name(c.mask)) + "_P" + std::to_string(c.P) + "_N" + std::to_string(c.N) + "_W" +
         std::to_string(c.window) + "_v" + std::to_string(c.variant);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int v : {0, 1, 2}) {
    out.push_back({MaskKind::flat_causal, 2, 13, 0, v});
    out.push_back({MaskKind::token_causal, 3, 11, 4, v});    // window shorter than the long documents
    out.push_back({MaskKind::flat_causal, 1, 13, 20, v});    // window longer than every document
  }
  out.push_back({MaskKind::flat_causal, 2, 3, 0, 0});       // empty chunks at 2-4 ranks
  out.push_back({MaskKind::token_causal, 2, 3, 3, 1});
  return out;
}

// H divisible by the head degrees 1, 2, 4.
LayerConfig cfg_of(const Case& c) { return test::packed_layer(c.mask, c.P, c.window, 4, 2, 50.0); }

struct Inputs {
  LayerConfig cfg;
  SegmentStarts starts;
  IhaWeights<double> w;
  Tensor x, g;
  test::PackedOracle o;
};

Inputs inputs_of(const Case& c) {
  Inputs in{cfg_of(c), test::packed_starts(c.N, c.variant), {}, {}, {}, {}};
  in.w = test::random_weights<double>(in.cfg, 31);
  in.x = test::random_tensor<double>({2, c.N, in.cfg.D}, 32, "x");
  in.g = test::random_tensor<double>({2, c.N, in.cfg.D}, 33, "dz");
  in.o = test::run_segments(in.cfg, in.starts, in.w, in.x, in.g);
  return in;
}

void expect_core_matches(const Inputs& in, const std::shared_ptr<AttentionCore<double>>& core,
                         const std::vector<int64_t>& tokens, bool reduce = true) {
  IhaLayer<double> layer(in.cfg, core);
  layer.core().set_segments(in.starts);
  ASSERT_EQ(layer.core().local_tokens(), static_cast<int64_t>(tokens.size()));
  IhaLayer<double>::Cache cache;
  Tensor z, dx;
  auto grads = IhaWeights<double>::zeros(in.cfg);
  layer.forward(in.w, local_rows(in.x, tokens), z, cache);
  layer.backward(in.w, local_rows(in.g, tokens), cache, dx, grads);
  if (reduce) layer.reduce_gradients(grads);
  EXPECT_TRUE(close_normwise(test::flat(z), test::flat(local_rows(in.o.z, tokens)), 1e-12, "z", max_abs(in.o.z)));
  EXPECT_TRUE(close_normwise(test::flat(dx), test::flat(local_rows(in.o.dx, tokens)), 1e-12, "dx", max_abs(in.o.dx)));
  auto a = grads.named();
  auto b = in.o.grads.named();
  double scale = 0;
  for (const auto& nt : b) scale = std::max(scale, max_abs(*nt.second));
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(close_normwise(test::flat(*a[i].second), test::flat(*b[i].second), 1e-12, "d" + a[i].first,
                               max_abs(*b[i].second) < 1e-8 * scale ? scale : 0.0));
}

class PackedParallel : public ::testing::TestWithParam<Case> {};

TEST_P(PackedParallel, SequenceCoresMatchEachSegmentAlone) {
  const Case c = GetParam();
  const Inputs in = inputs_of(c);
  for (LayoutKind L : {LayoutKind::contiguous, LayoutKind::zigzag}) {
    SCOPED_TRACE(layout_name(L));
    const SeqParallelOptions opt{L, FlashTiles{3, 4}, 2};
    const auto tokens = SequenceLayout(L, c.N, world().size()).tokens_of(world().rank());
    expect_core_matches(in, make_ring_core<double>(in.cfg, c.N, test::world_ptr(), opt), tokens);
    if (c.window > 0) expect_core_matches(in, make_halo_core<double>(in.cfg, c.N, test::world_ptr(), opt), tokens);
  }
}

TEST_P(PackedParallel, ReplicaCoresMatchEachSegmentAloneOnEveryMesh) {
  const Case c = GetParam();
  const Inputs in = inputs_of(c);
  const int64_t R = world().size();
  for (int64_t hp = 1; hp <= R; ++hp) {
    if (R % hp != 0 || in.cfg.H % hp != 0) continue;
    const MeshShape shape{1, hp, R / hp};
    SCOPED_TRACE(shape.str());
    ProcessMesh mesh(test::world_ptr(), shape);
    for (ParallelScheme scheme : {ParallelScheme::sequence, ParallelScheme::head}) {
      const LayoutKind L = scheme == ParallelScheme::head ? LayoutKind::zigzag : LayoutKind::contiguous;
      const auto tokens = ReplicaLayout(L, c.N, shape.sp, shape.hp).tokens_of(mesh.sp_index(), mesh.hp_index());
      expect_core_matches(in, make_replica_core<double>(in.cfg, c.N, ReplicaGroups::from(mesh), scheme,
                                                        {L, FlashTiles{3, 4}}),
                          tokens);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllCases, PackedParallel, ::testing::ValuesIn(cases()), case_name);

// The engines take a new token map per micro-batch: the balanced layout of each micro-batch's
// boundaries, on the same core, one micro-batch after another, ring and halo, matches each
// segment alone; so do the replica cores of both schemes on every mesh.
TEST(PackedBalanced, ANewTokenMapPerMicroBatchMatchesEachSegmentAlone) {
  const int64_t R = world().size();
  for (int64_t W : {int64_t(0), int64_t(5)}) {
    const Case c{MaskKind::flat_causal, 2, 29, W, 0};
    LayerConfig cfg = cfg_of(c);
    auto ring = make_sequence_parallel_core<double>(cfg, c.N, test::world_ptr(), {LayoutKind::balanced, {3, 4}, 2});
    for (int v : {0, 1, 2}) {
      SCOPED_TRACE("micro-batch " + std::to_string(v) + " W=" + std::to_string(W));
      Case cv = c;
      cv.variant = v;
      const Inputs in = inputs_of(cv);
      const auto map = balanced_tokens(c.N, R, {PairCost{cfg.P, W, false}}, in.starts, 2);
      ring->set_token_map(map);
      expect_core_matches(in, ring, map[world().rank()]);
    }
  }
  // The replica cores of both schemes; the head scheme (Ulysses, and 2D with S > 1) re-plans
  // its all-to-all, its head group's token union and the engine over the unions.
  for (int64_t hp = 1; hp <= R; ++hp) {
    if (R % hp != 0) continue;
    const MeshShape shape{1, hp, R / hp};
    ProcessMesh mesh(test::world_ptr(), shape);
    for (ParallelScheme scheme : {ParallelScheme::sequence, ParallelScheme::head}) {
      SCOPED_TRACE(shape.str() + " " + scheme_name(scheme));
      const Case c{MaskKind::token_causal, 2, 23, 0, 1};
      if (scheme == ParallelScheme::head && cfg_of(c).H % hp != 0) continue;
      auto core = make_replica_core<double>(cfg_of(c), c.N, ReplicaGroups::from(mesh), scheme,
                                            {LayoutKind::balanced, FlashTiles{3, 4}});
      for (int v : {1, 2}) {
        Case cv = c;
        cv.variant = v;
        const Inputs in = inputs_of(cv);
        const auto map = balanced_tokens(c.N, R, {PairCost{2, 0, true}}, in.starts, 3);
        core->set_token_map(map);
        expect_core_matches(in, core, map[mesh.sp_index() * hp + mesh.hp_index()]);
      }
    }
  }
}

TEST(PackedBalanced, CoresThatKeepTheirMapRefuseANewOne) {
  LayerConfig cfg = cfg_of({MaskKind::flat_causal, 1, 8, 0, 0});
  auto local = make_local_core<double>(cfg, 8);
  EXPECT_THROW(local->set_token_map({{0, 1, 2, 3, 4, 5, 6, 7}}), ConfigError);
  auto ring = make_ring_core<double>(cfg, 8, test::world_ptr(), {});
  std::vector<std::vector<int64_t>> bad(world().size());
  bad[0] = {0, 1, 2};  // tokens 3..7 in no part
  EXPECT_THROW(ring->set_token_map(bad), Error);
}

int64_t sum_over_ranks(int64_t v) {
  world().all_reduce(&v, 1, DType::i64, ReduceOp::sum, "test.sum");
  return v;
}

// Each rank's chunk one document (contiguous layout): no rank's queries see another rank's
// keys, so every visiting ring round and every halo is skipped and nothing travels; with
// documents that cross chunks the bytes sent are exactly the tokens the plan counts.
TEST(PackedSavings, SkippedBlocksAndBytesMatchTheCounters) {
  Communicator& comm = world();
  const int64_t R = comm.size(), N = 8 * R, B = 2;
  LayerConfig cfg;
  cfg.D = 8; cfg.H = 2; cfg.d = 4; cfg.P = 2;
  const int64_t token_bytes = 2 * cfg.H * cfg.d * sizeof(double) * B;
  const auto w = test::random_weights<double>(cfg, 1);
  const SequenceLayout layout(LayoutKind::contiguous, N, R);
  const auto tokens = layout.tokens_of(comm.rank());
  const Tensor x = local_rows(test::random_tensor<double>({B, N, cfg.D}, 2, "x"), tokens);
  std::vector<int64_t> per_chunk, crossing;
  for (int64_t r = 0; r < R; ++r) per_chunk.push_back(r * 8);
  for (int64_t t = 0; t < N; t += 5) crossing.push_back(t);
  for (int64_t W : {int64_t(0), int64_t(7)}) {
    LayerConfig lc = cfg;
    lc.window_virtual = W;
    const std::string site = W > 0 ? "halo.fwd" : "ring.fwd";
    for (const auto& starts : {per_chunk, crossing}) {
      auto core = make_sequence_parallel_core<double>(lc, N, test::world_ptr(), {LayoutKind::contiguous, {}, 1});
      IhaLayer<double> layer(lc, core);
      layer.core().set_segments({starts, starts});
      IhaLayer<double>::Cache cache;
      Tensor z;
      comm.counters().reset();
      layer.forward(w, x, z, cache);
      const SegmentSavings s = layer.core().savings();
      const int64_t sent = static_cast<int64_t>(comm.counters().bytes(site));
      EXPECT_EQ(sum_over_ranks(sent), sum_over_ranks(s.tokens) * token_bytes) << site;
      // Without segments the same plan moves the unmasked count.
      auto plain = make_sequence_parallel_core<double>(lc, N, test::world_ptr(), {LayoutKind::contiguous, {}, 1});
      IhaLayer<double> plain_layer(lc, plain);
      IhaLayer<double>::Cache plain_cache;
      comm.counters().reset();
      plain_layer.forward(w, x, z, plain_cache);
      EXPECT_EQ(sum_over_ranks(static_cast<int64_t>(comm.counters().bytes(site))),
                sum_over_ranks(s.tokens_unmasked) * token_bytes)
          << site;
      if (starts == per_chunk) {
        EXPECT_EQ(s.tokens, 0) << site;
        EXPECT_EQ(s.blocks, 0) << site;
        // The ring's visiting rounds from earlier ranks, the halo's one earlier neighbour.
        const int64_t expected = W > 0 ? (comm.rank() > 0 ? 1 : 0) : comm.rank();
        EXPECT_EQ(s.blocks_skipped(), expected) << site;
      } else if (R > 1) {
        EXPECT_GT(sum_over_ranks(s.tokens), 0) << site;
      }
    }
  }
}

}  // namespace
}  // namespace iha
