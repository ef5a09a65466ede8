// The one lock around the HDF5 library in this process.
// Debian's HDF5 1.10 (the parallel build we link) is not built thread-safe: two threads inside
// HDF5 at once corrupt its global state. Every HDF5 call in the process, from any library or
// thread (the checkpoint writer's background thread, a data loader reading HDF5 shards, user
// code), must be made while holding hdf5_mutex(). Hold it only around HDF5 calls: never while
// waiting on MPI or other ranks, or a rank can block another thread's collective progress.
// defines: iha::hdf5_mutex
#pragma once

#include <mutex>

namespace iha {

std::mutex& hdf5_mutex();

}  // namespace iha
