# cudasim_rewrite_sources(TOOL GEN_DIR SUBDIR OUT_CU OUT_ALL FILES...): one custom command per
# CUDA source, `TOOL IN GEN_DIR/SUBDIR/NAME` (src/rewrite.cpp: <<<...>>> launches and extern
# __shared__ made host C++, line numbers kept). OUT_CU gets the rewritten .cu files (marked C++
# sources), OUT_ALL every rewritten file (.cuh included), for a target to depend on.
# Used by the simulator's own project and by the main build's ACTBENCH_CUDA_SIM flavour.
function(cudasim_rewrite_sources tool gen_dir subdir out_cu out_all)
  set(cu "")
  set(all "")
  foreach(f IN LISTS ARGN)
    get_filename_component(name "${f}" NAME)
    set(out "${gen_dir}/${subdir}/${name}")
    add_custom_command(OUTPUT "${out}" COMMAND ${tool} "${f}" "${out}" DEPENDS ${tool} "${f}"
                       COMMENT "cudasim: rewriting ${subdir}/${name}" VERBATIM)
    list(APPEND all "${out}")
    if(name MATCHES "\\.cu$")
      list(APPEND cu "${out}")
    endif()
  endforeach()
  set_source_files_properties(${cu} PROPERTIES LANGUAGE CXX GENERATED TRUE)
  set(${out_cu} "${cu}" PARENT_SCOPE)
  set(${out_all} "${all}" PARENT_SCOPE)
endfunction()
