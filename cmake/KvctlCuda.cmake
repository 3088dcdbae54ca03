# KVCTL_CUDA=AUTO|ON|OFF. AUTO turns CUDA on when a CUDA compiler is found. CUDA code compiles
# and links without a device; tests tagged [cuda] skip at run time when no device is present.
#
# Architectures (override with CMAKE_CUDA_ARCHITECTURES):
#   80  A100 / A30 (Ampere): the oldest data-centre part we support (bf16, cp.async).
#   90  H100 / H200 (Hopper): the main target of the GPU checks.
set(KVCTL_HAVE_CUDA OFF)
if(NOT KVCTL_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 80 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc 13's C++20 flag; teach it (CUDA targets inherit C++20).
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA_STANDARD 20)
    find_package(CUDAToolkit REQUIRED)
    set(KVCTL_HAVE_CUDA ON)
  elseif(KVCTL_CUDA STREQUAL "ON")
    message(FATAL_ERROR "KVCTL_CUDA=ON but no CUDA compiler was found (is nvcc on PATH?)")
  endif()
endif()
message(STATUS "kvctl: CUDA kernels ${KVCTL_HAVE_CUDA} (KVCTL_CUDA=${KVCTL_CUDA})")
