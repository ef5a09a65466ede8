// Single-process pieces of lib/checkpoint: shard runs against brute-force enumeration, the
// integrity hash and its decomposition, closed-form coverage sums, dtype rules and rounding,
// name rules, and the root lock against a second process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>

#include "checkpoint/integrity.h"
#include "checkpoint/root.h"
#include "checkpoint/schema.h"
#include "checkpoint/shard_plan.h"
#include "core/rng.h"

namespace iha::ckpt {
namespace {

// Every element of a hyperslab, in local row-major order, as its global flat index.
std::vector<int64_t> brute_force_indices(const Shape& g, const ShardSpec& s) {
  std::vector<int64_t> out;
  const int d = static_cast<int>(g.size());
  const int64_t n = s.numel(g);
  for (int64_t k = 0; k < n; ++k) {
    int64_t rem = k, flat = 0;
    std::vector<int64_t> idx(d);
    for (int j = d - 1; j >= 0; --j) {
      idx[j] = rem % s.extent[j];
      rem /= s.extent[j];
    }
    for (int j = 0; j < d; ++j) flat = flat * g[j] + s.offset[j] + idx[j];
    out.push_back(flat);
  }
  return out;
}

std::vector<int64_t> run_indices(const std::vector<FlatRun>& runs) {
  std::vector<int64_t> out;
  for (const FlatRun& r : runs) {
    EXPECT_EQ(r.local, static_cast<int64_t>(out.size()));
    for (int64_t i = 0; i < r.length; ++i) out.push_back(r.global + i);
  }
  return out;
}

TEST(CheckpointRuns, HyperslabsMatchBruteForce) {
  Rng rng{7, 0};
  for (int trial = 0; trial < 300; ++trial) {
    const int d = 1 + static_cast<int>(rng.next_below(4));
    Shape g(d), off(d), ext(d);
    for (int j = 0; j < d; ++j) {
      g[j] = 1 + static_cast<int64_t>(rng.next_below(6));
      // Often whole dimensions, so runs merge across them.
      if (rng.next_below(3) == 0) {
        off[j] = 0;
        ext[j] = g[j];
      } else {
        off[j] = static_cast<int64_t>(rng.next_below(g[j]));
        ext[j] = static_cast<int64_t>(rng.next_below(g[j] - off[j] + 1));
      }
    }
    const ShardSpec s = ShardSpec::hyperslab(off, ext);
    std::vector<FlatRun> runs;
    append_piece_runs(s, g, 0, runs);
    EXPECT_EQ(run_indices(runs), brute_force_indices(g, s)) << s.str() << " of " << shape_str(g);
    // Runs are maximal: no two consecutive ones touch.
    for (size_t i = 1; i < runs.size(); ++i)
      EXPECT_LT(runs[i - 1].global + runs[i - 1].length, runs[i].global);
  }
}

TEST(CheckpointRuns, ScalarsFlatRangesAndReplicated) {
  std::vector<FlatRun> runs;
  append_piece_runs(ShardSpec::hyperslab({}, {}), {}, 0, runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].length, 1);
  runs.clear();
  append_piece_runs(ShardSpec::flat_range(5, 11), {4, 4}, 2, runs);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].global, 5);
  EXPECT_EQ(runs[0].length, 6);
  EXPECT_EQ(runs[0].piece, 2);
  runs.clear();
  append_piece_runs(ShardSpec::replicated(), {0, 3}, 0, runs);
  EXPECT_TRUE(runs.empty());
}

TEST(CheckpointRuns, OverlappingPiecesOnOneRankAreRefused) {
  std::vector<FlatRun> runs;
  append_piece_runs(ShardSpec::flat_range(0, 10), {20}, 0, runs);
  append_piece_runs(ShardSpec::flat_range(9, 12), {20}, 1, runs);
  EXPECT_THROW(sort_runs("t", runs), ConfigError);
  runs.clear();
  append_piece_runs(ShardSpec::flat_range(10, 20), {20}, 0, runs);
  append_piece_runs(ShardSpec::flat_range(0, 10), {20}, 1, runs);
  sort_runs("t", runs);
  EXPECT_EQ(runs[0].piece, 1);
}

