# bench_mosquitto.cmake — for the smokes of benches that start a real
# mosquitto (include it, then call bench_need_mosquitto(bench.x_smoke) first):
# when mosquitto ($DS_MOSQUITTO, else /usr/sbin/mosquitto) is not installed
# it prints "<name>: skipped: ..." (the test's SKIP regex) and returns from
# the calling script (a macro: return() acts there).
macro(bench_need_mosquitto name)
  if(DEFINED ENV{DS_MOSQUITTO})
    set(mosquitto $ENV{DS_MOSQUITTO})
  else()
    set(mosquitto /usr/sbin/mosquitto)
  endif()
  if(NOT EXISTS ${mosquitto})
    message(STATUS "${name}: skipped: ${mosquitto} is not installed")
    return()
  endif()
endmacro()
