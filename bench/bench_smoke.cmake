# bench.smoke: run bench_engine --quick on stories260K and check that it exits 0
# and writes valid JSON with one result per variant. Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_engine -DWORK_DIR=dir -P bench_smoke.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --quick --models 260k --threads 1,2 --bw-mib 64
                        --dir ${WORK_DIR} --json ${WORK_DIR}/bench-engine.json
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_engine exited with ${rc}")
endif()
file(READ ${WORK_DIR}/bench-engine.json json)
string(JSON n ERROR_VARIABLE err LENGTH "${json}" results)
if(err)
  message(FATAL_ERROR "bench-engine.json is not valid JSON: ${err}")
endif()
if(NOT n EQUAL 6)
  message(FATAL_ERROR "bench-engine.json has ${n} results, want 6 (3 variants x 2 thread counts)")
endif()
string(JSON tps ERROR_VARIABLE err GET "${json}" results 0 decode_tok_s median)
if(err OR NOT tps GREATER 0)
  message(FATAL_ERROR "bench-engine.json: results[0].decode_tok_s.median is '${tps}' ${err}")
endif()
message(STATUS "bench.smoke: ${n} results, stories260K fp32 1 thread decode ${tps} tok/s")
