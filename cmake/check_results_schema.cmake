# ctest results_schema: docs/results_schema.md is what layer_run --print-csv-schema prints.
# cmake -DLAYER_RUN=<layer_run> -DSCHEMA=<docs/results_schema.md> -P check_results_schema.cmake
execute_process(COMMAND "${LAYER_RUN}" --print-csv-schema OUTPUT_VARIABLE generated RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${LAYER_RUN} --print-csv-schema failed (exit ${rc})")
endif()
file(READ "${SCHEMA}" committed)
if(NOT generated STREQUAL committed)
  message(FATAL_ERROR "${SCHEMA} differs from the columns declared in runners/result_columns.cpp; "
                      "regenerate it: ${LAYER_RUN} --print-csv-schema > ${SCHEMA}")
endif()
