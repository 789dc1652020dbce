# no_cuda.cmake — ctest layers.no_cuda: in a build with CUDA, dspark and
# dspark-edge must not load the CUDA libraries (an edge box has none), while
# dspark-center must (the check would otherwise pass on a build that lost it).
# Usage: cmake -DCPU_ONLY="a;b" -DGPU=c -P no_cuda.cmake
foreach(bin ${CPU_ONLY})
  execute_process(COMMAND ldd ${bin} OUTPUT_VARIABLE libs RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ldd ${bin} failed")
  endif()
  if(libs MATCHES "libcu(blas|blasLt|da|dart)")
    message(FATAL_ERROR "${bin} loads CUDA libraries:\n${libs}")
  endif()
  message(STATUS "${bin}: no CUDA library")
endforeach()
execute_process(COMMAND ldd ${GPU} OUTPUT_VARIABLE libs)
if(NOT libs MATCHES "libcublas")
  message(FATAL_ERROR "${GPU} does not link cuBLAS: the CUDA backend is missing from it")
endif()
message(STATUS "${GPU}: links cuBLAS")
