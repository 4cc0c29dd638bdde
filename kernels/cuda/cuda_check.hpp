#pragma once
// Checked CUDA, cuBLAS(Lt) and NCCL calls: a failure throws actbench::RuntimeFailure whose
// message carries file:line, the call and the library's own error string.
// Include only what the translation unit links: NCCL_CHECK needs <nccl.h> included first.
#include <cuda_runtime_api.h>

#include <string>

#include "runtime/error.hpp"

#define CUDA_CHECK(call)                                                                               \
  do {                                                                                                 \
    cudaError_t err_ = (call);                                                                         \
    if (err_ != cudaSuccess)                                                                           \
      ::actbench::throw_failure(__FILE__, __LINE__,                                                    \
                                std::string(#call) + ": " + cudaGetErrorName(err_) + ": " + cudaGetErrorString(err_)); \
  } while (0)

// After every kernel launch: a bad configuration is reported here, not at the next sync.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

// cublasStatus_t from either cuBLAS or cuBLASLt (the same enum); the string comes from Lt,
// so the translation unit includes <cublasLt.h>.
#define CUBLAS_CHECK(call)                                                                               \
  do {                                                                                                   \
    cublasStatus_t st_ = (call);                                                                         \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                                    \
      ::actbench::throw_failure(__FILE__, __LINE__, std::string(#call) + ": " + cublasLtGetStatusString(st_)); \
  } while (0)

#define NCCL_CHECK(call)                                                                             \
  do {                                                                                               \
    ncclResult_t nr_ = (call);                                                                       \
    if (nr_ != ncclSuccess)                                                                          \
      ::actbench::throw_failure(__FILE__, __LINE__, std::string(#call) + ": " + ncclGetErrorString(nr_)); \
  } while (0)
