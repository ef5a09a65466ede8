// The parallel cross-entropy of a vocabulary split over a group of ranks (DESIGN.md section 12,
// docs/parallel.md "Tensor parallelism"): each rank holds the logits of its vocabulary slice
// for the same rows, nobody the whole rows. Per row: the maximum is all-reduced (max) over the
// group, then the sums of exponentials and the target's logit (picked by the slice holding it)
// are all-reduced (sum), and the first arg-max (the smallest index at the maximum) is
// all-reduced (min); loss = max + log(sum) - target logit. The gradient on each slice is
// grad_scale * (softmax - onehot), the one-hot only on the slice holding the target.
// Collective over `comm` (every rank with the same rows and its own slice).
// defines: iha::vocab_parallel_cross_entropy
#pragma once

#include <string>

#include "model/backend.h"
#include "parallel/comm.h"

namespace iha {

// logits: [rows, s.count] of slice s on the backend's device (acc dtype; overwritten with the
// gradient when grad_scale != 0); targets: the rows' global target ids (-1: none) on the device,
// host_targets / host_answer (may be null) the same on the host. Only rows [counted_begin,
// counted_end) enter the returned statistics: each row is counted by one rank of the group.
// Sites: site + ".max", ".sum", ".argmax" (all-reduces of rows, 2 rows and rows doubles).
CrossEntropyStats vocab_parallel_cross_entropy(const ModelBackend& be, Communicator& comm, Buf logits, int64_t rows,
                                               VocabSlice s, CBuf targets, const int32_t* host_targets,
                                               const uint8_t* host_answer, int64_t counted_begin,
                                               int64_t counted_end, double grad_scale, const std::string& site);

}  // namespace iha
