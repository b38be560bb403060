# Finds LibTorch: Debian's libtorch-dev (1.13, CPU) by default, or the one inside a PyTorch 2.x
# installation when Torch_DIR points there (CUDA builds):
#   -DTorch_DIR=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')/Torch
find_package(Torch REQUIRED)

set(LT_TORCH_VERSION "${Torch_VERSION}")
if(NOT LT_TORCH_VERSION)
  set(LT_TORCH_VERSION "unknown")
endif()
if(TORCH_CUDA_LIBRARIES OR CAFFE2_USE_CUDA OR TARGET torch_cuda)
  set(LT_WITH_CUDA ON)
else()
  set(LT_WITH_CUDA OFF)
endif()

# lt_torch_pch: a tiny library that owns the precompiled LibTorch header. Every target that uses
# LibTorch links lt_torch (below) and, with LT_ENABLE_PCH, reuses this one PCH instead of building
# its own (one PCH compile per build, not per target).
add_library(lt_torch INTERFACE)
# Everything the PCH includes is linked here too, so every consumer compiles with the same
# definitions as the PCH (GCC ignores a PCH when e.g. FMT_SHARED differs).
# spdlog and fmt come first: PyTorch 2.x bundles a newer fmt in its include folder, and the fmt that
# spdlog was built with must be the one found.
# libstdc++ is named ahead of LibTorch too: PyTorch's libtorch.so exports its own copy of
# std::filesystem, and a binary that binds to it crashes in remove_all.
target_link_libraries(lt_torch INTERFACE spdlog::spdlog fmt::fmt nlohmann_json::nlohmann_json stdc++ ${TORCH_LIBRARIES})
target_compile_options(lt_torch INTERFACE ${TORCH_CXX_FLAGS})
if(LT_WITH_CUDA)
  target_compile_definitions(lt_torch INTERFACE LT_WITH_CUDA=1)
endif()

add_library(lt_torch_pch STATIC ${PROJECT_SOURCE_DIR}/cmake/pch_anchor.cpp)
target_link_libraries(lt_torch_pch PUBLIC lt_torch)
if(LT_ENABLE_PCH)
  target_precompile_headers(lt_torch_pch PRIVATE ${PROJECT_SOURCE_DIR}/cmake/torch_pch.h)
  # The PCH keeps the build type's level (-O3 in Release) under the project's -O1 (CMakeLists.txt):
  # GCC 12 crashes compiling an -O3 file (lt_io) against an -O1 PCH, while -O1 files take the -O3 one.
  target_compile_options(lt_torch_pch PRIVATE $<$<CONFIG:Release>:-O3>)
endif()

# lt_use_torch(target): link LibTorch and share the PCH.
function(lt_use_torch target)
  target_link_libraries(${target} PUBLIC lt_torch)
  if(LT_ENABLE_PCH)
    target_precompile_headers(${target} REUSE_FROM lt_torch_pch)
  endif()
endfunction()

# Data-parallel training on CUDA uses c10d's NCCL backend: on by default in CUDA builds (the
# PyTorch wheels ship it). Untested so far (docs/distributed.md).
option(LT_WITH_NCCL "Build the NCCL path of data-parallel training (CUDA builds)" ${LT_WITH_CUDA})

# at::parallel_for is inline: it runs its loop on LibTorch's OpenMP threads only in a file compiled
# with OpenMP, and serially otherwise. lt_enable_intra_op_threads(target source) compiles one
# source with OpenMP, which then shares LibTorch's own OpenMP runtime (Debian's LibTorch links the
# system libgomp). A PyTorch wheel brings its own renamed libgomp: a second runtime would make a
# second thread pool, so there the loop stays serial.
file(GLOB LT_TORCH_BUNDLED_GOMP "${TORCH_INSTALL_PREFIX}/lib/libgomp*")
find_package(OpenMP COMPONENTS CXX)
if(OpenMP_CXX_FOUND AND NOT LT_TORCH_BUNDLED_GOMP)
  set(LT_INTRA_OP_THREADS ON)
else()
  set(LT_INTRA_OP_THREADS OFF)
endif()
message(STATUS "lora-train: own parallel loops on LibTorch's OpenMP threads: ${LT_INTRA_OP_THREADS}")
function(lt_enable_intra_op_threads target source)
  if(LT_INTRA_OP_THREADS)
    # The shared PCH is built without OpenMP (_OPENMP changes what ATen's headers declare).
    set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES
      COMPILE_OPTIONS "${OpenMP_CXX_FLAGS}" SKIP_PRECOMPILE_HEADERS ON SKIP_UNITY_BUILD_INCLUSION ON)
    # The runtime library only: OpenMP::OpenMP_CXX would add -fopenmp to every source of the target,
    # which then all compile without the PCH.
    target_link_libraries(${target} PRIVATE ${OpenMP_CXX_LIBRARIES})
  endif()
endfunction()
