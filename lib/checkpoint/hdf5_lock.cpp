#include "checkpoint/hdf5_lock.h"

namespace iha {

std::mutex& hdf5_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace iha
