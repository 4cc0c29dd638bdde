# Included by tests/CMakeLists.txt: builds tools/cudasim as its own project with clang++
# (ExternalProject, configured and built as part of this build) and adds its tests to this
# build's ctest (label gpu-sim). Needs clang++ and the CUDA toolkit headers; without either,
# one gpu-sim test says so and is skipped.
option(ACTBENCH_BUILD_CUDASIM "Build the CPU simulator of the CUDA kernels and its tests" ON)
set(ACTBENCH_CUDASIM_VARIANTS "plain;asan;race" CACHE STRING "cudasim variants: plain, asan, race")
if(ACTBENCH_BUILD_CUDASIM)
  find_program(ACTBENCH_CLANGXX NAMES clang++ clang++-16 clang++-15 clang++-14)
  set(cudasim_cuda_hints /usr/local/cuda/include)
  if(CUDAToolkit_INCLUDE_DIRS)
    list(PREPEND cudasim_cuda_hints ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  find_path(ACTBENCH_CUDA_HEADERS NAMES cuda_bf16.h HINTS ${cudasim_cuda_hints})
  set(cudasim_missing "")
  if(NOT ACTBENCH_CLANGXX)
    set(cudasim_missing "clang++ (Debian package clang; scripts/setup.sh installs it)")
  elseif(NOT ACTBENCH_CUDA_HEADERS)
    set(cudasim_missing "the CUDA toolkit headers (cuda_runtime.h, cuda_bf16.h under /usr/local/cuda/include)")
  endif()
  if(cudasim_missing)
    message(STATUS "actbench: cudasim skipped: needs ${cudasim_missing}")
    add_test(NAME gpu_sim_unavailable COMMAND ${CMAKE_COMMAND} -E echo "cudasim skipped: needs ${cudasim_missing}")
    set_tests_properties(gpu_sim_unavailable PROPERTIES LABELS gpu-sim SKIP_REGULAR_EXPRESSION "cudasim skipped")
  else()
    include(ExternalProject)
    set(cudasim_bin "${CMAKE_BINARY_DIR}/cudasim")
    string(REPLACE ";" "|" cudasim_variants "${ACTBENCH_CUDASIM_VARIANTS}")
    ExternalProject_Add(cudasim
      SOURCE_DIR "${CMAKE_SOURCE_DIR}/tools/cudasim"
      BINARY_DIR "${cudasim_bin}"
      CMAKE_ARGS -DCMAKE_CXX_COMPILER=${ACTBENCH_CLANGXX} -DCMAKE_BUILD_TYPE=Release
                 -DACTBENCH_SOURCE_DIR=${CMAKE_SOURCE_DIR} -DCUDASIM_CUDA_INCLUDE=${ACTBENCH_CUDA_HEADERS}
                 "-DCUDASIM_VARIANTS=${cudasim_variants}"
      LIST_SEPARATOR "|"
      INSTALL_COMMAND ""
      BUILD_ALWAYS ON)
    # The nested project's tests (gtest-discovered there) run from this build's ctest; before
    # the nested project is built, one failing test says so.
    file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/cudasim_tests.cmake"
"if(EXISTS \"${cudasim_bin}/CTestTestfile.cmake\")
  include(\"${cudasim_bin}/CTestTestfile.cmake\")
else()
  add_test(gpu_sim_not_built \"${CMAKE_COMMAND}\" -E false)
  set_tests_properties(gpu_sim_not_built PROPERTIES LABELS gpu-sim)
endif()
")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${CMAKE_CURRENT_BINARY_DIR}/cudasim_tests.cmake")
    message(STATUS "actbench: cudasim with ${ACTBENCH_CLANGXX}, CUDA headers ${ACTBENCH_CUDA_HEADERS}, variants ${ACTBENCH_CUDASIM_VARIANTS}")
  endif()
endif()
