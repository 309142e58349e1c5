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

# A library LibTorch's CUDA library loads too, as the imported target PREFIX::NAME, linking the
# same copy so the process holds one: the `nvidia-<NAME>` wheel beside the `torch` wheel first,
# then the CUDA toolkit's, or $<PREFIX>_HOME. Sets <PREFIX>_LIBRARY (the install's RPATH reads it).
set(_torch_site "${Torch_DIR}/../../../..")
macro(find_torch_companion PREFIX NAME HEADER LIBRARY TITLE)
  find_path(${PREFIX}_INCLUDE_DIR ${HEADER}
    HINTS "${_torch_site}/nvidia/${NAME}/include" ${CUDAToolkit_INCLUDE_DIRS} ENV ${PREFIX}_HOME
    PATH_SUFFIXES include)
  find_library(${PREFIX}_LIBRARY NAMES ${LIBRARY} ${NAME} NAMES_PER_DIR
    HINTS "${_torch_site}/nvidia/${NAME}/lib" ${CUDAToolkit_LIBRARY_DIR} ENV ${PREFIX}_HOME
    PATH_SUFFIXES lib lib64)
  if(NOT ${PREFIX}_INCLUDE_DIR OR NOT ${PREFIX}_LIBRARY)
    message(FATAL_ERROR
      "${TITLE} not found. Install the CUDA toolkit's ${TITLE} or set ${PREFIX}_HOME.")
  endif()
  add_library(${NAME}::${NAME} UNKNOWN IMPORTED)
  set_target_properties(${NAME}::${NAME} PROPERTIES
    IMPORTED_LOCATION "${${PREFIX}_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${${PREFIX}_INCLUDE_DIR}")
  message(STATUS "${TITLE}: ${${PREFIX}_LIBRARY}")
endmacro()
# NCCL for the gradient all-reduce; cuDNN for the batch norm fusions ATen does not call
# (models/cuda/fused_batch_norm.cpp).
find_torch_companion(NCCL nccl nccl.h libnccl.so.2 NCCL)
find_torch_companion(CUDNN cudnn cudnn.h libcudnn.so.9 cuDNN)
# cudnn-frontend (header-only) for cuDNN's fused graphs: the `nvidia-cudnn-frontend` wheel's
# include/ beside the torch wheel (scripts/setup.sh pins it), or $CUDNN_FRONTEND_HOME.
find_path(CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
  HINTS "${_torch_site}/include" ENV CUDNN_FRONTEND_HOME PATH_SUFFIXES include)
if(NOT CUDNN_FRONTEND_INCLUDE_DIR)
  message(FATAL_ERROR "cudnn-frontend not found. Run scripts/setup.sh, or pip install --no-deps "
    "nvidia-cudnn-frontend, or set CUDNN_FRONTEND_HOME to a checkout of NVIDIA/cudnn-frontend.")
endif()
add_library(cudnn_frontend INTERFACE)
target_include_directories(cudnn_frontend SYSTEM INTERFACE "${CUDNN_FRONTEND_INCLUDE_DIR}")
target_link_libraries(cudnn_frontend INTERFACE cudnn::cudnn)

# LibTorch's include directory carries its own fmt (12.x) ahead of the system's; spdlog is built
# against Debian's fmt (9.x). A directory holding only a link to the system fmt, searched first
# (-I before -isystem), makes every translation unit see the fmt spdlog was built with.
find_package(fmt REQUIRED)
get_target_property(_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
set(FMT_SHIM_DIR "${CMAKE_BINARY_DIR}/fmt_shim")
file(MAKE_DIRECTORY "${FMT_SHIM_DIR}")
file(CREATE_LINK "${_fmt_include}/fmt" "${FMT_SHIM_DIR}/fmt" SYMBOLIC)
