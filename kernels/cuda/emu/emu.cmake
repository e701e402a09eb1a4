# The CUDA emulator build (kernels/cuda/emu/README.md): the project's own .cu sources, rewritten
# only at their launches, compiled as host C++ against kernels/cuda/emu/include, into
# ctrl_cuda_emu, build/cuda-emu/libctrl_cuda.so, with the same ctrl_cuda_* API as ctrl_cuda. Only
# tests use it.
option(CTRL_CUDA_EMU "Build the CUDA emulator and run the CUDA tests under it (needs a C++17 compiler)" ON)
set(CTRL_HAVE_CUDA_EMU OFF)
if(CTRL_CUDA_EMU)
  include(CheckLanguage)
  check_language(CXX)
  if(CMAKE_CXX_COMPILER)
    enable_language(CXX)
    set(CTRL_HAVE_CUDA_EMU ON)
  endif()
endif()
message(STATUS "ctrl: CUDA emulator ${CTRL_HAVE_CUDA_EMU}")

set(CTRL_EMU_DIR ${CMAKE_SOURCE_DIR}/kernels/cuda/emu)

# ctrl_emu_rewrite(<out-var> <file.cu>...): the launch-rewritten C++ copies, made at build time.
function(ctrl_emu_rewrite out)
  set(result)
  foreach(cu ${ARGN})
    get_filename_component(name ${cu} NAME_WE)
    set(cpp ${CMAKE_BINARY_DIR}/cuda-emu/${name}.cpp)
    add_custom_command(OUTPUT ${cpp}
      COMMAND ${CMAKE_COMMAND} -DIN=${cu} -DOUT=${cpp} -P ${CTRL_EMU_DIR}/rewrite_launch.cmake
      DEPENDS ${cu} ${CTRL_EMU_DIR}/rewrite_launch.cmake
      COMMENT "emulator: rewriting the launches of ${name}.cu" VERBATIM)
    list(APPEND result ${cpp})
  endforeach()
  set(${out} ${result} PARENT_SCOPE)
endfunction()

