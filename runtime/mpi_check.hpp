#pragma once
// MPI_CHECK(call): an MPI call whose failure throws actbench's Failure with MPI's own message
// and the caller's file and line. For the MPI communicators (runtime/comm_mpi.cpp, and the NCCL
// one's host-side metadata in kernels/cuda/comm_nccl.cpp); include it only where MPI is built.
#include <string>

#define OMPI_SKIP_MPICXX 1  // Open MPI's C++ bindings are deprecated and not used
#include <mpi.h>

#include "runtime/error.hpp"

#define MPI_CHECK(call)                                                                \
  do {                                                                                 \
    int rc_ = (call);                                                                  \
    if (rc_ != MPI_SUCCESS) {                                                          \
      char msg_[MPI_MAX_ERROR_STRING];                                                 \
      int len_ = 0;                                                                    \
      MPI_Error_string(rc_, msg_, &len_);                                              \
      ::actbench::throw_failure(__FILE__, __LINE__, std::string(#call) + ": " + msg_); \
    }                                                                                  \
  } while (0)
