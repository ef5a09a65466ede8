#include <gtest/gtest.h>

#include <cmath>

#include "core/bf16.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace iha {
namespace {

TEST(Tensor, OwningIsZeroedAndAligned) {
  Tensor t({3, 5}, DType::f32);
  EXPECT_EQ(t.numel(), 15);
  EXPECT_EQ(t.nbytes(), 60u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % 64, 0u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.data<float>()[i], 0.0f);
}

TEST(Tensor, WrongDtypeAccessThrows) {
  Tensor t({2}, DType::f64);
  EXPECT_THROW(t.data<float>(), Error);
}

TEST(Tensor, SliceAndReshapeAreViews) {
  Tensor t({4, 3}, DType::f64);
  for (int i = 0; i < 12; ++i) t.data<double>()[i] = i;
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.data<double>()[0], 3.0);
  s.data<double>()[0] = 42;
  EXPECT_EQ(t.data<double>()[3], 42.0);
  EXPECT_THROW(t.slice(2, 5), Error);
  EXPECT_THROW(t.reshape({5, 2}), Error);
  EXPECT_EQ(t.reshape({12}).data<double>()[3], 42.0);
}

TEST(Tensor, CloneIsDeep) {
  Tensor t({2}, DType::f32);
  Tensor c = t.clone();
  c.data<float>()[0] = 1;
  EXPECT_EQ(t.data<float>()[0], 0.0f);
}

TEST(Tensor, Bf16RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(bf16::from_float(1.0f).to_float(), 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(bf16::from_float(1.0f + 0x1.0p-8f).to_float(), 1.0f);
  EXPECT_EQ(bf16::from_float(1.0f + 0x1.8p-8f).to_float(), 1.0f + 0x1.0p-7f);
  EXPECT_TRUE(std::isnan(bf16::from_float(NAN).to_float()));
  EXPECT_TRUE(std::isinf(bf16::from_float(-INFINITY).to_float()));
  Tensor t({3}, DType::f32);
  t.data<float>()[0] = 3.14159f;
  Tensor b = t.to(DType::bf16);
  EXPECT_EQ(b.dtype(), DType::bf16);
  EXPECT_NEAR(b.to(DType::f64).data<double>()[0], 3.14159, 0.01);
}

TEST(Tensor, Float64ToBf16RoundsOnce) {
  // Just above the tie between 1 and 1 + 2^-7: the nearest bf16 is 1 + 2^-7. Through f32 the
  // excess would be lost (1 + 2^-8 exactly) and the tie would round to even, 1.
  Tensor t({2}, DType::f64);
  t.data<double>()[0] = 1.0 + 0x1.0p-8 + 0x1.0p-40;
  t.data<double>()[1] = 1.0 + 0x1.0p-8;  // an exact tie: to even
  Tensor b = t.to(DType::bf16);
  EXPECT_EQ(b.data<bf16>()[0].to_float(), 1.0f + 0x1.0p-7f);
  EXPECT_EQ(b.data<bf16>()[1].to_float(), 1.0f);
  Tensor i({1}, DType::i32);
  EXPECT_THROW(i.to(DType::f32), Error);
}

TEST(Tensor, CudaTensorWithoutAllocatorIsAnError) {
  if (has_device(Device::cuda)) GTEST_SKIP() << "a CUDA allocator is registered in this process";
  EXPECT_THROW(Tensor({2}, DType::f32, Device::cuda), Error);
}

TEST(Rng, CounterBasedIsPureAndUniform) {
  EXPECT_EQ(uniform01(1, 2, 3), uniform01(1, 2, 3));
  EXPECT_NE(uniform01(1, 2, 3), uniform01(1, 2, 4));
  double mean = 0, var = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const double x = normal01(9, 1, i);
    mean += x;
    var += x * x;
  }
  mean /= n;
  var = var / n - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(var, 1.0, 0.05);
  Rng r{5, 0};
  for (int i = 0; i < 1000; ++i) EXPECT_LT(r.next_below(7), 7u);
  EXPECT_EQ(r.counter, 1000u);
}

}  // namespace
}  // namespace iha
