// lib/core: the small base every other part stands on.
//
// What it holds
//   - Tensor (tensor.h): shape, dtype (f32, f64, bf16, i32, i64, u8), device (cpu, cuda),
//     contiguous row-major, owning or view. No autograd; layers have explicit forward and
//     backward.
//   - Errors (error.h): iha::Error carries file:line and a message naming the thing at fault;
//     iha::ConfigError is bad user input. Library code throws; only apps exit.
//   - Config (config.h): ConfigNode, a strict YAML reader (unknown keys and wrong types are
//     errors). The layer configuration it reads lives in lib/attention (layer_config.h).
//   - RNG (rng.h): counter-based, so values do not depend on the mesh or call order.
//   - BLAS wrappers and thread settings (blas.h).
//   - CUDA builds only (not included here): cuda_device.h (CUDA error checks, the device count
//     and the Device::cuda allocator, registered when the library loads), cuda_blas.h (cuBLAS
//     GEMM) and cuda_ops.h (casts and element-wise kernels).
//
// Invariants
//   - Tensors are contiguous; a view never outlives the memory it points to (caller's duty).
//   - Code in hd.h-marked headers compiles for host and device alike.
//
// Threads
//   - Nothing here is synchronised except the device-allocator registry. The default is one
//     compute thread per process; set_num_threads() raises it for single-process use.
#pragma once

#include "core/bf16.h"
#include "core/blas.h"
#include "core/config.h"
#include "core/error.h"
#include "core/hd.h"
#include "core/rng.h"
#include "core/tensor.h"
