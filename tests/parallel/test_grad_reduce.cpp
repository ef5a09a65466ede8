// Bucketed gradient all-reduce and the ZeRO-1 flat partition, under mpiexec with 1-4 ranks.
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

TEST(GradientBuckets, MisuseIsAnError) {
  GradientBuckets gb(test::world_ptr(), {4, 4}, DType::f32, 1 << 20);
  std::vector<float> buf(8, 1.0f);
  gb.begin(buf.data());
  EXPECT_THROW(gb.mark_ready(5), Error);
  gb.mark_ready(0);
  EXPECT_THROW(gb.mark_ready(0), Error);
  gb.finish();
}

TEST(FlatPartition, RangesCoverEachElementOnceAndTensorPiecesAreContiguous) {
  for (int64_t R = 1; R <= 5; ++R) {
    for (int64_t L : {1, 7, 64, 101}) {
      FlatPartition fp{L, R};
      EXPECT_EQ(fp.padded() % R, 0);
      int64_t covered = 0;
      for (int64_t q = 0; q < R; ++q) {
        EXPECT_LE(fp.begin(q), std::max(fp.begin(q), fp.end(q)));
        covered += std::max<int64_t>(0, fp.end(q) - fp.begin(q));
      }
      EXPECT_EQ(covered, L);
      // A tensor occupying [3, 40) of the buffer splits into per-rank pieces that tile it.
      const int64_t tb = std::min<int64_t>(3, L), te = std::min<int64_t>(40, L);
      int64_t sum = 0;
      for (int64_t q = 0; q < R; ++q) {
        const auto [a, b] = fp.piece(q, tb, te);
        sum += b - a;
      }
      EXPECT_EQ(sum, te - tb);
    }
  }
}

}  // namespace
}  // namespace iha
