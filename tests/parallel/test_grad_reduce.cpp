// Bucketed gradient all-reduce and reduce-scatter and the shard layout of sharded state, under
// mpiexec with 1-4 ranks.
#include <gtest/gtest.h>

#include <numeric>

#include "mpi_env.h"
#include "parallel/grad_reduce.h"

namespace iha {
namespace {

using test::world;

TEST(GradientBuckets, SumsExactlyWhateverTheReadyOrder) {
  const int R = world().size(), r = world().rank();
  const std::vector<int64_t> sizes = {5, 1, 300, 7, 64, 2, 1000, 3};
  const int64_t total = std::accumulate(sizes.begin(), sizes.end(), int64_t(0));
  for (int64_t bucket_bytes : {int64_t(8), int64_t(1024), int64_t(1) << 20}) {
    GradientBuckets gb(test::world_ptr(), sizes, DType::f64, bucket_bytes);
    if (bucket_bytes == 8) {
      EXPECT_EQ(gb.num_buckets(), static_cast<int64_t>(sizes.size()));
    }
    if (bucket_bytes == (int64_t(1) << 20)) {
      EXPECT_EQ(gb.num_buckets(), 1);
    }
    for (int step = 0; step < 2; ++step) {
      std::vector<double> buf(total);
      for (int64_t i = 0; i < total; ++i) buf[i] = (r + 1) * 0.5 + i + step;  // exact in binary
      gb.begin(buf.data());
      // Backward order: last tensors first; leave some unmarked for finish() to start.
      for (int64_t t = static_cast<int64_t>(sizes.size()) - 1; t >= 2; --t) {
        gb.mark_ready(t);
        gb.progress();
      }
      gb.finish();
      for (int64_t i = 0; i < total; ++i)
        ASSERT_EQ(buf[i], 0.5 * R * (R + 1) / 2.0 + R * double(i + step)) << "element " << i;
    }
  }
}

// Tensors another group reduces (reduced[t] = 0) are left as they are, whatever the bucket
// size; a bucket never holds both kinds.
TEST(GradientBuckets, LeavesTensorsReducedElsewhereAlone) {
  const int R = world().size(), r = world().rank();
  const std::vector<int64_t> sizes = {5, 1, 300, 7, 64, 2, 1000, 3};
  const std::vector<char> reduced = {1, 0, 0, 1, 1, 0, 1, 1};
  std::vector<int64_t> offset(sizes.size() + 1, 0);
  for (size_t t = 0; t < sizes.size(); ++t) offset[t + 1] = offset[t] + sizes[t];
  for (int64_t bucket_bytes : {int64_t(8), int64_t(1024), int64_t(1) << 20}) {
    GradientBuckets gb(test::world_ptr(), sizes, DType::f64, bucket_bytes, "test.grad", reduced);
    for (const ShardUnit& u : gb.units().units())
      for (int64_t t = u.first_tensor; t < u.end_tensor; ++t) EXPECT_EQ(reduced[t], reduced[u.first_tensor]);
    if (bucket_bytes == (int64_t(1) << 20)) {
      EXPECT_EQ(gb.num_buckets(), 3);  // {0}, {3, 4}, {6, 7}
    }
    std::vector<double> buf(offset.back());
    for (int64_t i = 0; i < offset.back(); ++i) buf[i] = (r + 1) * 0.5 + i;
    gb.begin(buf.data());
    for (int64_t t = static_cast<int64_t>(sizes.size()) - 1; t >= 0; --t) gb.mark_ready(t);
    gb.finish();
    for (size_t t = 0; t < sizes.size(); ++t)
      for (int64_t i = offset[t]; i < offset[t + 1]; ++i)
        ASSERT_EQ(buf[i], reduced[t] ? 0.5 * R * (R + 1) / 2.0 + R * double(i) : (r + 1) * 0.5 + i)
            << "tensor " << t << " element " << i;
  }
}

TEST(GradientBuckets, MisuseIsAnError) {
  GradientBuckets gb(test::world_ptr(), {4, 4}, DType::f32, 1 << 20);
  std::vector<float> buf(8, 1.0f);
  gb.begin(buf.data());
  EXPECT_THROW(gb.mark_ready(5), Error);
  gb.mark_ready(0);
  EXPECT_THROW(gb.mark_ready(0), Error);
  gb.finish();
}

// Every buffer element is held by exactly one rank, each tensor's piece of a rank's shard is
// one flat range at the right local place, and the windows fit window_end().
void check_layout(const ShardLayout& sl, const std::vector<int64_t>& sizes) {
  const int64_t R = sl.ranks();
  int64_t L = 0;
  for (int64_t n : sizes) L += n;
  ASSERT_EQ(sl.total(), L);
  std::vector<int> owner(static_cast<size_t>(L), 0);
  for (int64_t r = 0; r < R; ++r) {
    int64_t held = 0;
    for (const ShardRange& p : sl.ranges(r)) {
      EXPECT_LE(p.local + p.size(), sl.shard_size());
      for (int64_t e = p.begin; e < p.end; ++e) owner[e] += 1;
      held += p.size();
    }
    EXPECT_EQ(held, sl.held(r));
    int64_t off = 0;
    for (int64_t t = 0; t < static_cast<int64_t>(sizes.size()); ++t) {
      const ShardRange tp = sl.tensor_piece(t, r);
      EXPECT_GE(tp.begin, off);
      EXPECT_LE(tp.end, off + sizes[t]);
      if (tp.size() > 0) {
        const ShardRange up = sl.piece(sl.unit_of(t), r);
        EXPECT_EQ(tp.local, up.local + (tp.begin - up.begin));
      }
      off += sizes[t];
    }
  }
  for (int64_t e = 0; e < L; ++e) EXPECT_EQ(owner[e], 1) << "element " << e;
  for (const ShardUnit& u : sl.units()) {
    EXPECT_LE(u.offset + R * u.chunk, sl.window_end());
    EXPECT_EQ(u.chunk, (u.count + R - 1) / R);
  }
  EXPECT_LE(sl.window_end(), L + R - 1);
}

TEST(ShardLayout, EachElementHasOneOwnerAndTensorPiecesAreContiguous) {
  const std::vector<int64_t> sizes = {5, 1, 17, 3, 3, 40, 2, 9};
  for (int64_t R = 1; R <= 5; ++R) {
    SCOPED_TRACE("R = " + std::to_string(R));
    check_layout(ShardLayout::whole(sizes, R), sizes);
    for (int64_t bucket : {8, 64, 1 << 20}) check_layout(ShardLayout::bucketed(sizes, 8, bucket, R), sizes);
  }
  // Whole: one contiguous range per rank, the classic ZeRO-1 split.
  const ShardLayout w = ShardLayout::whole(sizes, 4);
  ASSERT_EQ(w.units().size(), 1u);
  EXPECT_EQ(w.shard_size(), (80 + 3) / 4);
  EXPECT_EQ(w.piece(0, 3).begin, 60);
  // Bucketed: units formed from the end backwards, tensor boundaries kept.
  const ShardLayout b = ShardLayout::bucketed(sizes, 8, 8 * 10, 2);
  ASSERT_EQ(b.units().size(), 4u);  // {2, 9}: 11 >= 10; {40}; {17, 3, 3}: 23; {5, 1}
  EXPECT_EQ(b.units()[3].first_tensor, 6);
  EXPECT_EQ(b.units()[2].first_tensor, 5);
  EXPECT_EQ(b.units()[1].first_tensor, 2);
  EXPECT_EQ(b.units()[1].count, 23);
  EXPECT_EQ(b.units()[1].chunk, 12);
  EXPECT_EQ(b.units()[1].local_offset, 3);
  EXPECT_EQ(b.shard_size(), 3 + 12 + 20 + 6);
  EXPECT_THROW(ShardLayout(sizes, {0, 3, 2}, 2), Error);
  EXPECT_THROW(ShardLayout(sizes, {1}, 2), Error);
}

// Levels 2 and 3 with tp: a unit per group, or the group's replicated tensors (over all R ranks,
// padded in front when shards follow) and its shards (over R / tp). What each rank's shard holds,
// put through the all-gathers (rank r's chunk at window position chunk_index * chunk), gives every
// unit's elements in order from its lead on; the two windows of a group lie back to back; each
// replicated element has one owner among all ranks, each shard element one per tp index.
TEST(ShardLayout, GroupsWithTensorParallelShards) {
  // Groups: {0: split}, {1, 2, 3: replicated, 4, 5: split}, {6: replicated, 7: split}, {8, 9: replicated}.
  const std::vector<int64_t> sizes = {7, 3, 11, 2, 13, 6, 1, 9, 5, 4};
  const std::vector<int64_t> starts = {0, 1, 6, 8};
  const std::vector<char> split = {1, 0, 0, 0, 1, 1, 0, 1, 0, 0};
  for (int64_t tp : {1, 2, 4})
    for (int64_t R = tp; R <= 4 * tp; R += tp) {
      SCOPED_TRACE("R = " + std::to_string(R) + " tp = " + std::to_string(tp));
      const ShardLayout sl = ShardLayout::groups(sizes, starts, R, tp, split);
      const auto& units = sl.units();
      ASSERT_EQ(units.size(), tp == 1 ? 4u : 6u);
      std::vector<std::vector<int64_t>> shard(static_cast<size_t>(R), std::vector<int64_t>(sl.shard_size(), -1));
      std::vector<int> owners(static_cast<size_t>(sl.total()), 0);
      for (int64_t r = 0; r < R; ++r)
        for (size_t u = 0; u < units.size(); ++u) {
          const ShardRange p = sl.piece(static_cast<int64_t>(u), r);
          ASSERT_GE(p.local, units[u].local_offset);
          ASSERT_LE(p.local + p.size(), units[u].local_offset + units[u].chunk);
          for (int64_t e = p.begin; e < p.end; ++e) {
            shard[r][p.local + (e - p.begin)] = e;
            owners[e] += 1;
          }
        }
      int64_t local = 0;
      for (const ShardUnit& u : units) {
        EXPECT_EQ(u.ranks, u.split ? R / tp : R);
        EXPECT_EQ(u.chunk, (u.count + u.ranks - 1) / u.ranks);
        EXPECT_EQ(u.split, tp > 1 && split[u.first_tensor] != 0);
        for (int64_t e = u.offset; e < u.offset + u.count; ++e) EXPECT_EQ(owners[e], u.split ? tp : 1) << e;
        if (!u.split) local += u.chunk;
        // The all-gather of the unit from the ranks of one tp index (any index: the same places).
        std::vector<int64_t> window(static_cast<size_t>(u.window()), -2);
        const int64_t ui = &u - units.data();
        for (int64_t r = 0; r < R; ++r)
          if (!u.split || r % tp == 0)
            for (int64_t j = 0; j < u.chunk; ++j) window[sl.chunk_index(ui, r) * u.chunk + j] = shard[r][u.local_offset + j];
        for (int64_t i = 0; i < u.window(); ++i)
          EXPECT_EQ(window[i], i >= u.lead && i < u.lead + u.count ? u.offset + i - u.lead : -1) << "unit " << ui;
        EXPECT_LE(u.window_begin() + u.window(), sl.window_end());
      }
      // The replicated units' chunks come first in the shard, so their places do not depend on the shards' sizes.
      for (const ShardUnit& u : units) EXPECT_EQ(u.local_offset < local, !u.split);
      // Group 1 (and 2): replicated then shards, windows back to back, the elements contiguous.
      if (tp > 1) {
        EXPECT_EQ(units[1].lead, units[1].window() - units[1].count);
        EXPECT_EQ(units[1].window_begin() + units[1].window(), units[2].window_begin());
        EXPECT_EQ(units[2].lead, 0);
        EXPECT_EQ(units[5].lead, 0);  // a group of replicated tensors alone: padded at the back
      }
    }
  // Shards before replicated tensors in a group: refused.
  EXPECT_THROW(ShardLayout::groups(sizes, {0, 4}, 4, 2, split), Error);
  EXPECT_THROW(ShardLayout::groups(sizes, starts, 6, 4, split), Error);  // tp does not divide R
}

}  // namespace
}  // namespace iha
