# bench.specnet_smoke: run bench_specnet --quick (its own mosquitto,
# dspark-center and dspark-edge; stories260K, plain, spec k 4 pipelined and
# not) and check that it exits 0 (speculative text equal to plain) and writes
# valid JSON with the three modes. Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_specnet -DWORK_DIR=dir -P bench_specnet_smoke.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --quick --no-pipeline --dir ${WORK_DIR} --json ${WORK_DIR}/bench-specnet.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message(STATUS "${out}")
if(rc EQUAL 77)
  message(STATUS "bench_specnet: skipped: mosquitto is not installed")
  return()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_specnet exited with ${rc}")
endif()
file(READ ${WORK_DIR}/bench-specnet.json json)
string(JSON n ERROR_VARIABLE err LENGTH "${json}" models 0 modes)
if(err OR n LESS 3)
  message(FATAL_ERROR "bench-specnet.json: want plain and two speculative modes: ${err}")
endif()
string(JSON tps ERROR_VARIABLE err GET "${json}" models 0 modes 1 tokens_per_s)
string(JSON mis ERROR_VARIABLE err2 GET "${json}" models 0 modes 1 mismatches)
if(err OR err2 OR NOT tps GREATER 0 OR NOT mis EQUAL 0)
  message(FATAL_ERROR "bench-specnet.json: tokens_per_s '${tps}', mismatches '${mis}' ${err} ${err2}")
endif()
