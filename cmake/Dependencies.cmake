# Finds the project's dependencies as imported targets.
# LibTorch: the `torch` wheel's TorchConfig.cmake (scripts/build.sh passes its prefix), or any
# LibTorch given through CMAKE_PREFIX_PATH.
find_package(CUDAToolkit REQUIRED)
# Before LibTorch: its CMake config aliases protobuf::libprotobuf to an empty target when the
# target does not exist yet (LibTorch links its own protobuf statically).
find_package(Protobuf REQUIRED)
find_package(Torch REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(OpenCV REQUIRED COMPONENTS core imgproc imgcodecs)
find_package(CLI11 CONFIG REQUIRED)
find_package(spdlog REQUIRED)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)  # the ImageNet devkit's .tar.gz
# MATLAB files (the ImageNet devkit's meta.mat): libmatio, through its pkg-config file.
find_package(PkgConfig REQUIRED)
pkg_check_modules(MATIO REQUIRED IMPORTED_TARGET matio)

# LibTorch ships no imported target of its own; wrap its variables in one.
# The `torch` wheel's libraries export their own static copy of std::filesystem, and calls that
# bind to it crash (remove_all jumps to null). Putting libstdc++ ahead of them in DT_NEEDED makes
# the dynamic linker bind std:: symbols to the system's libstdc++.
add_library(torch_deps INTERFACE)
target_link_libraries(torch_deps INTERFACE
  "-Wl,--push-state,--no-as-needed" stdc++ "-Wl,--pop-state" ${TORCH_LIBRARIES})
target_include_directories(torch_deps SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
target_compile_options(torch_deps INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:${TORCH_CXX_FLAGS}>)

# NCCL: one copy in the process. LibTorch's CUDA library already loads libnccl.so.2, so link the
# same one: the `nvidia-nccl` wheel beside the `torch` wheel first, then the CUDA toolkit's.
set(_torch_site "${Torch_DIR}/../../../..")
find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS "${_torch_site}/nvidia/nccl/include" ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
  PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES libnccl.so.2 nccl NAMES_PER_DIR
  HINTS "${_torch_site}/nvidia/nccl/lib" ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME
  PATH_SUFFIXES lib lib64)
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  message(FATAL_ERROR "NCCL not found. Install the CUDA toolkit's NCCL or set NCCL_HOME.")
endif()
add_library(nccl::nccl UNKNOWN IMPORTED)
set_target_properties(nccl::nccl PROPERTIES
  IMPORTED_LOCATION "${NCCL_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
message(STATUS "NCCL: ${NCCL_LIBRARY}")

# cuDNN: the same copy LibTorch loads (the `nvidia-cudnn` wheel beside the `torch` wheel, else the
# CUDA toolkit's), for the batch norm fusions ATen does not call (models/cuda/fused_batch_norm.cpp).
find_path(CUDNN_INCLUDE_DIR cudnn.h
  HINTS "${_torch_site}/nvidia/cudnn/include" ${CUDAToolkit_INCLUDE_DIRS} ENV CUDNN_HOME
  PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY NAMES libcudnn.so.9 cudnn NAMES_PER_DIR
  HINTS "${_torch_site}/nvidia/cudnn/lib" ${CUDAToolkit_LIBRARY_DIR} ENV CUDNN_HOME
  PATH_SUFFIXES lib lib64)
if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
  message(FATAL_ERROR "cuDNN not found. Install the CUDA toolkit's cuDNN or set CUDNN_HOME.")
endif()
add_library(cudnn::cudnn UNKNOWN IMPORTED)
set_target_properties(cudnn::cudnn PROPERTIES
  IMPORTED_LOCATION "${CUDNN_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${CUDNN_INCLUDE_DIR}")
message(STATUS "cuDNN: ${CUDNN_LIBRARY}")

# LibTorch's include directory carries its own fmt (12.x) ahead of the system's; spdlog is built
# against Debian's fmt (9.x). A directory holding only a link to the system fmt, searched first
# (-I before -isystem), makes every translation unit see the fmt spdlog was built with.
find_package(fmt REQUIRED)
get_target_property(_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
set(FMT_SHIM_DIR "${CMAKE_BINARY_DIR}/fmt_shim")
file(MAKE_DIRECTORY "${FMT_SHIM_DIR}")
file(CREATE_LINK "${_fmt_include}/fmt" "${FMT_SHIM_DIR}/fmt" SYMBOLIC)
