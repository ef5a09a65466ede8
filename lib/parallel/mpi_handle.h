// The MPI communicator behind a Communicator, for libraries that need one directly
// (parallel HDF5 opens files over MPI-IO). Only MPI-backed communicators have one.
// defines: iha::mpi_handle, iha::make_mpi_communicator
#pragma once

#include <mpi.h>

#include "parallel/comm.h"

namespace iha {

// Throws iha::Error if comm is not MPI-backed.
MPI_Comm mpi_handle(const Communicator& comm);

// A Communicator over a duplicate of `comm`, a communicator someone else made (e.g. mpi4py's
// in the Python package): the caller keeps and frees its own. MPI must be initialised with
// MPI_THREAD_MULTIPLE if background progress is to be used. Collective over comm.
std::shared_ptr<Communicator> make_mpi_communicator(MPI_Comm comm);

}  // namespace iha
