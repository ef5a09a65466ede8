#include "model/vocab_parallel.h"

#include <cmath>

namespace iha {

CrossEntropyStats vocab_parallel_cross_entropy(const ModelBackend& be, Communicator& comm, Buf logits, int64_t rows,
                                               VocabSlice s, CBuf targets, const int32_t* host_targets,
                                               const uint8_t* host_answer, int64_t counted_begin,
                                               int64_t counted_end, double grad_scale, const std::string& site) {
  CrossEntropyStats stats;
  if (rows <= 0) return stats;
  IHA_CHECK(comm.device() == be.device(), "parallel cross-entropy: communicator and backend on different devices");
  Tensor row_max = be.alloc({rows}, DType::f64);
  be.vocab_slice_max(logits, rows, s.count, row_max);
  comm.all_reduce(row_max.raw(), rows, DType::f64, ReduceOp::max, site + ".max");
  Tensor sums = be.alloc({rows, 2}, DType::f64), first = be.alloc({rows}, DType::f64);
  be.vocab_slice_sums(logits, rows, s, targets, row_max, sums, first);
  comm.all_reduce(sums.raw(), 2 * rows, DType::f64, ReduceOp::sum, site + ".sum");
  comm.all_reduce(first.raw(), rows, DType::f64, ReduceOp::min, site + ".argmax");
  const Tensor mx_h = be.download(row_max), sums_h = be.download(sums), first_h = be.download(first);
  const double* mx = mx_h.data<double>();
  const double* sm = sums_h.data<double>();
  const double* arg = first_h.data<double>();
  Tensor lse_h({rows}, DType::f64);
  double* lse = lse_h.data<double>();
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = host_targets[r];
    lse[r] = mx[r] + std::log(sm[2 * r]);
    if (t < 0 || r < counted_begin || r >= counted_end) continue;
    stats.add_row(lse[r] - sm[2 * r + 1], arg[r] == static_cast<double>(t), host_answer && host_answer[r]);
  }
  if (grad_scale != 0) be.vocab_slice_grad(logits, rows, s, targets, be.upload(lse_h), grad_scale);
  return stats;
}

}  // namespace iha
