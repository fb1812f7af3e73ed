# The CUDA backend: optional at build time. AUTO builds it when nvcc is found.
# Its sources live in src/backends/cuda: the *.cpp host code (engine, weight upload, peer lane,
# diagnostics) is compiled into the core library like any other source; the *.cu kernels and
# launchers are compiled by nvcc (C++20) into an object library whose objects go into the core
# library too, so there is one static library and no cycle between two. Without CUDA the library
# has no GPU code and `--device cuda` reports that the build has no CUDA backend. The runtime is
# linked statically so a binary built on one machine runs on another with only the driver installed.
# A macro, not a function: enable_language must run at directory scope.
macro(tandem_add_cuda_backend target)
  set(tandem_cuda_want ${TANDEM_CUDA})
  if(tandem_cuda_want STREQUAL "AUTO")
    include(CheckLanguage)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(tandem_cuda_want ON)
    else()
      set(tandem_cuda_want OFF)
    endif()
  endif()
  file(GLOB tandem_cuda_kernels CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cu)
  file(GLOB tandem_cuda_host CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cpp)
  if(NOT tandem_cuda_want OR NOT tandem_cuda_kernels)
    message(STATUS "tandem: CUDA backend OFF")
    set(TANDEM_HAVE_CUDA OFF)
  else()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION)  # CMake before 3.26 does not know nvcc's flag
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    find_package(CUDAToolkit REQUIRED)
    # The kernels: headers only from src/ (core/dtype.h, the backend's .cuh); the symbols they call
    # (checked-call failures, the launch hooks) are in the host sources above, in the same library.
    add_library(tandem_cuda OBJECT ${tandem_cuda_kernels})
    set_target_properties(tandem_cuda PROPERTIES CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                          POSITION_INDEPENDENT_CODE ON CUDA_SEPARABLE_COMPILATION OFF)
    set_target_properties(tandem_cuda PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
    target_include_directories(tandem_cuda PRIVATE ${CMAKE_SOURCE_DIR}/src)
    # The directory's warning flags are for the C++ compiler; nvcc gets them through -Xcompiler.
    set_property(TARGET tandem_cuda PROPERTY COMPILE_OPTIONS "")
    target_compile_options(tandem_cuda PRIVATE
      --expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall,-Wno-unused-parameter)
    target_compile_definitions(tandem_cuda PRIVATE TANDEM_HAVE_CUDA=1)
    target_link_libraries(tandem_cuda PRIVATE CUDA::cudart_static)
    target_sources(${target} PRIVATE ${tandem_cuda_host} $<TARGET_OBJECTS:tandem_cuda>)
    target_link_libraries(${target} PUBLIC CUDA::cudart_static)
    target_compile_definitions(${target} PUBLIC TANDEM_HAVE_CUDA=1)
    message(STATUS "tandem: CUDA backend ON (archs ${CMAKE_CUDA_ARCHITECTURES})")
    set(TANDEM_HAVE_CUDA ON)
  endif()
endmacro()