TEST(CheckpointRuns, DigestIdentifiesTheElementSetNotItsPieces) {
  std::vector<FlatRun> a, b, c;
  append_piece_runs(ShardSpec::flat_range(0, 16), {4, 4}, 0, a);
  append_piece_runs(ShardSpec::hyperslab({0, 0}, {2, 4}), {4, 4}, 0, b);
  append_piece_runs(ShardSpec::hyperslab({2, 0}, {2, 4}), {4, 4}, 1, b);
  sort_runs("b", b);
  append_piece_runs(ShardSpec::flat_range(0, 15), {4, 4}, 0, c);
  EXPECT_EQ(runs_digest(a), runs_digest(b));
  EXPECT_NE(runs_digest(a), runs_digest(c));
  EXPECT_EQ(runs_digest({}), 0u);
}

TEST(CheckpointRuns, DutiesPartitionTheSequence) {
  std::vector<FlatRun> runs;
  append_piece_runs(ShardSpec::hyperslab({1, 1}, {3, 2}), {5, 4}, 0, runs);
  const std::vector<int64_t> all = run_indices(runs);
  for (int64_t g = 1; g <= 7; ++g) {
    std::vector<int64_t> joined;
    for (int64_t k = 0; k < g; ++k) {
      int64_t lo, hi;
      duty_bounds(runs_numel(runs), k, g, lo, hi);
      for (const FlatRun& r : sub_runs(runs, lo, hi))
        for (int64_t i = 0; i < r.length; ++i) joined.push_back(r.global + i);
    }
    EXPECT_EQ(joined, all) << g << " holders";
  }
}

TEST(CheckpointIntegrity, ClosedFormSumsMatchLoops) {
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 0}, {0, 1}, {0, 7}, {5, 6}, {3, 1000}, {(int64_t(1) << 40) - 5, (int64_t(1) << 40) + 9},
      {(int64_t(1) << 33) + 1, (int64_t(1) << 33) + 200}};
  for (const auto& [b, e] : ranges) {
    uint64_t s1 = 0, s2 = 0;
    for (int64_t i = b; i < e; ++i) {
      s1 += static_cast<uint64_t>(i);
      s2 += static_cast<uint64_t>(i) * static_cast<uint64_t>(i);
    }
    EXPECT_EQ(index_sum(b, e), s1) << b << ".." << e;
    EXPECT_EQ(index_square_sum(b, e), s2) << b << ".." << e;
  }
}

TEST(CheckpointIntegrity, HashDecomposesAndDetectsChanges) {
  std::vector<uint32_t> v(1 << 20);
  Rng rng{3, 0};
  for (uint32_t& x : v) x = static_cast<uint32_t>(rng.next_u64());
  // The documented formula, term by term.
  uint64_t ref = 0;
  for (size_t i = 0; i < v.size(); ++i)
    ref += mix64(static_cast<uint64_t>(v[i]) ^ (static_cast<uint64_t>(i + 100) * kHashIndexMul));
  EXPECT_EQ(hash_elements(v.data(), 4, v.size(), 100), ref);
  EXPECT_EQ(hash_elements(v.data(), 4, v.size(), 100, 4), ref);  // threads do not matter
  // Any split into pieces sums to the same value.
  const int64_t cut1 = 12345, cut2 = 777777;
  EXPECT_EQ(hash_elements(v.data(), 4, cut1, 100) +
                hash_elements(v.data() + cut1, 4, cut2 - cut1, 100 + cut1) +
                hash_elements(v.data() + cut2, 4, v.size() - cut2, 100 + cut2),
            ref);
  // A flipped bit, a swap of two elements, a zeroed run, a shift all change it.
  auto changed = [&](std::vector<uint32_t> w) { return hash_elements(w.data(), 4, w.size(), 100) != ref; };
  auto w = v;
  w[5000] ^= 1u << 17;
  EXPECT_TRUE(changed(w));
  w = v;
  std::swap(w[10], w[20]);
  EXPECT_TRUE(changed(w));
  w = v;
  std::fill(w.begin() + 64, w.begin() + 128, 0u);
  EXPECT_TRUE(changed(w));
  EXPECT_NE(hash_elements(v.data(), 4, v.size(), 101), ref);
  // Element widths: bf16 bits are zero-extended.
  const uint16_t h[3] = {0x3f80, 0xbf80, 0x0001};
  EXPECT_EQ(hash_elements(h, 2, 3, 0),
            element_hash(0, 0x3f80) + element_hash(1, 0xbf80) + element_hash(2, 1));
}

