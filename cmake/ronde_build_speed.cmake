# What keeps the build from scratch short (CONTRIBUTING.md, "Set up and
# build"): precompiled LibTorch headers, and libronde's units compiled in
# batches.
#
# Precompiled LibTorch headers. A unit that includes <ATen/ATen.h> parses
# about 4,500 of LibTorch's headers; parsed once per target and loaded from
# a precompiled header instead, that part of its compile time is gone.
#
# GCC accepts a precompiled header only in a compilation with the same code
# model (-fPIC for libraries, -fPIE for programs) and the same optimisation,
# debug and language flags, and silently parses the headers again when they
# differ (CMake adds -Winvalid-pch, so the build log says so). Hence two
# headers: the library's own, and one for every program, compiled once by
# ronde_program_pch below and reused.
option(RONDE_PRECOMPILE_HEADERS "Precompile LibTorch's headers" ON)

# What nearly every unit of libronde includes from LibTorch.
set(RONDE_LIBRARY_PCH
  <ATen/ATen.h>
  <c10/util/Exception.h>
  <torch/arg.h>
  <torch/csrc/distributed/c10d/Store.hpp>
  <torch/optim/optimizer.h>
  <torch/serialize/archive.h>)

# ronde_library_pch(target [REUSE_FROM other]): the library's header for a
# shared library's units. A unit that includes no LibTorch header is better
# off without it: mark it with the source property SKIP_PRECOMPILE_HEADERS.
function(ronde_library_pch target)
  if(NOT RONDE_PRECOMPILE_HEADERS)
    return()
  endif()
  if(ARGC GREATER 2 AND ARGV1 STREQUAL "REUSE_FROM")
    target_precompile_headers(${target} REUSE_FROM ${ARGV2})
  else()
    target_precompile_headers(${target} PRIVATE ${RONDE_LIBRARY_PCH})
  endif()
endfunction()

# ronde_program_code_model(target): compile a library's units as a
# program's (-fPIE), for objects that end up only in programs.
function(ronde_program_code_model target)
  set_target_properties(${target} PROPERTIES POSITION_INDEPENDENT_CODE OFF)
  target_compile_options(${target} PRIVATE -fPIE)
endfunction()

# Programs (tests, examples, benchmarks) include <torch/torch.h>: one header
# for all of them, compiled with the programs' code model.
if(RONDE_PRECOMPILE_HEADERS)
  file(WRITE ${PROJECT_BINARY_DIR}/generated/ronde_program_pch.cpp
    "// The unit that compiles the programs' precompiled header.\n")
  # Built only for a program that reuses it (a pip build has none).
  add_library(ronde_program_pch OBJECT EXCLUDE_FROM_ALL
    ${PROJECT_BINARY_DIR}/generated/ronde_program_pch.cpp)
  target_link_libraries(ronde_program_pch PRIVATE ${TORCH_LIBRARIES})
  target_precompile_headers(ronde_program_pch PRIVATE <torch/torch.h>)
  ronde_program_code_model(ronde_program_pch)
endif()

# ronde_program_pch(target...): each target's units use the programs'
# header. An OBJECT library among them gets the programs' code model.
function(ronde_program_pch)
  foreach(target IN LISTS ARGN)
    get_target_property(_type ${target} TYPE)
    if(_type STREQUAL "OBJECT_LIBRARY")
      ronde_program_code_model(${target})
    endif()
    if(RONDE_PRECOMPILE_HEADERS)
      target_precompile_headers(${target} REUSE_FROM ronde_program_pch)
    endif()
  endforeach()
endfunction()

# libronde's units (and the unit tests' and the test worker's) compiled a
# few at a time, each batch one unit: a unit
# that includes LibTorch costs seconds before its first line of its own
# (loading the precompiled header, then emitting LibTorch's inline code
# it uses), which a batch pays once. Off for quick rebuilds of one file
# while working on it.
option(RONDE_UNITY_BUILD "Compile units in batches (libronde, the tests)" ON)
function(ronde_unity_build target)
  if(RONDE_UNITY_BUILD)
    set_target_properties(${target} PROPERTIES
      UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
  endif()
endfunction()
