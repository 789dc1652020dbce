# bench.prefix_smoke: bench_batch --prefix --quick (the stories15M shape in
# Q8_0, a 100-token system prompt, 4 streams) prints the time to first token
# cold and cached and the streams' table, and exits 0 only when the tokens
# with the prefix cache are those without. Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_batch -DWORK_DIR=dir -P bench_prefix_smoke.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --prefix --quick --threads 1 --dir ${WORK_DIR} --json ${WORK_DIR}/prefix.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_batch --prefix --quick exited with ${rc}:\n${out}\n${err}")
endif()
foreach(want "cached (system prompt seen before)" "first tokens the same" "streams' tokens the same")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "bench_batch --prefix --quick: no '${want}' in:\n${out}")
  endif()
endforeach()
file(READ ${WORK_DIR}/prefix.json json)
string(JSON speedup GET "${json}" ttft_speedup)
string(JSON shared GET "${json}" shared kv_mb)
string(JSON off GET "${json}" off kv_mb)
file(REMOVE_RECURSE ${WORK_DIR})
message(STATUS "bench.prefix_smoke: TTFT ${speedup}x faster cached; KV ${shared} MB shared vs ${off} MB")
