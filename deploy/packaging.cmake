# packaging.cmake — install() rules and CPack: three Debian packages from one build.
#   dspark         the CLI (+ man page, bash completion)
#   dspark-edge    the edge daemon, its unit, /etc/dspark/edge.ini, mosquitto snippets
#   dspark-center  the center daemon, its unit, /etc/dspark/center.ini, mosquitto snippets
#   dspark-center-cuda  the CUDA FP16 backend, the module dspark-cuda.so in
#                  /usr/lib/<arch>/dspark that dspark-center loads at start
#                  (shared/src/node/node_gpu.c); only where nvcc was found
# No program links CUDA (layers.no_cuda checks it): dspark-center recommends
# the CUDA package and runs FP32 on the CPU without it, and the edge and the
# CLI never depend on it. cuBLAS (libcublas.so.13) is not a Debian package:
# it comes with NVIDIA's CUDA runtime, so dpkg-shlibdeps cannot name it and
# the package description says so.
# Build: deploy/package.sh BUILD_DIR  (runs cpack -G DEB)
include(GNUInstallDirs)

set(DS_DOC_DIR ${CMAKE_BINARY_DIR}/doc)
set(doc_bins $<TARGET_FILE:dspark>)
if(TARGET dspark-edge)
  list(APPEND doc_bins $<TARGET_FILE:dspark-edge>)
endif()
if(TARGET dspark-center)
  list(APPEND doc_bins $<TARGET_FILE:dspark-center>)
endif()
# Man pages and bash completion from the programs' --help (deploy/gen-doc.sh).
add_custom_target(ds_doc ALL
  COMMAND bash ${PROJECT_SOURCE_DIR}/deploy/gen-doc.sh ${DS_DOC_DIR} ${doc_bins}
  DEPENDS dspark $<$<TARGET_EXISTS:dspark-edge>:dspark-edge> $<$<TARGET_EXISTS:dspark-center>:dspark-center>
  COMMENT "man pages and bash completion from --help")

install(TARGETS dspark RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT cli)
install(FILES ${DS_DOC_DIR}/dspark.1 DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT cli)
install(FILES ${DS_DOC_DIR}/dspark.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
        RENAME dspark COMPONENT cli)
install(FILES ${PROJECT_SOURCE_DIR}/README.md DESTINATION ${CMAKE_INSTALL_DATADIR}/doc/dspark COMPONENT cli)

foreach(role edge center)
  if(NOT TARGET dspark-${role})
    continue()
  endif()
  install(TARGETS dspark-${role} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT ${role})
  install(FILES ${DS_DOC_DIR}/dspark-${role}.8 DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT ${role})
  install(FILES ${DS_DOC_DIR}/dspark-${role}.bash DESTINATION ${CMAKE_INSTALL_DATADIR}/bash-completion/completions
          RENAME dspark-${role} COMPONENT ${role})
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/systemd/dspark-${role}.service DESTINATION /lib/systemd/system
          COMPONENT ${role})
  set(ctl ${CMAKE_BINARY_DIR}/debian/${role})
  file(MAKE_DIRECTORY ${ctl})
  # The example config, its model under /var/lib/dspark/models instead of the source tree's.
  file(READ ${PROJECT_SOURCE_DIR}/deploy/${role}.example.ini ini)
  string(REPLACE "../../shared/models/" "/var/lib/dspark/models/" ini "${ini}")
  string(REPLACE "relative paths are relative to this file's folder" "relative paths are relative to /etc/dspark" ini "${ini}")
  file(WRITE ${CMAKE_BINARY_DIR}/debian/${role}.ini "${ini}")
  install(FILES ${CMAKE_BINARY_DIR}/debian/${role}.ini DESTINATION /etc/dspark COMPONENT ${role})
  install(FILES ${PROJECT_SOURCE_DIR}/deploy/mosquitto/${role}.conf DESTINATION /etc/dspark/mosquitto
          RENAME dspark-${role}.conf COMPONENT ${role})
  # maintainer scripts and conffiles, per package
  set(ctl ${CMAKE_BINARY_DIR}/debian/${role})
  configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/postinst ${ctl}/postinst COPYONLY)
  configure_file(${PROJECT_SOURCE_DIR}/deploy/debian/prerm ${ctl}/prerm COPYONLY)
  set(conf "/etc/dspark/${role}.ini\n/etc/dspark/mosquitto/dspark-${role}.conf\n")
  if(role STREQUAL center)
    install(FILES ${PROJECT_SOURCE_DIR}/deploy/mosquitto/center-bridge.conf DESTINATION /etc/dspark/mosquitto
            RENAME dspark-center-bridge.conf COMPONENT center)
    string(APPEND conf "/etc/dspark/mosquitto/dspark-center-bridge.conf\n")
  endif()
  file(WRITE ${ctl}/conffiles "${conf}")
  string(TOUPPER ${role} R)
  set(CPACK_DEBIAN_${R}_PACKAGE_CONTROL_EXTRA "${ctl}/postinst;${ctl}/prerm;${ctl}/conffiles")
endforeach()

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME dspark)
set(CPACK_PACKAGE_VENDOR dspark)
set(CPACK_PACKAGE_CONTACT "dspark maintainers <dspark@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)          # Depends from dpkg-shlibdeps
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_CLI_PACKAGE_NAME dspark)
set(CPACK_DEBIAN_EDGE_PACKAGE_NAME dspark-edge)
set(CPACK_DEBIAN_CENTER_PACKAGE_NAME dspark-center)
set(CPACK_COMPONENT_CLI_DESCRIPTION "dspark command line: local runs, inference requests, keys and model bundles")
set(CPACK_COMPONENT_EDGE_DESCRIPTION "dspark edge node: serves local LLM inference to devices over MQTT (CPU only)")
set(CPACK_COMPONENT_CENTER_DESCRIPTION "dspark center node: large-model inference, speculative verification, model distribution")
set(CPACK_DEBIAN_EDGE_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_CENTER_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_EDGE_PACKAGE_RECOMMENDS "mosquitto, dspark")
set(CPACK_DEBIAN_CENTER_PACKAGE_RECOMMENDS "mosquitto, dspark")
# The CUDA module, where this build has it.
if(TARGET dspark-cuda)
  install(TARGETS dspark-cuda LIBRARY DESTINATION ${DS_GPU_MODULE_DIR} COMPONENT cuda)
  set(CPACK_DEBIAN_CUDA_PACKAGE_NAME dspark-center-cuda)
  set(CPACK_COMPONENT_CUDA_DESCRIPTION "dspark center node: FP16 inference on NVIDIA GPUs (CUDA backend module)\n"
      "Needs the NVIDIA driver and the CUDA runtime's cuBLAS (libcublas.so.13) from NVIDIA's repository.")
  set(CPACK_DEBIAN_CUDA_PACKAGE_DEPENDS "dspark-center (= ${PROJECT_VERSION})")
  set(CPACK_DEBIAN_CENTER_PACKAGE_RECOMMENDS "mosquitto, dspark, dspark-center-cuda")
endif()
set(CPACK_COMPONENTS_ALL cli)
foreach(role edge center)
  if(TARGET dspark-${role})
    list(APPEND CPACK_COMPONENTS_ALL ${role})
  endif()
endforeach()
if(TARGET dspark-cuda)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
include(CPack)
