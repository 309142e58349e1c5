# What `cmake --install` ships (the container image's /opt/resnet-trainer, docker/stage-runtime.sh):
#   bin/                 every executable defined under src/ (train and the tools; not the tests)
#   lib/torch/lib/       the `torch` wheel's libraries, and its nvidia/*/lib folders (CUDA runtime,
#   lib/nvidia/*/lib/    cuBLAS, cuDNN, NCCL, ...) in the wheel's own layout, because their RUNPATHs
#                        are relative ($ORIGIN/../../nvidia/...); copied whole, since LibTorch and
#                        cuDNN dlopen() some of their own libraries
# The binaries find those through a relative RPATH; the distribution's libraries (OpenCV, protobuf,
# OpenMPI, ...) are the runtime image's business (docker/add-libraries.sh).

# Every executable target defined in DIR and below it.
function(trainer_programs dir out)
  set(programs "")
  get_property(targets DIRECTORY "${dir}" PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      list(APPEND programs ${target})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY "${dir}" PROPERTY SUBDIRECTORIES)
  foreach(subdir IN LISTS subdirs)
    trainer_programs("${subdir}" more)
    list(APPEND programs ${more})
  endforeach()
  set(${out} ${programs} PARENT_SCOPE)
endfunction()

trainer_programs("${PROJECT_SOURCE_DIR}/src" TRAINER_PROGRAMS)
install(TARGETS ${TRAINER_PROGRAMS} RUNTIME DESTINATION bin)

if(NOT TRAINER_TORCH_SITE)
  # Another LibTorch (CMAKE_PREFIX_PATH): the installed binaries keep the absolute paths they
  # were linked with, and that LibTorch must be where they look.
  set_target_properties(${TRAINER_PROGRAMS} PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
  return()
endif()

# Files of the wheel that no C++ process loads: the Python bindings, static archives, headers,
# CUPTI's profiler back ends, the multi-GPU solver, and the drop-in BLAS/FFTW interfaces.
set(_not_loaded
  PATTERN "libtorch_python.so" EXCLUDE  PATTERN "libshm*" EXCLUDE  PATTERN "*.a" EXCLUDE
  PATTERN "*.py" EXCLUDE  PATTERN "__pycache__" EXCLUDE  PATTERN "include" EXCLUDE
  PATTERN "libnvperf_*" EXCLUDE  PATTERN "libpcsamplingutil.so" EXCLUDE
  PATTERN "libcusolverMg.so*" EXCLUDE  PATTERN "libnvblas.so*" EXCLUDE
  PATTERN "libcufftw.so*" EXCLUDE)
install(DIRECTORY "${TRAINER_TORCH_SITE}/torch/lib" DESTINATION lib/torch USE_SOURCE_PERMISSIONS
  ${_not_loaded})
file(GLOB _wheel_lib_dirs LIST_DIRECTORIES true "${TRAINER_TORCH_SITE}/nvidia/*/lib")
foreach(dir IN LISTS _wheel_lib_dirs)
  get_filename_component(package "${dir}" DIRECTORY)
  get_filename_component(package "${package}" NAME)
  install(DIRECTORY "${dir}" DESTINATION lib/nvidia/${package} USE_SOURCE_PERMISSIONS
    ${_not_loaded})
endforeach()

# The installed binaries look in the copies, wherever the prefix is: the folders of the wheel's
# libraries they link (LibTorch, NCCL, cuDNN, the CUDA runtime), relative to bin/.
set(_rpath "")
foreach(library IN ITEMS ${TORCH_LIBRARIES} ${NCCL_LIBRARY} ${CUDNN_LIBRARY} ${TRAINER_CUDART})
  if(library MATCHES "^/" AND EXISTS "${library}")
    get_filename_component(real "${library}" REALPATH)
    get_filename_component(dir "${real}" DIRECTORY)
    file(RELATIVE_PATH relative "${TRAINER_TORCH_SITE}" "${dir}")
    if(NOT relative MATCHES "^\\.\\.")
      list(APPEND _rpath "$ORIGIN/../lib/${relative}")
    endif()
  endif()
endforeach()
list(REMOVE_DUPLICATES _rpath)
set_target_properties(${TRAINER_PROGRAMS} PROPERTIES INSTALL_RPATH "${_rpath}")
message(STATUS "Install RPATH: ${_rpath}")
