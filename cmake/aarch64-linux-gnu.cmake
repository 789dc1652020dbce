# Toolchain for the arm64 cross build (tests/cross): Debian's
# gcc-aarch64-linux-gnu, binaries run under qemu-user (below),
# libraries from Debian's arm64 packages (multiarch), found by pkg-config.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# -L /: the loader and libc of Debian's multiarch libc6:arm64 (which the
# arm64 -dev packages pull in), not the cross toolchain's own copy in
# /usr/aarch64-linux-gnu: that is an older build of glibc, and its loader
# with the newer libc.so.6 hangs in pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/pkgconfig:/usr/share/pkgconfig")
