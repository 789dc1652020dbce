# bench.start_smoke: bench_start --json --runs 1 (stories260K.gguf) loads
# the file in a child process and prints its phases (model open, engine
# create, first prompt), their CPU seconds, peak RSS and the hash of the first
# prompt's logits (the same in the warm-up and the run, or it exits 1) as one
# JSON object.
# Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_start -DWORK_DIR=dir -P bench_start_smoke.cmake
execute_process(COMMAND ${BENCH} --json --runs 1 --prompt 4
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_start exited with ${rc}:\n${out}\n${err}")
endif()
foreach(key open_s engine_s first_s ttft_s cpu_engine_s rss_mb file_mb)
  string(JSON v ERROR_VARIABLE jerr GET "${out}" ${key})
  if(jerr OR NOT v GREATER 0)
    message(FATAL_ERROR "bench_start: no positive '${key}' in:\n${out}\n${jerr}")
  endif()
endforeach()
string(JSON fnv ERROR_VARIABLE jerr GET "${out}" logits_fnv)
if(jerr OR NOT fnv MATCHES "^[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]$")
  message(FATAL_ERROR "bench_start: no 16-digit 'logits_fnv' in:\n${out}\n${jerr}")
endif()
message(STATUS "bench.start_smoke: ${out}")
