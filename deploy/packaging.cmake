# packaging.cmake — install() rules and CPack: the Debian packages from one build.
#   dspark         the CLI, man pages dspark(1) and dspark.ini(5), bash and zsh completion
#   dspark-edge    the edge daemon, its unit, /etc/dspark/edge.ini
#   dspark-center  the center daemon, its unit, /etc/dspark/center.ini
#   dspark-center-cuda  the CUDA FP16 backend, the module dspark-cuda.so in
#                  /usr/lib/<arch>/dspark that dspark-center loads at start
#                  (shared/src/node/node_gpu.c); only where nvcc was found
#   dspark-broker-config  the mosquitto drop-in /etc/mosquitto/conf.d/dspark.conf
#                  (Architecture: all); the role packages recommend it
#   *-dbgsym       the programs' symbols, split off the stripped binaries
# Every package carries /usr/share/doc/<package>/copyright (DEP-5,
# deploy/debian/copyright) and changelog.Debian.gz (deploy/debian/changelog).
# The maintainer comes from the build: -DDS_PACKAGE_MAINTAINER="Name <mail>"
# (default: $DEBFULLNAME <$DEBEMAIL> when both are set).
# No program links CUDA (layers.no_cuda checks it): dspark-center recommends
# the CUDA package and runs FP32 on the CPU without it, and the edge and the
# CLI never depend on it. cuBLAS (libcublas.so.13) is not a Debian package:
# it comes with NVIDIA's CUDA runtime, so dpkg-shlibdeps cannot name it and
# the package description says so.
# Build: deploy/package.sh BUILD_DIR  (runs cpack -G DEB, then lintian)
include(GNUInstallDirs)

if(DEFINED ENV{DEBFULLNAME} AND DEFINED ENV{DEBEMAIL})
  set(ds_maint_default "$ENV{DEBFULLNAME} <$ENV{DEBEMAIL}>")
else()
  set(ds_maint_default "dspark maintainers <maintainers@dspark.example.org>")
endif()
set(DS_PACKAGE_MAINTAINER "${ds_maint_default}" CACHE STRING
    "dspark: the Maintainer field of the .deb packages and their changelog, 'Name <mail>'")
if(NOT DS_PACKAGE_MAINTAINER MATCHES "^[^<>]+ <[^<>@ ]+@[^<>@ ]+\\.[^<>@ ]+>$")
  message(FATAL_ERROR "DS_PACKAGE_MAINTAINER must read 'Name <user@host.domain>', not '${DS_PACKAGE_MAINTAINER}'")
endif()
set(DS_PACKAGE_RELEASE 1 CACHE STRING "dspark: the Debian revision of the packages (version ${PROJECT_VERSION}-N)")

set(DS_DOC_DIR ${CMAKE_BINARY_DIR}/doc)
set(doc_bins $<TARGET_FILE:dspark>)
if(TARGET dspark-edge)
  list(APPEND doc_bins $<TARGET_FILE:dspark-edge>)
endif()
if(TARGET dspark-center)
  list(APPEND doc_bins $<TARGET_FILE:dspark-center>)
endif()
# The changelog with this build's maintainer, compressed as Debian wants it.
configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/changelog ${CMAKE_BINARY_DIR}/debian/changelog @ONLY)
# Man pages (deploy/man/*.in, OPTIONS from the programs' --help) and the
# changelog, gzip -9n (deploy/gen-doc.sh).
add_custom_target(ds_doc ALL
  COMMAND bash ${PROJECT_SOURCE_DIR}/deploy/gen-doc.sh ${DS_DOC_DIR} ${doc_bins}
  COMMAND gzip -9nc ${CMAKE_BINARY_DIR}/debian/changelog > ${DS_DOC_DIR}/changelog.Debian.gz
  DEPENDS dspark $<$<TARGET_EXISTS:dspark-edge>:dspark-edge> $<$<TARGET_EXISTS:dspark-center>:dspark-center>
          ${PROJECT_SOURCE_DIR}/deploy/gen-doc.sh
  COMMENT "man pages from deploy/man and --help")

# ds_pkg_doc(COMPONENT PACKAGE [MORE_OVERRIDES]): copyright, changelog and
# lintian overrides (deploy/debian/common.lintian-overrides, then MORE_OVERRIDES) of one package.
function(ds_pkg_doc comp pkg)
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/debian/copyright ${DS_DOC_DIR}/changelog.Debian.gz
          DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/${pkg} COMPONENT ${comp})
  file(READ ${PROJECT_SOURCE_DIR}/deploy/debian/common.lintian-overrides ov)
  foreach(more ${ARGN})
    file(READ ${more} m)
    string(APPEND ov "${m}")
  endforeach()
  file(WRITE ${CMAKE_BINARY_DIR}/debian/${pkg}.lintian-overrides "${ov}")
  install(FILES ${CMAKE_BINARY_DIR}/debian/${pkg}.lintian-overrides
          DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides RENAME ${pkg} COMPONENT ${comp})
