// The run configuration of iha-train: one YAML file (plus --set overrides) holding mesh,
// sequence, model, training, optimizer, data, evaluation, checkpoint and logging settings.
// Every key is documented in docs/training.md. Reading is strict: an unknown key, a wrong type
// or an invalid value throws ConfigError naming the dotted key.
// Threads: plain data; parsing is local (wrap it in collective_check to agree across ranks).
// defines: iha::MeshSchemes, iha::DataConfig, iha::EvalConfig, iha::SweepConfig, iha::CheckpointConfig, iha::LogConfig,
//          iha::RunConfig, iha::load_run_config, iha::parse_run_config, iha::make_data_source,
//          iha::held_out_seed, iha::task_config_names
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/flash.h"
#include "attention/layer_config.h"
#include "core/config.h"
#include "core/tensor.h"
#include "model/data.h"
#include "model/model_config.h"
#include "model/optim.h"
#include "parallel/layout.h"
#include "parallel/mesh.h"
#include "ringattn/ringattn.h"

namespace iha {

// How the attention of each layer kind is parallelised inside a head x sequence replica
// (ringattn.h: `sequence` = ring/halo of pre-mix K/V over all hp*sp ranks; `head` = Ulysses
// all-to-all over the head group, then ring/halo of pseudo-head K/V over the sequence group).
struct MeshSchemes {
  ParallelScheme global = ParallelScheme::sequence;  // G blocks (ring)
  ParallelScheme window = ParallelScheme::sequence;  // L blocks (halo)
  ParallelScheme for_layer(const LayerConfig& l) const { return l.windowed() ? window : global; }
};

struct DataConfig {
  std::string kind = "multikey";  // multikey | orderedpair | twohop | hdf5
  uint64_t seed = 1;              // synthetic tasks: sequence s is a function of (seed, s)
  MultiKeySpec multikey;          // also the orderedpair task's (the same data.* keys)
  TwoHopSpec twohop;
  std::string path;               // hdf5: token file
  std::string dataset = "tokens";
};

struct EvalConfig {
  int64_t every = 0;        // evaluate every this many steps (0: only at the end of training)
  int64_t sequences = 64;   // held-out sequences per evaluation
  int64_t batch = 8;        // sequences per forward on each data-parallel replica
  int64_t queries = 1;      // synthetic tasks: queries per held-out sequence (RULER: one)
  std::string path;         // hdf5: held-out token file (synthetic tasks use another seed)
  std::string checkpoint;   // `eval` mode: checkpoint directory (default: checkpoint.dir)
};

// `iha-train sweep`: one checkpoint evaluated at several sequence lengths, the multikey
// needle at each depth bin (make_needle_depth_source) of each length.
struct SweepConfig {
  std::vector<int64_t> lengths;  // sequence lengths (tokens), each >= 2
  int64_t sequences = 0;         // held-out sequences per (length, depth bin); 0: eval.sequences
  std::string out;               // directory for sweep.jsonl and sweep.md (empty: console only)
};

struct CheckpointConfig {
  std::string dir;          // empty: no checkpoints
  int64_t every = 0;        // save every this many steps (0: only at the end)
  int64_t keep = 2;         // keep the newest this many
};

struct LogConfig {
  int64_t every = 10;       // console and JSON line every this many steps
  std::string jsonl;        // JSON-lines log file (empty: none)
};

struct RunConfig {
  std::string text;         // the effective YAML after overrides (saved with checkpoints)
  MeshShape mesh;
  MeshSchemes schemes;      // mesh.schemes (default: global head when tp * hp > 1, else sequence)
  int64_t grad_bucket_kib = 1024;  // mesh.grad_bucket_kib: gradient all-reduce bucket size
  bool progress_thread = true;     // mesh.progress_thread: communication advances in the background
  int64_t seq_len = 0;      // N, tokens per sequence
  LayoutKind layout = LayoutKind::zigzag;
  FlashTiles tiles;
  ModelConfig model;        // window not yet resolved
  DType dtype = DType::f32;
  Device device = Device::cpu;       // train.device: where the model runs (cuda: one GPU a rank)
  DType compute_dtype = DType::f32;  // train.compute_dtype: GEMM/attention inputs on the GPU
                                     // (bf16 default there; on the CPU it is train.dtype)
  bool recompute = true;
  int threads = 1;
  uint64_t seed = 1;        // parameter initialisation
  int64_t steps = 0;        // optimizer steps of the run (the schedule's total)
  int64_t stop_after = 0;   // stop after this many steps of one invocation (0: run to steps)
  int64_t batch_size = 0;   // sequences per optimizer step, over all data-parallel replicas
  int64_t micro_batch = 0;  // sequences per forward/backward on one replica
  OptimConfig optim;
  DataConfig data;
  EvalConfig eval;
  SweepConfig sweep;
  CheckpointConfig checkpoint;
  LogConfig log;
  std::string finetune_from;  // finetune: checkpoint directory the weights come from

  // Gradient accumulation steps: batch_size / (dp * micro_batch).
  int64_t accumulation() const { return batch_size / (mesh.dp * micro_batch); }
};

// Reads a YAML file, applies "key=value" overrides, parses and validates (ConfigError naming
// the key on any problem; unknown keys included).
RunConfig load_run_config(const std::string& file, const std::vector<std::string>& overrides);
// Parses an already loaded root node; `text` is kept as RunConfig::text.
RunConfig parse_run_config(const ConfigNode& root, const std::string& text);

// What a run needs, from the config alone, in sizes computed with checked arithmetic
// (core/config_size.h): a lower bound, so that only configs that cannot run are refused.
struct RunEstimate {
  int64_t params = 0;             // parameters of the model
  int64_t bytes_per_rank = 0;     // parameters (with tp: the rank's MLP shards), gradients,
                                  // AdamW moments and the activations of one micro-batch or
                                  // one evaluation batch, the larger (at least one D-vector per
                                  // token and layer, and the logits), and the held-out
                                  // sequences a synthetic task's evaluation reads first, on
                                  // each rank
  int64_t available_bytes = 0;    // memory this process may still use (MemAvailable, cgroup)
  int64_t cpus = 0;               // CPUs online
};

// The one check of a run against the types and the machine, before anything is allocated or
// any thread started: every product of config values is checked for overflow (ConfigError
// naming the key), train.threads is bounded by the CPUs online, and the memory estimate
// must fit the memory available (ConfigError naming the key with the largest share).
// world_size: the ranks launched (0: the mesh's size). load_run_config runs it with 0. Local; call it on every rank (collective_check).
RunEstimate check_run_fits_machine(const RunConfig& cfg, int64_t world_size);

// The data source of the run (train: data.seed; held_out: the evaluation stream, i.e. a
// derived seed for synthetic tasks and eval.path for HDF5). Returns null for held_out when the
// run has no held-out data.
std::shared_ptr<TokenSource> make_data_source(const RunConfig& cfg, bool held_out);
// The seed of the held-out stream of a synthetic task (derived from data.seed, so held-out
// sequences are never among the training sequences).
uint64_t held_out_seed(const RunConfig& cfg);
// The config keys a synthetic task's source names in its messages: data.* for the spec,
// eval.queries for a held-out set's query count, model.vocab_size and sequence.length.
TaskNames task_config_names(bool held_out);

}  // namespace iha
