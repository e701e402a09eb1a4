# Tests under the CUDA emulator (kernels/cuda/emu, CMake option CTRL_CUDA_EMU): the emulator's own
# test, and tests/cuda/test_cuda_ops.c compiled a second time against ctrl_cuda_emu so that the
# project's kernels run on this CPU-only machine (label "cuda-emu").
if(CTRL_HAVE_CUDA_EMU)
  set(emu_harness ${CMAKE_SOURCE_DIR}/tests/test_main.c ${CMAKE_SOURCE_DIR}/tests/test_registry.c
                  ${CMAKE_SOURCE_DIR}/tests/fixture.c)
  set(emu_test_defs CTRL_SOURCE_DIR="${CMAKE_SOURCE_DIR}" CTRL_BINARY_DIR="${CMAKE_BINARY_DIR}"
      CTRL_PLUGIN_DIR="${CTRL_PLUGIN_OUTPUT_DIR}" CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures"
      CTRL_SHARED_DIR="${CTRL_SHARED_DIR}")

  ctrl_emu_rewrite(emu_selftest_cpp ${CMAKE_CURRENT_SOURCE_DIR}/emu/emu_selftest_kernels.cu)
  add_executable(test_cuda_emu ${CMAKE_CURRENT_SOURCE_DIR}/emu/test_cuda_emu.c ${emu_selftest_cpp} ${emu_harness})
  ctrl_emu_target(test_cuda_emu)
  target_compile_definitions(test_cuda_emu PRIVATE ${emu_test_defs})
  target_include_directories(test_cuda_emu PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core
                                                   ${CMAKE_SOURCE_DIR}/kernels ${CJSON_INCLUDE_DIR})
  target_link_libraries(test_cuda_emu PRIVATE ctrl_cuda_emu ctrl ${MATH_LIBRARY} ${CJSON_LIBRARY})
  add_test(NAME test_cuda_emu COMMAND test_cuda_emu WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(test_cuda_emu PROPERTIES LABELS cuda-emu TIMEOUT 120)

  # Every case of test_cuda_ops, at the test's small shapes.
  add_executable(test_cuda_ops_emu ${CMAKE_CURRENT_SOURCE_DIR}/cuda/test_cuda_ops.c ${emu_harness})
  ctrl_emu_target(test_cuda_ops_emu)
  target_compile_definitions(test_cuda_ops_emu PRIVATE ${emu_test_defs})
  target_include_directories(test_cuda_ops_emu PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core
                                                       ${CMAKE_SOURCE_DIR}/kernels ${CJSON_INCLUDE_DIR})
  target_link_libraries(test_cuda_ops_emu PRIVATE ctrl_cuda_emu ctrl ${MATH_LIBRARY} ${CJSON_LIBRARY})
  add_test(NAME test_cuda_ops_emu COMMAND test_cuda_ops_emu WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(test_cuda_ops_emu PROPERTIES LABELS cuda-emu TIMEOUT 300 ENVIRONMENT CTRL_TEST_SMALL=1)

  # The attention plugins with their CUDA paths emulated, in build/plugins-emu; the other plugins
  # are the ordinary builds, copied beside them by the fixture cuda_emu_plugins.
  ctrl_emu_plugin(NAME eager DIR plugins/attention/eager SOURCES eager.c eager_cpu.c CUDA_SOURCES eager_cuda.cu
                  LIBS OpenMP::OpenMP_C m)
  ctrl_emu_plugin(NAME flash DIR plugins/attention/flash SOURCES flash.c flash_cpu.c CUDA_SOURCES flash_cuda.cu flash_cuda_gemm.cu flash_cuda_mma.cu
                  LIBS OpenMP::OpenMP_C ctrl_openblas m)
  ctrl_emu_plugin(NAME paged DIR plugins/attention/paged SOURCES paged.c paged_cpu.c CUDA_SOURCES paged_cuda.cu
                  LIBS OpenMP::OpenMP_C m)
  add_test(NAME cuda_emu_plugins
           COMMAND ${CMAKE_COMMAND} -DSRC=${CTRL_PLUGIN_OUTPUT_DIR} -DDST=${CMAKE_BINARY_DIR}/plugins-emu
                   -DKEEP=eager,flash,paged -P ${CMAKE_CURRENT_SOURCE_DIR}/emu/copy_plugins.cmake)
  set_tests_properties(cuda_emu_plugins PROPERTIES LABELS cuda-emu FIXTURES_SETUP cuda_emu_plugins)

  # ctrl_emu_cuda_test(<tests/cuda test name> [extra sources]): that test, compiled again against
  # the emulator as <name>_emu, at CTRL_TEST_SMALL shapes, with the emulated plugins.
  function(ctrl_emu_cuda_test name)
    set(t ${name}_emu)
    add_executable(${t} ${CMAKE_CURRENT_SOURCE_DIR}/cuda/${name}.c ${emu_harness} ${ARGN})
    ctrl_emu_target(${t})
    target_compile_definitions(${t} PRIVATE CTRL_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
      CTRL_BINARY_DIR="${CMAKE_BINARY_DIR}" CTRL_PLUGIN_DIR="${CMAKE_BINARY_DIR}/plugins-emu"
      CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures" CTRL_SHARED_DIR="${CTRL_SHARED_DIR}")
    target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core
                                            ${CMAKE_SOURCE_DIR}/kernels ${CJSON_INCLUDE_DIR})
    target_link_libraries(${t} PRIVATE ctrl_cuda_emu ctrl ${MATH_LIBRARY} ${CJSON_LIBRARY})
    add_dependencies(${t} eager_emu flash_emu paged_emu)
    add_test(NAME ${t} COMMAND ${t} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
    # CTRL_CUDA_LIBRARY: a device selection in the test (ctrl_device_select) dlopens the emulator
    set_tests_properties(${t} PROPERTIES LABELS cuda-emu TIMEOUT 600 FIXTURES_REQUIRED cuda_emu_plugins
                         ENVIRONMENT "CTRL_TEST_SMALL=1;CTRL_CUDA_LIBRARY=$<TARGET_FILE:ctrl_cuda_emu>")
  endfunction()

  # The whole model on the emulated CUDA backend against the CPU backend (eager attention emulated).
  ctrl_emu_cuda_test(test_cuda_model ${CMAKE_SOURCE_DIR}/tests/backend_case.c)
  ctrl_emu_cuda_test(test_cuda_device)
  ctrl_emu_cuda_test(test_cuda_nf4 ${CMAKE_SOURCE_DIR}/tests/backend_case.c)
  ctrl_emu_cuda_test(test_cuda_lora ${CMAKE_SOURCE_DIR}/tests/backend_case.c)
  ctrl_emu_cuda_test(test_cuda_flash)
  ctrl_emu_cuda_test(test_cuda_paged ${CMAKE_SOURCE_DIR}/tests/paged_case.c)
  # SFT against TRL's curves with `[run] device = cuda`: the real device selection dlopens the
  # emulated libctrl_cuda.so that CTRL_CUDA_LIBRARY names.
  ctrl_emu_cuda_test(test_cuda_train)
  # GRPO and RLOO with `[run] device = cuda` (generation from the device's KV cache through the paged
  # plugin's CUDA decode) against the CPU backend on the same seed.
  ctrl_emu_cuda_test(test_cuda_online)
  # Sampling on the device (kernels/cuda/sampling.cu) against the host sampler.
  ctrl_emu_cuda_test(test_cuda_sampling)
  # DPO, KTO and reward models with `[run] device = cuda` against the CPU backend on the same seed.
  ctrl_emu_cuda_test(test_cuda_trainers)
endif()