TEST(CheckpointDtypeRules, Table) {
  EXPECT_EQ(classify_conversion(DType::f32, DType::f32), Conversion::same);
  EXPECT_EQ(classify_conversion(DType::bf16, DType::f32), Conversion::widen);
  EXPECT_EQ(classify_conversion(DType::f32, DType::f64), Conversion::widen);
  EXPECT_EQ(classify_conversion(DType::i32, DType::i64), Conversion::widen);
  EXPECT_EQ(classify_conversion(DType::f32, DType::bf16), Conversion::narrow);
  EXPECT_EQ(classify_conversion(DType::f64, DType::f32), Conversion::narrow);
  EXPECT_EQ(classify_conversion(DType::f64, DType::bf16), Conversion::narrow);
  EXPECT_EQ(classify_conversion(DType::i64, DType::i32), Conversion::invalid);
  EXPECT_EQ(classify_conversion(DType::i32, DType::f32), Conversion::invalid);
  EXPECT_EQ(classify_conversion(DType::f32, DType::i32), Conversion::invalid);
}

// Nearest bf16 to d, ties to even, by comparing the two neighbours exactly in double.
uint16_t nearest_bf16(double d) {
  float t = static_cast<float>(d);
  uint32_t u;
  std::memcpy(&u, &t, 4);
  // Candidates: the bf16 values bracketing d.
  uint16_t lo = static_cast<uint16_t>(u >> 16);
  auto val = [](uint16_t b) {
    uint32_t x = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return static_cast<double>(f);
  };
  // Walk to the pair (a, b) of adjacent bf16 with |a| <= |d| <= |b|.
  while (std::fabs(val(lo)) > std::fabs(d)) --lo;
  uint16_t hi = lo;
  while (std::fabs(val(hi)) < std::fabs(d)) ++hi;
  if (hi == lo) return lo;
  const double da = std::fabs(d - val(lo)), db = std::fabs(val(hi) - d);
  if (da < db) return lo;
  if (db < da) return hi;
  return (lo & 1) ? hi : lo;
}

TEST(CheckpointDtypeRules, F64ToBf16RoundsOnce) {
  auto val = [](uint16_t b) {
    uint32_t x = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, 4);
    return static_cast<double>(f);
  };
  Rng rng{11, 0};
  for (int i = 0; i < 30000; ++i) {
    // Exact midpoints between neighbouring bf16 values and their double neighbours: where a
    // detour through f32 would round twice.
    const uint16_t exponent = static_cast<uint16_t>(100 + rng.next_below(50));
    const uint16_t b = static_cast<uint16_t>((rng.next_below(2) << 15) | (exponent << 7) |
                                             rng.next_below(128));
    const double m = val(b) + (val(static_cast<uint16_t>(b + 1)) - val(b)) / 2;
    const double d = i % 3 == 0 ? m : std::nextafter(m, i % 3 == 1 ? 1e300 : -1e300);
    uint16_t got;
    convert_elements(DType::f64, DType::bf16, &d, &got, 1);
    ASSERT_EQ(got, nearest_bf16(d)) << d;
  }
  // Just above a tie rounds up; via f32 it would round to the tie, then down to even.
  const double tie_plus = 1.0 + 0x1.0p-8 + 0x1.0p-40;
  uint16_t got;
  convert_elements(DType::f64, DType::bf16, &tie_plus, &got, 1);
  EXPECT_EQ(got, 0x3f81);
}

TEST(CheckpointNames, Rules) {
  check_name("tensor", "model/layers.0/w_q-1");
  for (const char* bad : {"", "/a", "a/", "a//b", "a/../b", "a b", "a:b", "ä"})
    EXPECT_THROW(check_name("tensor", bad), ConfigError) << bad;
}

}  // namespace
// A second process is refused while the first holds the lock, and gets it once the first
// is killed with SIGKILL (nothing to clean up, as for a requeued job).
TEST(CheckpointRootLock, ExclusiveAcrossProcessesAndReleasedByKill9) {
  const std::string root = "/tmp/iha_ckpt_lock_" + std::to_string(::getpid());
  std::filesystem::remove_all(root);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    RootLock lock(root);
    const char ok = 'y';
    if (::write(ready[1], &ok, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char got = 0;
  ASSERT_EQ(::read(ready[0], &got, 1), 1);
  ::close(ready[0]);
  try {
    RootLock second(root);
    ADD_FAILURE() << "a second process got the lock";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("in use by another run (pid " + std::to_string(child) + "@"), std::string::npos) << msg;
    EXPECT_NE(msg.find(root + "/lock"), std::string::npos) << msg;
  }
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  {
    RootLock again(root);
    RootLock nested(root);  // the same process: shared, not refused
  }
  std::filesystem::remove_all(root);
}

}  // namespace iha::ckpt
