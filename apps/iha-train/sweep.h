// `iha-train sweep`: one checkpoint evaluated at several sequence lengths (config key
// sweep.lengths), at every needle depth of the multikey task (make_needle_depth_source: the
// query asks the pair in depth bin i of data.pairs equal bins). For context extension: how
// accuracy falls, or holds, with length and with the depth of the needle.
//
// Output (rank 0): a console table; with sweep.out, sweep.jsonl (one line per length and bin,
// one summary line per length) and sweep.md (the table). Every length is checked before the
// first is evaluated: a length the model, the mesh or the task cannot take is a ConfigError
// naming sweep.lengths and the length, on every rank.
// defines: iha::app::run_sweep
#pragma once

#include <memory>
#include <string>

#include "model/run_config.h"
#include "model/train_checkpoint.h"
#include "parallel/comm.h"
#include "progress.h"

namespace iha::app {

// Collective. ck: the inspected checkpoint (its architecture already checked against cfg);
// path: what to load it from. Returns the exit code (0).
template <class T>
int run_sweep(const RunConfig& cfg, std::shared_ptr<Communicator> world, const CheckpointModel& ck,
              const std::string& path, Reporter& rep);

}  // namespace iha::app
