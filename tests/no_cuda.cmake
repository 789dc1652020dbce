# no_cuda.cmake — ctest layers.no_cuda: in a build with CUDA, no program
# (dspark, dspark-edge, dspark-center) loads a CUDA library by itself (an
# edge box has none, and the center package must install without CUDA),
# while the module dspark-cuda.so links cuBLAS and dspark-center finds and
# loads it (the check would otherwise pass on a build that lost it).
# Usage: cmake -DCPU_ONLY="a;b;c" -DMODULE=m.so -DCENTER=dspark-center -P no_cuda.cmake
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
execute_process(COMMAND ldd ${MODULE} OUTPUT_VARIABLE libs)
if(NOT libs MATCHES "libcublas")
  message(FATAL_ERROR "${MODULE} does not link cuBLAS: the CUDA backend is missing from it")
endif()
message(STATUS "${MODULE}: links cuBLAS")
execute_process(COMMAND ${CENTER} --version OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "GPU module [^\n]*dspark-cuda\\.so \\(cuda\\): [0-9]+ device")
  message(FATAL_ERROR "dspark-center does not load its CUDA module:\n${out}")
endif()
message(STATUS "${out}")
# An unloadable module is named, with why, and the center still runs on the CPU.
set(ENV{DSPARK_GPU_MODULE} /nonexistent/dspark-cuda.so)
execute_process(COMMAND ${CENTER} --version OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "cannot be loaded: [^\n]*No such file")
  message(FATAL_ERROR "a missing module is not reported:\n${out}")
endif()
message(STATUS "${out}")
