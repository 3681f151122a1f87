# Warning flags and sanitizers shared by every pebble target (applied through
# the interface target pebble_options, linked PRIVATE by each library).
add_library(pebble_options INTERFACE)
target_compile_options(pebble_options INTERFACE
  -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
  -Wcast-align -Woverloaded-virtual -Wimplicit-fallthrough)
if(PEBBLE_WERROR)
  target_compile_options(pebble_options INTERFACE -Werror)
endif()
if(PEBBLE_SANITIZE)
  message(STATUS "pebble: building with -fsanitize=${PEBBLE_SANITIZE}")
  target_compile_options(pebble_options INTERFACE
    -fsanitize=${PEBBLE_SANITIZE} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  target_link_options(pebble_options INTERFACE -fsanitize=${PEBBLE_SANITIZE})
endif()

if(PEBBLE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "PEBBLE_FUZZ needs clang (libFuzzer): "
            "CXX=clang++ cmake ... -DPEBBLE_FUZZ=ON, or scripts/fuzz --build-only")
  endif()
  # Coverage feedback for libFuzzer in every pebble library; the fuzz
  # programs themselves link with -fsanitize=fuzzer (tests/fuzz/).
  target_compile_options(pebble_options INTERFACE -fsanitize=fuzzer-no-link)
endif()

# pebble_add_library(NAME DIR): one library per layer; sources are the .cc
# files of DIR and its subfolders.
# pebble_add_library(name dir [EXCLUDE subdir...]): a static library of
# every .cc under dir, but those under the excluded subdirs.
function(pebble_add_library name dir)
  cmake_parse_arguments(ARG "" "" "EXCLUDE" ${ARGN})
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS ${dir}/*.cc)
  foreach(sub IN LISTS ARG_EXCLUDE)
    list(FILTER srcs EXCLUDE REGEX "^${dir}/${sub}/")
  endforeach()
  add_library(${name} STATIC ${srcs})
  pebble_public_includes(${name})
  target_link_libraries(${name} PRIVATE pebble_options)
endfunction()

# The include directory of a pebble library: the source tree while
# building ("graph/graph.h"), <prefix>/include/pebble once installed. Host
# C++ libraries also pass C++20 on to whoever links them (their headers
# need it), device code (pebble_cuda_kernels) does not.
function(pebble_public_includes name)
  target_include_directories(${name} PUBLIC
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}/pebble>)
  if(NOT name STREQUAL "pebble_cuda_kernels")
    target_compile_features(${name} PUBLIC cxx_std_20)
  endif()
endfunction()
