// The MPI communicator behind a Communicator, for libraries that need one directly
// (parallel HDF5 opens files over MPI-IO). Only MPI-backed communicators have one.
// defines: iha::mpi_handle
#pragma once

#include <mpi.h>

#include "parallel/comm.h"

namespace iha {

// Throws iha::Error if comm is not MPI-backed.
MPI_Comm mpi_handle(const Communicator& comm);

}  // namespace iha
