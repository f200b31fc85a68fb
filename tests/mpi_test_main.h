// The world communicator of an MPI test program whose main() is tests/mpi_test_main.cpp
// (xfuser_add_test(... MPI_MAIN)): MPI started, one MpiCommunicator "world" with a 10 s timeout
// for every collective, GoogleTest run on every rank, the world released before MPI_Finalize.
#pragma once

#include <memory>

#include "parallel/mpi_communicator.h"

namespace xfuser::testing {

extern std::shared_ptr<parallel::MpiCommunicator> g_world;

}  // namespace xfuser::testing
