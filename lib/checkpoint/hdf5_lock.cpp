#include "checkpoint/hdf5_lock.h"

#include <hdf5.h>

namespace iha {

namespace {
// HDF5 1.10 cannot recover from a failed H5Fclose (disk full while it writes a file's
// metadata): the file ID stays registered after its state is freed, and closing the library
// then crashes (SIGSEGV after a clean error message). The library closes itself from two
// hooks: an atexit handler, and, when it initialises after MPI_Init, an attribute on
// MPI_COMM_SELF that MPI_Finalize deletes. Every file this process opens is closed
// explicitly, so neither has anything useful to do: the atexit handler is turned off and the
// library initialised here, before main and so before MPI_Init, which leaves no MPI hook.
const bool hdf5_close_hooks_off = [] {
  H5dont_atexit();
  H5open();
  return true;
}();
}  // namespace

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace iha
