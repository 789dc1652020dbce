# bench.http_smoke: run bench_http --quick --tls (one-token round trips over
# HTTPS with an API key and over MQTT, one real dspark-edge) and check that it
# exits 0 (every request answered) and writes valid JSON with both sides'
# p50. Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_http -DWORK_DIR=dir -P bench_http_smoke.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --n 100 --tls --json ${WORK_DIR}/bench-http.json RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_http exited with ${rc}")
endif()
file(READ ${WORK_DIR}/bench-http.json json)
foreach(side mqtt http)
  string(JSON p50 ERROR_VARIABLE err GET "${json}" ${side} p50_ms)
  if(err OR NOT p50 GREATER 0)
    message(FATAL_ERROR "bench-http.json: ${side}.p50_ms is '${p50}' ${err}")
  endif()
endforeach()
string(JSON d ERROR_VARIABLE err GET "${json}" p50_diff_us)
message(STATUS "bench.http_smoke: HTTPS - MQTT p50 ${d} us (under load; no goal asserted)")
