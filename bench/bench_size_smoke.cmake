# bench.size_smoke: bench_size --quick (the stories15M shape in Q8_0, one
# thread) runs dspark in process and as a child and prints every column:
# decode with its share of the bandwidth, prefill, peak RSS against the file,
# time to first token, default against native, and 4 streams decoding
# together (bench_streams.c). Asserts no speed; the
# default run must report precision native (the file's own blocks).
# Usage: cmake -DBENCH=path/to/bench_size -DWORK_DIR=dir -P bench_size_smoke.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --quick --dir ${WORK_DIR}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_size --quick exited with ${rc}:\n${out}\n${err}")
endif()
# one row: threads, bw, decode, GB/s, %bw, prefill, llama.cpp (nan without --peer), RSS, file+KV, ratio, TTFT, default, native
string(REGEX MATCH "\n +1 +[0-9.]+ \\| +[0-9.]+ +[0-9.]+ +[0-9]+% \\| +[0-9.]+ \\| +[-na]+ +[-na]+ +[-na]+ +[-na]+ \\| +[0-9]+ +[0-9]+ +[0-9.]+ \\| +[0-9.]+ \\| +[0-9.]+ +[0-9.]+" row "${out}")
if(NOT row)
  message(FATAL_ERROR "bench_size --quick: no complete figures row in:\n${out}\n${err}")
endif()
string(REGEX MATCH "default (PASS|MISS) \\(native:" def "${out}")
if(NOT def)
  message(FATAL_ERROR "bench_size --quick: the default dspark run did not run native:\n${out}")
endif()
# the streams line (4 streams at --quick): dspark's figures, llama.cpp's nan without --peer
string(REGEX MATCH "4 streams, 1 threads, prompt 8 \\+ 4 steps each: S_TG [0-9.]+ tok/s, S [0-9.]+ \\(KV [a-z0-9_]+\\) \\|" streams "${out}")
if(NOT streams)
  message(FATAL_ERROR "bench_size --quick: no streams line with figures in:\n${out}\n${err}")
endif()
foreach(want "goals: decode" "RSS " "vocab 32000 (in the file)")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "bench_size --quick: no '${want}' in:\n${out}")
  endif()
endforeach()
file(GLOB left ${WORK_DIR}/*.gguf)
if(left)
  message(FATAL_ERROR "bench_size --quick left ${left} behind")
endif()
message(STATUS "bench.size_smoke: ${row}")
