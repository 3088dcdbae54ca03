# KVCTL_TORCH=AUTO|ON|OFF: find the libtorch that ships inside the installed `torch` Python package
# (headers, libtorch_cpu, libc10 and its OpenMP runtime) and define the imported target
# kvctl::torch_cpu plus KVCTL_HAVE_TORCH. AUTO uses it when `import torch` works, ON fails without.
#
# We do not use TorchConfig.cmake: it also configures the CUDA half of the wheel and fails when the
# local CUDA toolkit differs from the wheel's (13.0 here vs 13.2). Everything kvctl needs from
# torch is CPU-side: ATen, the op registry and at::parallel_for. CUDA tensors reach our own CUDA
# kernels (kernels/cuda), not torch's; from the CUDA half we take libc10_cuda only (below).
set(KVCTL_HAVE_TORCH OFF)
if(NOT KVCTL_TORCH STREQUAL "OFF")
  find_package(Python3 COMPONENTS Interpreter)
  set(_kvctl_torch_out "")
  if(Python3_Interpreter_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c
        "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
      OUTPUT_VARIABLE _kvctl_torch_out ERROR_QUIET RESULT_VARIABLE _kvctl_torch_rc
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(NOT _kvctl_torch_rc EQUAL 0)
      set(_kvctl_torch_out "")
    endif()
  endif()
  if(_kvctl_torch_out)
    string(REPLACE "\n" ";" _kvctl_torch_lines "${_kvctl_torch_out}")
    list(GET _kvctl_torch_lines 0 KVCTL_TORCH_DIR)
    list(GET _kvctl_torch_lines 1 KVCTL_TORCH_VERSION)
    list(GET _kvctl_torch_lines 2 _kvctl_torch_abi)
    set(_kvctl_torch_libdir ${KVCTL_TORCH_DIR}/lib)
    if(EXISTS ${KVCTL_TORCH_DIR}/include/ATen/ATen.h AND EXISTS ${_kvctl_torch_libdir}/libtorch_cpu.so
       AND EXISTS ${_kvctl_torch_libdir}/libc10.so)
      add_library(kvctl_torch_cpu INTERFACE)
      add_library(kvctl::torch_cpu ALIAS kvctl_torch_cpu)
      # SYSTEM: torch's headers do not pass our -Wall -Wextra -Werror.
      target_include_directories(kvctl_torch_cpu SYSTEM INTERFACE
        ${KVCTL_TORCH_DIR}/include ${KVCTL_TORCH_DIR}/include/torch/csrc/api/include)
      target_compile_definitions(kvctl_torch_cpu INTERFACE
        _GLIBCXX_USE_CXX11_ABI=${_kvctl_torch_abi})
      # ATen parallelises with OpenMP; -fopenmp turns on the pragmas inside at::parallel_for. The
      # wheel's own libgomp is linked by path, and the runpath finds it first, so torch and our
      # code share one OpenMP runtime (one thread pool, one at::set_num_threads).
      target_compile_options(kvctl_torch_cpu INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fopenmp>)
      target_link_libraries(kvctl_torch_cpu INTERFACE
        ${_kvctl_torch_libdir}/libtorch_cpu.so ${_kvctl_torch_libdir}/libc10.so)
      if(EXISTS ${_kvctl_torch_libdir}/libgomp.so.1)
        target_link_libraries(kvctl_torch_cpu INTERFACE ${_kvctl_torch_libdir}/libgomp.so.1)
      else()
        target_link_libraries(kvctl_torch_cpu INTERFACE -fopenmp)
      endif()
      target_link_options(kvctl_torch_cpu INTERFACE "LINKER:-rpath,${_kvctl_torch_libdir}")
      set(KVCTL_HAVE_TORCH ON)
    endif()
  endif()
  if(NOT KVCTL_HAVE_TORCH AND KVCTL_TORCH STREQUAL "ON")
    message(FATAL_ERROR "KVCTL_TORCH=ON but no usable torch was found: `python3 -c 'import torch'` "
                        "must work and torch/include/ATen, torch/lib/libtorch_cpu.so must exist "
                        "(tools/setup.sh installs torch)")
  endif()
endif()
# CUDA dispatch of the ops (bindings/torch/kvctl_torch_cuda.cc) needs our CUDA kernels and the
# wheel's CUDA half: libc10_cuda for the current stream and device guard, and its c10/cuda headers
# (host C++ over the local toolkit's cuda_runtime_api.h; no torch CUDA kernels are compiled or
# linked). A CPU-only wheel or KVCTL_CUDA=OFF leaves the ops CPU-only.
set(KVCTL_HAVE_TORCH_CUDA OFF)
if(KVCTL_HAVE_TORCH AND KVCTL_HAVE_CUDA AND EXISTS ${_kvctl_torch_libdir}/libc10_cuda.so
   AND EXISTS ${KVCTL_TORCH_DIR}/include/c10/cuda/CUDAStream.h)
  add_library(kvctl_torch_cuda_deps INTERFACE)
  add_library(kvctl::torch_cuda ALIAS kvctl_torch_cuda_deps)
  target_link_libraries(kvctl_torch_cuda_deps INTERFACE kvctl::torch_cpu
    ${_kvctl_torch_libdir}/libc10_cuda.so CUDA::cudart)
  set(KVCTL_HAVE_TORCH_CUDA ON)
endif()
if(KVCTL_HAVE_TORCH)
  message(STATUS "kvctl: torch ops ON (torch ${KVCTL_TORCH_VERSION} at ${KVCTL_TORCH_DIR}, "
                 "CUDA dispatch ${KVCTL_HAVE_TORCH_CUDA})")
else()
  message(STATUS "kvctl: torch ops OFF (KVCTL_TORCH=${KVCTL_TORCH})")
endif()
