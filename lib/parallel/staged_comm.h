// Host staging of CUDA device buffers over a host-memory communicator (built only with
// IHA_CUDA): host_staging.h with the CUDA memory operations (cudaPointerGetAttributes, and
// synchronous cudaMemcpy after the work queued on the legacy default stream).
// defines: iha::make_host_staged_communicator
#pragma once

#include <memory>

#include "parallel/host_staging.h"

namespace iha {

std::shared_ptr<Communicator> make_host_staged_communicator(std::shared_ptr<Communicator> host);

}  // namespace iha