# ctrl_emu_target(<target>): compile a target's C++ (and C) against the emulator's headers.
function(ctrl_emu_target target)
  target_include_directories(${target} BEFORE PRIVATE ${CTRL_EMU_DIR}/include)
  target_compile_definitions(${target} PRIVATE CTRL_HAVE_CUDA=1 CTRL_CUDA_EMU=1)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall> $<$<COMPILE_LANGUAGE:CXX>:-Wextra>
                                           $<$<COMPILE_LANGUAGE:CXX>:-Werror> $<$<COMPILE_LANGUAGE:CXX>:-Wno-unknown-pragmas>)
  set_target_properties(${target} PROPERTIES CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
endfunction()

if(CTRL_HAVE_CUDA_EMU)
  file(GLOB cus CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/kernels/cuda/*.cu)
  ctrl_emu_rewrite(CTRL_EMU_KERNEL_CPP ${cus})
  file(GLOB CTRL_EMU_HOST_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/core/device/cuda_*.c)
  # The runtime is one shared library, so that the emulated plugins and the emulated
  # libctrl_cuda share one device state (errors, the shuffle generator).
  add_library(ctrl_cuda_emu_rt SHARED ${CTRL_EMU_DIR}/emu_runtime.cpp ${CTRL_EMU_DIR}/emu_cublaslt.cpp
                                     ${CTRL_EMU_DIR}/emu_vm.cpp)
  ctrl_emu_target(ctrl_cuda_emu_rt)
  target_link_libraries(ctrl_cuda_emu_rt PRIVATE ctrl_openblas)
  # The emulated libctrl_cuda.so, in build/cuda-emu/ (not beside libctrl, where the real one is):
  # the emulated tests link it, and device selection dlopens it when CTRL_CUDA_LIBRARY names it
  # (test_cuda_train_emu), so the real `[run] device = cuda` path runs on the emulator.
  add_library(ctrl_cuda_emu SHARED ${CTRL_EMU_KERNEL_CPP} ${CTRL_EMU_HOST_SOURCES})
  set_target_properties(ctrl_cuda_emu PROPERTIES OUTPUT_NAME ctrl_cuda
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/cuda-emu)
  ctrl_emu_target(ctrl_cuda_emu)
  target_include_directories(ctrl_cuda_emu PRIVATE ${CMAKE_SOURCE_DIR}/core ${CMAKE_SOURCE_DIR}/kernels
                                                   ${CJSON_INCLUDE_DIR})
  target_link_libraries(ctrl_cuda_emu PUBLIC ctrl ctrl_cuda_emu_rt)
  # The emulated NCCL (emu_nccl.c: communicators over TCP between the processes or threads of a
  # test), build/cuda-emu/libctrl_nccl_emu.so: what CTRL_NCCL_LIBRARY names where ctrl serve's
  # weight-transfer engine would dlopen libnccl.so.2 (tests/serve/test_serve_weight_transfer.c).
  add_library(ctrl_nccl_emu SHARED ${CTRL_EMU_DIR}/emu_nccl.c)
  target_include_directories(ctrl_nccl_emu PRIVATE ${CTRL_EMU_DIR}/include)
  set_target_properties(ctrl_nccl_emu PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/cuda-emu)
  target_link_libraries(ctrl_nccl_emu PRIVATE ctrl_cuda_emu_rt Threads::Threads) # (its streams: ctrl_emu_stream_defer)
  # The collectives' MPI backend with its NCCL side on the emulated runtime and NCCL,
  # build/cuda-emu/libctrl_mpi.so: what CTRL_MPI_LIBRARY names for `mpirun -np 2 ctrl train` with
  # [run] device = cuda under the emulator (data parallel and ZeRO over NCCL, tests/e2e/test_zero_cuda_emu.sh).
  if(CTRL_HAVE_MPI)
    find_package(MPI COMPONENTS C) # its imported target is core/'s, not visible here
    add_library(ctrl_mpi_emu SHARED ${CMAKE_SOURCE_DIR}/core/collective/backend_mpi.c
                                    ${CMAKE_SOURCE_DIR}/core/collective/backend_mpi_watch.c
                                    ${CMAKE_SOURCE_DIR}/core/collective/backend_nccl.c)
    set_target_properties(ctrl_mpi_emu PROPERTIES OUTPUT_NAME ctrl_mpi LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/cuda-emu)
    ctrl_emu_target(ctrl_mpi_emu)
    target_compile_definitions(ctrl_mpi_emu PRIVATE CTRL_HAVE_NCCL=1)
    target_include_directories(ctrl_mpi_emu PRIVATE ${CMAKE_SOURCE_DIR}/core)
    target_link_libraries(ctrl_mpi_emu PRIVATE ctrl MPI::MPI_C ctrl_cuda_emu_rt ctrl_nccl_emu)
  endif()
endif()

# ctrl_emu_plugin(NAME <plugin> DIR <plugins/kind/name> SOURCES <.c files> CUDA_SOURCES <.cu files>
# [LIBS <libs>]): the plugin with its CUDA path emulated, as build/plugins-emu/<plugin>.so.
function(ctrl_emu_plugin)
  cmake_parse_arguments(P "" "NAME;DIR" "SOURCES;CUDA_SOURCES;LIBS" ${ARGN})
  set(srcs)
  foreach(f ${P_SOURCES})
    list(APPEND srcs ${CMAKE_SOURCE_DIR}/${P_DIR}/${f})
  endforeach()
  set(cus)
  foreach(f ${P_CUDA_SOURCES})
    list(APPEND cus ${CMAKE_SOURCE_DIR}/${P_DIR}/${f})
  endforeach()
  ctrl_emu_rewrite(cpp ${cus})
  add_library(${P_NAME}_emu MODULE ${srcs} ${cpp})
  set_target_properties(${P_NAME}_emu PROPERTIES PREFIX "" OUTPUT_NAME ${P_NAME}
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/plugins-emu C_VISIBILITY_PRESET hidden)
  ctrl_emu_target(${P_NAME}_emu)
  target_include_directories(${P_NAME}_emu PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/${P_DIR})
  target_link_libraries(${P_NAME}_emu PRIVATE ctrl_cuda_emu_rt ${P_LIBS})
endfunction()
