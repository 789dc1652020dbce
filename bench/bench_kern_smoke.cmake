# bench.kern_smoke: bench_kern's quick A/B options do what --help says.
# -n -s 768x768 prints the selected variant's rows for that shape only: no
# ref rows, no other shape, no attention table; -q puts "-" in the streamed
# columns; an unknown shape or variant exits 2 naming the known ones.
# Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_kern -P bench_kern_smoke.cmake
execute_process(COMMAND ${BENCH} -n -q -r 1 -s 768x768
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_kern -n -q -r 1 -s 768x768 exited with ${rc}: ${err}")
endif()
foreach(want "matvec_q8  768x768" "matvec_f32 768x768" "matmul_q8  768x768")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "bench_kern -s 768x768: no '${want}' row in:\n${out}")
  endif()
endforeach()
# -q streams nothing: its streamed columns say "-", not a figure of 0
string(REGEX MATCH "matvec_q8  768x768 +[0-9.]+ +[0-9.]+ +- +- " q_row "${out}")
if(NOT q_row)
  message(FATAL_ERROR "bench_kern -q: the matvec_q8 row's streamed columns are not '-':\n${out}")
endif()
foreach(unwanted "\nref " "2048x768" "32000x768" "attn_f32")
  string(FIND "${out}" "${unwanted}" at)
  if(NOT at EQUAL -1)
    message(FATAL_ERROR "bench_kern -n -s 768x768 printed '${unwanted}':\n${out}")
  endif()
endforeach()

foreach(bad "-s;77x3;unknown shape '77x3'; the shapes are 768x768 2048x768 768x2048 32000x768"
            "-k;nosuch;unknown variant 'nosuch'; this build has ref")
  list(GET bad 0 opt)
  list(GET bad 1 arg)
  list(GET bad 2 msg)
  execute_process(COMMAND ${BENCH} ${opt} ${arg} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(FIND "${err}" "${msg}" at)
  if(NOT rc EQUAL 2 OR at EQUAL -1)
    message(FATAL_ERROR "bench_kern ${opt} ${arg}: exit ${rc} (want 2), stderr '${err}' (want '${msg}')")
  endif()
endforeach()
message(STATUS "bench.kern_smoke: -n -s 768x768 printed only that shape's rows; bad -s and -k exit 2")
