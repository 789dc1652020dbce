# bench.dist_smoke: run bench_dist on a 2 MB file once and check that it exits
# 0 and writes valid JSON with every stage. Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_dist -DWORK_DIR=dir -P bench_dist_smoke.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --sizes-mb 2 --reps 1 --chunk-kb 64 --dir ${WORK_DIR}
                        --json ${WORK_DIR}/bench-dist.json
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_dist exited with ${rc}")
endif()
file(READ ${WORK_DIR}/bench-dist.json json)
string(JSON n ERROR_VARIABLE err LENGTH "${json}" results 0 stages)
if(err)
  message(FATAL_ERROR "bench-dist.json is not valid JSON: ${err}")
endif()
if(NOT n EQUAL 9)
  message(FATAL_ERROR "bench-dist.json has ${n} stages, want 9")
endif()
foreach(i 0 4 6 7)   # sodium_push, pack, verify, decrypt
  string(JSON name GET "${json}" results 0 stages ${i} name)
  string(JSON rate GET "${json}" results 0 stages ${i} mb_s)
  if(NOT rate GREATER 0)
    message(FATAL_ERROR "bench-dist.json: stage ${name} mb_s is '${rate}'")
  endif()
endforeach()
message(STATUS "bench.dist_smoke: ${n} stages")
