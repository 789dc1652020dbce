# bench.grammar_smoke: run bench_grammar --quick (the mask on the 32,000-token
# vocabulary, stories260K's decode step) and check that it exits 0 (every
# document followed its schema's masks to EOS) and writes valid JSON with 4
# results. Asserts no speed.
# Usage: cmake -DBENCH=path/to/bench_grammar -DWORK_DIR=dir -P bench_grammar_smoke.cmake
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
execute_process(COMMAND ${BENCH} --quick --threads 1 --json ${WORK_DIR}/bench-grammar.json RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "bench_grammar exited with ${rc}")
endif()
file(READ ${WORK_DIR}/bench-grammar.json json)
string(JSON n ERROR_VARIABLE err LENGTH "${json}" results)
if(err)
  message(FATAL_ERROR "bench-grammar.json is not valid JSON: ${err}")
endif()
if(NOT n EQUAL 4)
  message(FATAL_ERROR "bench-grammar.json has ${n} results, want 4")
endif()
message(STATUS "bench.grammar_smoke: ${n} results")
