# The CUDA backend: optional at build time. AUTO builds it when nvcc is found.
# Its sources live in src/backends/cuda (*.cu kernels and launchers built by nvcc, *.cpp host code
# built by the C++ compiler); without CUDA the library has no GPU code and `--device cuda` reports
# that the build has no CUDA backend. The runtime is linked statically so a binary built on one
# machine runs on another with only the driver installed. A macro, not a function: enable_language
# must run at directory scope.
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
  file(GLOB tandem_cuda_sources CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cu
       ${CMAKE_SOURCE_DIR}/src/backends/cuda/*.cpp)
  if(NOT tandem_cuda_want OR NOT tandem_cuda_sources)
    message(STATUS "tandem: CUDA backend OFF")
    set(TANDEM_HAVE_CUDA OFF)
  else()
    if(NOT CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    add_library(tandem_cuda STATIC ${tandem_cuda_sources})
    set_target_properties(tandem_cuda PROPERTIES CUDA_STANDARD 17 CUDA_ARCHITECTURES "${CMAKE_CUDA_ARCHITECTURES}"
                          POSITION_INDEPENDENT_CODE ON CUDA_SEPARABLE_COMPILATION OFF)
    target_include_directories(tandem_cuda PUBLIC ${CMAKE_SOURCE_DIR}/src)
    # The directory's warning flags are for the C++ compiler; nvcc gets them through -Xcompiler.
    set_property(TARGET tandem_cuda PROPERTY COMPILE_OPTIONS "")
    target_compile_options(tandem_cuda PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo -Xcompiler=-Wall,-Wno-unused-parameter>)
    target_link_libraries(tandem_cuda PUBLIC CUDA::cudart_static nlohmann_json::nlohmann_json fmt::fmt
                          spdlog::spdlog)
    target_compile_definitions(tandem_cuda PUBLIC SPDLOG_FMT_EXTERNAL TANDEM_HAVE_CUDA=1)
    target_link_libraries(${target} PUBLIC tandem_cuda)
    # The engine's host code uses the core library (Rope, errors, dtypes): a cycle of static
    # libraries, which CMake resolves by repeating them on the link line.
    target_link_libraries(tandem_cuda PRIVATE ${target})
    message(STATUS "tandem: CUDA backend ON (archs ${CMAKE_CUDA_ARCHITECTURES})")
    set(TANDEM_HAVE_CUDA ON)
  endif()
endmacro()