endfunction()

install(TARGETS dspark RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
install(FILES ${DS_DOC_DIR}/dspark.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT cli)
install(FILES ${DS_DOC_DIR}/dspark.ini.5.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man5 COMPONENT cli)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/completion/dspark.bash
        DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME dspark COMPONENT cli)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/completion/_dspark
        DESTINATION ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions COMPONENT cli)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/dspark COMPONENT cli)
ds_pkg_doc(cli dspark)

foreach(role edge center)
  if(NOT TARGET dspark-${role})
    continue()
  endif()
  install(TARGETS dspark-${role} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${role})
  install(FILES ${DS_DOC_DIR}/dspark-${role}.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT ${role})
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/completion/dspark.bash
          DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions RENAME dspark-${role} COMPONENT ${role})
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/dspark-${role}.service DESTINATION /lib/systemd/system
          COMPONENT ${role})
  ds_pkg_doc(${role} dspark-${role} ${PROJECT_SOURCE_DIR}/deploy/debian/node.lintian-overrides)
  set(ctl ${CMAKE_BINARY_DIR}/debian/${role})
  file(MAKE_DIRECTORY ${ctl})
  # The example config, its model under /var/lib/dspark/models instead of the source tree's.
  file(READ ${PROJECT_SOURCE_DIR}/deploy/${role}.example.ini ini)
  string(REPLACE "../../shared/models/" "/var/lib/dspark/models/" ini "${ini}")
  string(REPLACE "relative paths are relative to this file's folder" "relative paths are relative to /etc/dspark" ini "${ini}")
  file(WRITE ${CMAKE_BINARY_DIR}/debian/${role}.ini "${ini}")
  install(FILES ${CMAKE_BINARY_DIR}/debian/${role}.ini DESTINATION /etc/dspark COMPONENT ${role})
  # maintainer scripts (deploy/debian/{preinst,postinst,prerm,postrm}, @ROLE@ and
  # @OLD_CONFFILES@ (conffiles of older versions to remove) filled in) and conffiles
  set(ROLE ${role})
  set(OLD_CONFFILES /etc/dspark/mosquitto/dspark-${role}.conf)
  if(role STREQUAL center)
    string(APPEND OLD_CONFFILES " /etc/dspark/mosquitto/dspark-center-bridge.conf")
  endif()
  foreach(s preinst postinst prerm postrm)
    configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/${s} ${ctl}/${s} @ONLY
                   FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE
                                    WORLD_READ WORLD_EXECUTE)
  endforeach()
  file(WRITE ${ctl}/conffiles "/etc/dspark/${role}.ini\n")
  string(TOUPPER ${role} R)
  set(CPACK_DEBIAN_${R}_PACKAGE_CONTROL_EXTRA "${ctl}/preinst;${ctl}/postinst;${ctl}/prerm;${ctl}/postrm;${ctl}/conffiles")
  set(CPACK_DEBIAN_${R}_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
endforeach()

# The mosquitto drop-in, and the fuller broker examples beside it as documentation.
install(FILES ${PROJECT_SOURCE_DIR}/deploy/mosquitto/conf.d/dspark.conf DESTINATION /etc/mosquitto/conf.d
        COMPONENT broker)
install(FILES ${PROJECT_SOURCE_DIR}/deploy/mosquitto/tls.conf ${PROJECT_SOURCE_DIR}/deploy/mosquitto/center-bridge.conf
              ${PROJECT_SOURCE_DIR}/deploy/mosquitto/dspark.acl.example
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/dspark-broker-config/examples COMPONENT broker)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/deploy/mosquitto/mkacl.sh
        DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/dspark-broker-config/examples COMPONENT broker)
