# Included by kernels/CMakeLists.txt when ACTBENCH_CUDA_SIM=ON (a clang++ build, see the top
# CMakeLists.txt): defines actbench_kernels_cuda, the cuda backend executed by the simulator.
#   actbench_cudasim_cupti    the simulator and its CUDA runtime (tools/cudasim/src), whose
#                             activity goes to the CUPTI stand-in (tools/standins)
#   actbench_cuda_kernels_sim kernels/cuda/*.cu after the rewrite, compiled as host C++ with
#                             the forced include cudasim/cudasim.h
#   actbench_kernels_cuda     those + gemm.cpp, cuda_backend.cpp, comm_nccl.cpp (unchanged
#                             sources), on the cuBLASLt and NCCL stand-ins
set(cudasim_dir "${CMAKE_SOURCE_DIR}/tools/cudasim")
foreach(t actbench_cublaslt_standin actbench_cupti_standin actbench_cudasim_cupti)
  if(NOT TARGET ${t})
    message(FATAL_ERROR "ACTBENCH_CUDA_SIM=ON needs ${t} (tools/standins: the toolkit's cublasLt.h and "
                        "cupti.h, an x86-64 host for the simulator's fibers)")
  endif()
endforeach()

add_executable(cudasim_rewrite "${cudasim_dir}/src/rewrite.cpp")
set(cudasim_gen "${CMAKE_BINARY_DIR}/cudasim_rewritten")
file(GLOB cudasim_kernel_files CONFIGURE_DEPENDS "${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu"
     "${CMAKE_SOURCE_DIR}/kernels/cuda/*.cuh")
include("${cudasim_dir}/rewrite.cmake")
cudasim_rewrite_sources(cudasim_rewrite "${cudasim_gen}" kernels/cuda cudasim_rewritten_cu cudasim_rewritten_all
                        ${cudasim_kernel_files})
add_custom_target(actbench_cudasim_rewritten DEPENDS ${cudasim_rewritten_all})

set(cudasim_warnings -Wall -Wextra -Wno-unused-parameter)
# Kernel objects: the rewritten sources first on the include path, so that
# "kernels/cuda/common.cuh" is the rewritten copy; everything else from the sources.
add_library(actbench_cuda_kernels_sim OBJECT ${cudasim_rewritten_cu})
add_dependencies(actbench_cuda_kernels_sim actbench_cudasim_rewritten)
target_include_directories(actbench_cuda_kernels_sim BEFORE PRIVATE "${cudasim_gen}")
target_include_directories(actbench_cuda_kernels_sim PRIVATE "${CMAKE_SOURCE_DIR}" "${cudasim_dir}/include"
                                                             "${ACTBENCH_CUDA_INCLUDE}")
# -fno-strict-aliasing: the kernels' uint4 vector loads pun types (fine in CUDA, undefined in
# host C++ under strict aliasing).
target_compile_options(actbench_cuda_kernels_sim PRIVATE -x c++ -include cudasim/cudasim.h -fno-strict-aliasing
                                                         ${cudasim_warnings} -Wno-unknown-pragmas)
# ACTBENCH_CUDA_SIM_COUNTERS: the race variant's kernels (every access hooked: race checks and
# the counters of layer_run --kernel-report); the runtime's side is in tools/standins.
if(ACTBENCH_CUDA_SIM_COUNTERS)
  include("${cudasim_dir}/race_flags.cmake")
  target_compile_options(actbench_cuda_kernels_sim PRIVATE ${cudasim_kernel_flags_race})
endif()

add_library(actbench_kernels_cuda STATIC $<TARGET_OBJECTS:actbench_cuda_kernels_sim> cuda/gemm.cpp
                                         cuda/cuda_backend.cpp cuda/comm_nccl.cpp)
target_compile_options(actbench_kernels_cuda PRIVATE ${ACTBENCH_WARNINGS})
target_compile_definitions(actbench_kernels_cuda PRIVATE ACTBENCH_CUDA_SIM=1)
target_link_libraries(actbench_kernels_cuda PUBLIC actbench_runtime actbench_cudasim_cupti actbench_cublaslt_standin)
# The NCCL stand-in runs over MPI: without MPI the simulated backend runs one rank.
if(TARGET actbench_nccl_standin)
  target_compile_definitions(actbench_kernels_cuda PRIVATE ACTBENCH_HAVE_NCCL=1 ACTBENCH_HAVE_NCCL_COMM=1)
  target_link_libraries(actbench_kernels_cuda PUBLIC actbench_nccl_standin)
endif()
message(STATUS "actbench: cuda backend on the simulator (tools/cudasim), cuBLASLt/CUPTI stand-ins, "
               "NCCL stand-in ${ACTBENCH_HAVE_MPI}")
