# bench.soak_smoke: run bench_soak briefly (its own mosquitto + dspark-edge +
# dspark-center, --capacity given, 6 s in 2 s windows) and check that it exits
# 0 (no request answered twice, never or with another id), prints its
# summary and verdict, and writes valid JSON with three windows whose
# processes were sampled. Asserts no speed and not the verdict.
# Usage: cmake -DBENCH=path/to/bench_soak -DWORK_DIR=dir -P bench_soak_smoke.cmake
include(${CMAKE_CURRENT_LIST_DIR}/bench_mosquitto.cmake)
bench_need_mosquitto(bench.soak_smoke)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --capacity 40 --seconds 6 --window 2 --json ${WORK_DIR}/bench-soak.json
                RESULT_VARIABLE rc OUTPUT_VARIABLE out)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_soak exited with ${rc}")
endif()
if(NOT out MATCHES "first window vs last" OR NOT out MATCHES "\nverdict: ")
  message(FATAL_ERROR "bench_soak printed no summary or verdict")
endif()
file(READ ${WORK_DIR}/bench-soak.json json)
string(JSON n ERROR_VARIABLE err LENGTH "${json}" windows)
if(err)
  message(FATAL_ERROR "bench-soak.json is not valid JSON: ${err}")
endif()
if(NOT n EQUAL 3)
  message(FATAL_ERROR "bench-soak.json has ${n} windows, want 3")
endif()
string(JSON answered ERROR_VARIABLE err GET "${json}" windows 2 answered)
string(JSON rss ERROR_VARIABLE err2 GET "${json}" windows 2 edge rss_mib)
string(JSON crss ERROR_VARIABLE err3 GET "${json}" windows 2 center rss_mib)
string(JSON fds ERROR_VARIABLE err4 GET "${json}" windows 2 broker fds)
string(JSON never ERROR_VARIABLE err5 GET "${json}" protocol never_answered)
if(err OR err2 OR err3 OR err4 OR err5 OR NOT answered GREATER 0 OR NOT rss GREATER 0 OR NOT crss GREATER 0
   OR NOT fds GREATER 0 OR NOT never EQUAL 0)
  message(FATAL_ERROR "bench-soak.json: windows[2] answered '${answered}', edge rss '${rss}', center rss '${crss}', "
                      "broker fds '${fds}', never answered '${never}' ${err} ${err2} ${err3} ${err4} ${err5}")
endif()
message(STATUS "bench.soak_smoke: 3 windows; last: ${answered} answered, edge RSS ${rss} MiB, center RSS ${crss} MiB")