ds_pkg_doc(broker dspark-broker-config)
set(ctl ${CMAKE_BINARY_DIR}/debian/broker)
file(MAKE_DIRECTORY ${ctl})
configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/broker-postinst ${ctl}/postinst COPYONLY)
configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/broker-postrm ${ctl}/postrm COPYONLY)
file(WRITE ${ctl}/conffiles "/etc/mosquitto/conf.d/dspark.conf\n")
set(CPACK_DEBIAN_BROKER_PACKAGE_CONTROL_EXTRA "${ctl}/postinst;${ctl}/postrm;${ctl}/conffiles")
set(CPACK_DEBIAN_BROKER_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dspark)
set(CPACK_PACKAGE_VENDOR dspark)
set(CPACK_PACKAGE_CONTACT "${DS_PACKAGE_MAINTAINER}")
set(CPACK_DEBIAN_PACKAGE_MAINTAINER "${DS_PACKAGE_MAINTAINER}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_DEBIAN_PACKAGE_RELEASE ${DS_PACKAGE_RELEASE})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)          # Depends from dpkg-shlibdeps
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
# Stripped programs (objcopy --strip-unneeded, by CPack's debuginfo step, which
# also adds a .gnu_debuglink); their symbols, and DWARF in a build with -g such
# as RelWithDebInfo, in <package>-dbgsym (.ddeb, /usr/lib/debug/.build-id/).
set(CPACK_DEBIAN_DEBUGINFO_PACKAGE ON)
set(CPACK_DEBIAN_CLI_PACKAGE_NAME dspark)
set(CPACK_DEBIAN_EDGE_PACKAGE_NAME dspark-edge)
set(CPACK_DEBIAN_CENTER_PACKAGE_NAME dspark-center)
set(CPACK_DEBIAN_BROKER_PACKAGE_NAME dspark-broker-config)
set(CPACK_DEBIAN_BROKER_PACKAGE_ARCHITECTURE all)
set(CPACK_DEBIAN_BROKER_DEBUGINFO_PACKAGE OFF)
set(CPACK_DEBIAN_BROKER_PACKAGE_SHLIBDEPS OFF)
# Descriptions: the first line is the synopsis, the rest the extended description.
set(CPACK_DEBIAN_CLI_DESCRIPTION "command line of the dspark edge/center LLM inference platform
The dspark command runs a model locally, sends inference requests over MQTT,
makes signing and node keys, builds, publishes and rolls out model bundles,
and watches a fleet live (dspark top) or from a browser (dspark dashboard,
dspark exporter for Prometheus).
dspark is an inference platform for field boxes: devices send requests over
MQTT, edge nodes answer with INT8 models on the CPU, and what an edge cannot
finish in time overflows to center nodes.")
set(CPACK_DEBIAN_EDGE_DESCRIPTION "dspark edge node: local LLM inference for devices over MQTT
dspark-edge serves inference requests that devices publish to the local MQTT
broker with INT8 models on the CPU (SIMD kernels chosen at start), with
priorities and deadlines. Whatever it cannot finish in time, or answer
confidently enough, overflows to center nodes. It installs signed model
bundles from the bus and rolls versions out with canary and automatic
rollback. The systemd unit dspark-edge.service runs it (Type=notify).")
set(CPACK_DEBIAN_CENTER_DESCRIPTION "dspark center node: large-model inference and model distribution
dspark-center takes the requests that edge nodes overflow, with continuous
batching in FP32 on the CPU (OpenBLAS) or FP16 on an NVIDIA GPU with the
dspark-center-cuda module, verifies the edges' speculative drafts and
publishes signed, encrypted model bundles. The systemd unit
dspark-center.service runs it (Type=notify).")
set(CPACK_DEBIAN_BROKER_DESCRIPTION "mosquitto configuration for dspark nodes
A drop-in for Debian's mosquitto, /etc/mosquitto/conf.d/dspark.conf: the
loopback listener that dspark-edge and dspark-center connect to, the flow
control and size limits dspark needs, and a commented network listener with
TLS, passwords and an ACL. It sets nothing that Debian's mosquitto.conf sets.
Examples for TLS, bridges and the ACL are in /usr/share/doc.")
set(CPACK_DEBIAN_EDGE_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_CENTER_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_BROKER_PACKAGE_DEPENDS "mosquitto (>= 2.0)")
set(CPACK_DEBIAN_EDGE_PACKAGE_RECOMMENDS "mosquitto, dspark-broker-config, dspark")
set(CPACK_DEBIAN_CENTER_PACKAGE_RECOMMENDS "mosquitto, dspark-broker-config, dspark")
# The CUDA module, where this build has it.
if(TARGET dspark-cuda)
  install(TARGETS dspark-cuda LIBRARY DESTINATION ${DS_GPU_MODULE_DIR} COMPONENT cuda)
  ds_pkg_doc(cuda dspark-center-cuda)
  set(CPACK_DEBIAN_CUDA_PACKAGE_NAME dspark-center-cuda)
  set(CPACK_DEBIAN_CUDA_DESCRIPTION "dspark center node: FP16 inference on NVIDIA GPUs (CUDA backend module)
The module dspark-cuda.so that dspark-center loads at start to run its models
in FP16 on an NVIDIA GPU. Needs the NVIDIA driver and the CUDA runtime's
cuBLAS (libcublas.so.13) from NVIDIA's repository.")
  set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "dspark-center (= ${PROJECT_VERSION}-${DS_PACKAGE_RELEASE})")
  set(CPACK_DEBIAN_CENTER_PACKAGE_RECOMMENDS "mosquitto, dspark-broker-config, dspark, dspark-center-cuda")
endif()
set(CPACK_COMPONENTS_ALL cli broker)
foreach(role edge center)
  if(TARGET dspark-${role})
    list(APPEND CPACK_COMPONENTS_ALL ${role})
  endif()
endforeach()
if(TARGET dspark-cuda)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
include(CPack)
