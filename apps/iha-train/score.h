// `iha-train score`: the per-position scores of a checkpoint on held-out sequences
// (Trainer::score: the cross-entropy of every target and whether the arg-max hits it), written
// by rank 0 to an HDF5 file for analyses a mean cannot give (loss by position, pass-key answers,
// the truncated-context control of docs/experiments.md section 5).
//
// The file (written as FILE.tmp, then renamed): datasets `loss` (float32 [S, N], NaN where a
// position has no target) and `hit` (uint8 [S, N]), attributes `seq_len`, `step` (the
// checkpoint's) and `checkpoint` (its directory). An existing FILE is refused (exit 2).
// defines: iha::app::check_score_out, iha::app::write_scores
#pragma once

#include <cstdint>
#include <string>

#include "model/trainer.h"

namespace iha::app {

// ConfigError naming --out when `out` is empty, exists, or its directory does not.
void check_score_out(const std::string& out);
// Writes the scores (rank 0 only calls it).
void write_scores(const std::string& out, const TokenScores& scores, int64_t step, const std::string& checkpoint);

}  // namespace iha::app
