# `cmake --install`: the libraries, the `pebble` binary, the public headers
# under <prefix>/include/pebble/, the CMake package (pebbleConfig.cmake with
# the imported targets pebble::graph, pebble::import, pebble::scheduler,
# pebble::runtime, pebble::backends and pebble::pebble, all of them) and
# pebble.pc for pkg-config. docs/library.md shows how to use them.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(PEBBLE_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/pebble)
set(PEBBLE_INCLUDE_DIR ${CMAKE_INSTALL_INCLUDEDIR}/pebble)

# pebble/config.h: what this build has.
set(PEBBLE_HAVE_RUNTIME 0)
set(PEBBLE_HAVE_CUDA 0)
if(TARGET pebble_runtime)
  set(PEBBLE_HAVE_RUNTIME 1)
endif()
if(TARGET pebble_runtime_cuda)
  set(PEBBLE_HAVE_CUDA 1)
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/config.h.in
               ${PROJECT_BINARY_DIR}/include/pebble/config.h @ONLY)

# pebble::pebble: every library of this build and the umbrella header.
add_library(pebble_all INTERFACE)
target_include_directories(pebble_all INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_link_libraries(pebble_all INTERFACE pebble_graph pebble_import pebble_scheduler)
set(exported pebble_options pebble_graph pebble_import pebble_scheduler pebble_all)
set_target_properties(pebble_graph PROPERTIES EXPORT_NAME graph)
set_target_properties(pebble_import PROPERTIES EXPORT_NAME import)
set_target_properties(pebble_scheduler PROPERTIES EXPORT_NAME scheduler)
set_target_properties(pebble_options PROPERTIES EXPORT_NAME options)
set_target_properties(pebble_all PROPERTIES EXPORT_NAME pebble)
if(TARGET pebble_runtime)
  target_link_libraries(pebble_all INTERFACE pebble_backends)
  set_target_properties(pebble_runtime PROPERTIES EXPORT_NAME runtime)
  set_target_properties(pebble_backends PROPERTIES EXPORT_NAME backends)
  list(APPEND exported pebble_runtime pebble_backends)
  if(TARGET pebble_runtime_cuda)
    set_target_properties(pebble_runtime_cuda PROPERTIES EXPORT_NAME runtime_cuda)
    set_target_properties(pebble_cuda_kernels PROPERTIES EXPORT_NAME cuda_kernels)
    list(APPEND exported pebble_runtime_cuda pebble_cuda_kernels)
  endif()
endif()
# The installed names inside a build too (add_subdirectory(pebble)).
foreach(target IN LISTS exported)
  get_target_property(name ${target} EXPORT_NAME)
  add_library(pebble::${name} ALIAS ${target})
endforeach()
install(TARGETS ${exported} EXPORT pebbleTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} ${PEBBLE_INCLUDE_DIR})
if(TARGET pebble)
  install(TARGETS pebble RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
if(TARGET pebble_cuda_plugin)  # where the binary looks for it (PEBBLE_CUDA_PLUGIN_RELDIR)
  install(TARGETS pebble_cuda_plugin LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/pebble)
endif()

# Public headers: what the umbrella header reaches, nothing internal
# (zoo_internal.h, ops/op_util.h, the kernels' helpers).
set(public_headers
    graph/autodiff.h graph/graph.h graph/graph_json.h graph/half.h graph/net_builder.h
    graph/ops.h graph/status.h graph/text_input.h graph/models/models.h
    graph/import/onnx_import.h graph/optimizer.h scheduler/budget.h scheduler/checkmate.h
    scheduler/collectives.h scheduler/cost_profile.h
    scheduler/exact_multishot.h scheduler/external_policy.h scheduler/memory_layout.h
    scheduler/offload.h scheduler/orders.h scheduler/plan_api.h scheduler/planner.h
    scheduler/remat.h scheduler/schedule.h scheduler/simulator.h)
if(TARGET pebble_runtime)
  list(APPEND public_headers
       runtime/backend.h runtime/collectives.h runtime/executor.h runtime/kernel.h
       runtime/make_backend.h runtime/npy.h runtime/tensor.h runtime/trace.h runtime/workspace.h
       runtime/cpu/cpu_backend.h)
  if(TARGET pebble_runtime_cuda)
    list(APPEND public_headers runtime/cuda/cuda_backend.h)
  endif()
endif()
foreach(header IN LISTS public_headers)
  get_filename_component(dir ${header} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${header} DESTINATION ${PEBBLE_INCLUDE_DIR}/${dir})
endforeach()
install(FILES ${PROJECT_SOURCE_DIR}/include/pebble/pebble.h
              ${PROJECT_BINARY_DIR}/include/pebble/config.h
        DESTINATION ${PEBBLE_INCLUDE_DIR})

install(EXPORT pebbleTargets NAMESPACE pebble:: DESTINATION ${PEBBLE_CMAKE_DIR})
if(NOT DEFINED PEBBLE_DNNL_FROM_CONFIG)  # set by runtime/CMakeLists.txt
  set(PEBBLE_DNNL_FROM_CONFIG 0)
endif()
# The CUDA toolkit the backend was built with, for find_dependency.
set(PEBBLE_CUDA_ROOT "")
if(TARGET pebble_runtime_cuda)
  get_filename_component(PEBBLE_CUDA_ROOT "${CUDA_cudart_LIBRARY}" DIRECTORY)
  get_filename_component(PEBBLE_CUDA_ROOT "${PEBBLE_CUDA_ROOT}" DIRECTORY)
endif()
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/pebbleConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/pebbleConfig.cmake
                              INSTALL_DESTINATION ${PEBBLE_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/pebbleConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/pebbleConfig.cmake
              ${PROJECT_BINARY_DIR}/pebbleConfigVersion.cmake
        DESTINATION ${PEBBLE_CMAKE_DIR})

# pebble.pc's CUDA part (the CUDA backend was built). cudart and cuBLAS come
# through the toolkit's own pkg-config files where it ships them (NVIDIA's
# packages: <toolkit>/pkgconfig/cudart-X.Y.pc and cublas-X.Y.pc): their
# names go in `requires_var`, and pebble.pc's variable cuda_pcdir says where
# they are (PKG_CONFIG_PATH must hold it). A toolkit without them (pip's
# nvidia-* wheels, some tarballs) gets -lcublas -lcudart under the variable
# cuda_libdir, the directory the build linked them from. cuDNN ships no .pc:
# -lcudnn under cudnn_libdir. `pkg-config --define-variable=NAME=DIR`
# moves either directory.
function(pebble_pc_cuda requires_var libs_var variables_var)
  get_filename_component(cudart_dir "${CUDA_cudart_LIBRARY}" DIRECTORY)
  get_filename_component(cublas_dir "${CUDA_cublas_LIBRARY}" DIRECTORY)
  get_filename_component(cudnn_dir "${PEBBLE_CUDNN_LIBRARY}" DIRECTORY)
  # <root>/lib64 or <root>/lib, <root>/targets/<arch>/lib, or a system
  # libdir with its pkgconfig/ below.
  set(pc_version "")
  foreach(dir IN ITEMS "${PEBBLE_CUDA_ROOT}/pkgconfig" "${PEBBLE_CUDA_ROOT}/../../pkgconfig"
                       "${cudart_dir}/pkgconfig")
    file(GLOB cudart_pcs "${dir}/cudart-*.pc")
    foreach(pc IN LISTS cudart_pcs)
      string(REGEX REPLACE "^.*/cudart-(.*)\\.pc$" "\\1" version "${pc}")
      if(pc_version STREQUAL "" AND EXISTS "${dir}/cublas-${version}.pc")
        set(pc_version "${version}")
        get_filename_component(pc_dir "${dir}" ABSOLUTE)
      endif()
    endforeach()
  endforeach()
  set(variables "cudnn_libdir=${cudnn_dir}\n")
  set(libs "")
  if(pc_version STREQUAL "")
    string(APPEND variables "cuda_libdir=${cudart_dir}\n")
    string(APPEND libs "-L\${cuda_libdir} -lcublas -lcudart")
    if(NOT cublas_dir STREQUAL cudart_dir)
      string(APPEND variables "cublas_libdir=${cublas_dir}\n")
      set(libs "-L\${cublas_libdir} ${libs}")
    endif()
    set(requires "")
    message(STATUS "pebble: pebble.pc links CUDA from ${cudart_dir} (the toolkit has no "
                   "cudart-X.Y.pc)")
  else()
    string(APPEND variables "cuda_pcdir=${pc_dir}\n")
    set(requires "cudart-${pc_version} cublas-${pc_version}")
    message(STATUS "pebble: pebble.pc requires ${requires} (${pc_dir})")
  endif()
  string(APPEND libs " -L\${cudnn_libdir} -lcudnn")
  set(${requires_var} "${requires}" PARENT_SCOPE)
  set(${libs_var} "${libs}" PARENT_SCOPE)
  set(${variables_var} "${variables}" PARENT_SCOPE)
endfunction()

# pebble.pc: the same libraries for a Makefile or Meson project. pkg-config
# cannot follow CMake targets, so the Libs line lists the libraries in link
# order and Requires the dependencies that ship a .pc file. The libraries
# are static: what they need goes in Requires and Libs, not in the
# .private fields (which only `pkg-config --static` reads).
set(pc_libs "-lpebble_scheduler -lpebble_import -lpebble_graph")
set(pc_requires "cbc")
set(pc_variables "")
set(pc_cflags "")
if(TARGET pebble_runtime)
  set(pc_runtime "-lpebble_backends")
  if(TARGET pebble_runtime_cuda)
    pebble_pc_cuda(pc_cuda_requires pc_cuda_libs pc_variables)
    string(APPEND pc_requires " ${pc_cuda_requires}")
    string(APPEND pc_runtime " -lpebble_runtime_cuda -lpebble_cuda_kernels ${pc_cuda_libs}")
    set(pc_cflags " -DPEBBLE_HAVE_CUDA_BACKEND=1")  # as pebble::runtime_cuda defines it
  endif()
  set(pc_libs "${pc_runtime} -lpebble_runtime ${pc_libs} -ldnnl -fopenmp")
endif()
string(STRIP "${pc_requires}" pc_requires)
configure_file(${PROJECT_SOURCE_DIR}/cmake/pebble.pc.in ${PROJECT_BINARY_DIR}/pebble.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/pebble.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
