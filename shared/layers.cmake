# shared/layers.cmake — how one layer of the common library is built
# (ds_layer), and the two bottom layers, base and engine: everything the
# transformer needs, and no network, crypto or database code.
# shared/CMakeLists.txt includes it and adds the layers above; tests/cross
# includes it alone to build the engine for another CPU architecture.
# The including project defines the targets ds_warnings and ds_kernels.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(OPENBLAS REQUIRED IMPORTED_TARGET openblas)
pkg_check_modules(INIH REQUIRED IMPORTED_TARGET GLOBAL inih)
# Unicode categories for the BPE pre-tokenizers (engine/tok_pre.c): no
# hand-made tables, and the same data as the distribution's other programs.
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET GLOBAL libutf8proc)

set(DS_SHARED_DIR ${CMAKE_CURRENT_LIST_DIR})
function(ds_layer name)
  file(GLOB srcs CONFIGURE_DEPENDS ${DS_SHARED_DIR}/src/${name}/*.c)
  list(FILTER srcs EXCLUDE REGEX "/engine_cuda\\.c$")
  add_library(ds_${name} STATIC ${srcs})
  target_include_directories(ds_${name} PUBLIC ${DS_SHARED_DIR}/include ${DS_SHARED_DIR}/src)
  target_compile_definitions(ds_${name} PRIVATE _GNU_SOURCE DS_VERSION="${PROJECT_VERSION}")
  target_link_libraries(ds_${name} PRIVATE ds_warnings)
endfunction()

ds_layer(base)     # errors, logging, thread pool, UTF-8, INI, scheduler, file I/O
target_link_libraries(ds_base PUBLIC Threads::Threads m PRIVATE PkgConfig::INIH)
ds_layer(engine)   # model formats, tokenizers, the transformer, sampler, speculation
target_link_libraries(ds_engine PUBLIC ds_base ds_kernels PRIVATE PkgConfig::OPENBLAS PkgConfig::UTF8PROC)
