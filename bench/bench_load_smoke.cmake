# bench.load_smoke: run bench_load --quick (its own mosquitto + dspark-edge,
# stories260K, 2 rates of 2 s) and check that it exits 0 and writes valid
# JSON with one result per rate, its CPU figures and the overhead figures.
# Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_load -DWORK_DIR=dir -P bench_load_smoke.cmake
include(${CMAKE_CURRENT_LIST_DIR}/bench_mosquitto.cmake)
bench_need_mosquitto(bench.load_smoke)
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --quick --json ${WORK_DIR}/bench-load.json RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_load exited with ${rc}")
endif()
file(READ ${WORK_DIR}/bench-load.json json)
string(JSON n ERROR_VARIABLE err LENGTH "${json}" rates)
if(err)
  message(FATAL_ERROR "bench-load.json is not valid JSON: ${err}")
endif()
if(n LESS 1)
  message(FATAL_ERROR "bench-load.json has no rate results")
endif()
string(JSON ok ERROR_VARIABLE err GET "${json}" rates 0 ok)
string(JSON rtt ERROR_VARIABLE err2 GET "${json}" overhead_one_token_us edge_round_trip)
string(JSON echo ERROR_VARIABLE err3 GET "${json}" overhead_one_token_us broker_round_trip)
if(err OR err2 OR err3 OR NOT ok GREATER 0 OR NOT rtt GREATER 0 OR NOT echo GREATER 0)
  message(FATAL_ERROR "bench-load.json: rates[0].ok '${ok}', edge_round_trip '${rtt}', "
                      "broker_round_trip '${echo}' ${err} ${err2} ${err3}")
endif()
# The CPU figures fleet_sim --check reads: mosquitto's and the load
# generator's CPU seconds over the first rate (both used some: they carried it).
string(JSON cpu_b ERROR_VARIABLE err GET "${json}" rates 0 cpu_s broker)
string(JSON cpu_g ERROR_VARIABLE err2 GET "${json}" rates 0 cpu_s loadgen)
string(JSON cpu_w ERROR_VARIABLE err3 GET "${json}" rates 0 cpu_s wall)
if(err OR err2 OR err3 OR NOT cpu_b GREATER 0 OR NOT cpu_g GREATER 0 OR NOT cpu_w GREATER 0)
  message(FATAL_ERROR "bench-load.json: rates[0].cpu_s broker '${cpu_b}', loadgen '${cpu_g}', wall '${cpu_w}' "
                      "${err} ${err2} ${err3}")
endif()
message(STATUS "bench.load_smoke: ${n} rates; first: ${ok} answered; one-token round trip ${rtt} us, "
               "bare broker ${echo} us; CPU s over the first rate: broker ${cpu_b}, load generator ${cpu_g}")
