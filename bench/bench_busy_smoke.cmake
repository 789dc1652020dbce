# bench.busy_smoke: run bench_busy briefly, print its table and check that it
# exits 0 and writes valid JSON. Asserts no speed (the figures are printed).
# Usage: cmake -DBENCH=path/to/bench_busy -DWORK_DIR=dir -P bench_busy_smoke.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --steps 100 --reps 3 --json ${WORK_DIR}/bench-busy.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_busy exited with ${rc}")
endif()
file(READ ${WORK_DIR}/bench-busy.json json)
string(JSON r ERROR_VARIABLE err GET "${json}" loaded_ratio)
if(err)
  message(FATAL_ERROR "bench-busy.json is not valid JSON: ${err}")
endif()
