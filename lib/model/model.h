// lib/model: the decoder-only IHA language model, its training step on a process mesh, and
// its data (DESIGN.md section 7; docs/model.md is the reference, docs/training.md the guide).
//
// What it holds
//   - ops.h: embedding, RMSNorm, SwiGLU MLP, cross-entropy; forward and backward, CPU, float
//     and double.
//   - model_config.h, params.h, transformer.h: the architecture, the named parameters in one
//     flat buffer, and the model (blocks of IHA attention from a core factory: one process or
//     sequence-parallel), with activation recomputation.
//   - optim.h: AdamW with decoupled weight decay, clipping, cosine schedule with warmup.
//   - data.h: HDF5 token files and synthetic tasks (multi-key retrieval, 2-hop composition),
//     each rank reading only its shard of each sequence.
//   - run_config.h, trainer.h: the strict YAML run config and the training loop's state and
//     step (micro-batch accumulation, the gradient sum over all ranks: a bucketed all-reduce
//     overlapped with backward, or with optim.zero a reduce-scatter and ZeRO-1 sharded AdamW;
//     evaluation).
//   - train_checkpoint.h: saving, resuming, fine-tuning and evaluating through lib/checkpoint.
//   - model_math.h: the per-element formulas (SwiGLU, AdamW) shared by the CPU and GPU code.
//   - backend.h: the model ops of the backend interface and the CPU backend; the same
//     Transformer and Trainer run on the CUDA backend (CUDA builds only, not included here:
//     backend_cuda.h) with `train.device: cuda`.
//
// Invariants
//   - Results do not depend on the mesh beyond summation order: float64 losses and parameters
//     of a run on any data x head x sequence mesh, with or without ZeRO-1, equal the
//     single-process run within 1e-10.
//   - A fixed mesh gives the same bits every time; a resumed run continues bit for bit.
//   - Initialisation and synthetic data are pure functions of (seed, name or index).
//   - Bad input (config, data file, checkpoint) throws ConfigError naming the key, file or
//     tensor, on every rank (collective_check); library code never exits.
//
// Threads
//   - One thread drives a Trainer or Transformer; calls that communicate are collective over
//     the mesh and made in the same order on every rank. BLAS and the attention kernels may use
//     set_num_threads() threads. HDF5 calls hold the process-wide HDF5 lock.
#pragma once

#include "model/data.h"
#include "model/model_config.h"
#include "model/ops.h"
#include "model/optim.h"
#include "model/params.h"
#include "model/run_config.h"
#include "model/train_checkpoint.h"
#include "model/trainer.h"
#include "model/transformer.h"
