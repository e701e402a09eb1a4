# ctrl serve against the TRL and OpenAI clients' requests, over HTTP in this process
# (tests/serve/test_serve_clients.c): links the server module, and runs `ctrl model init`.
ctrl_add_c_test(${CMAKE_CURRENT_LIST_DIR}/test_serve_clients.c e2e)
target_link_libraries(test_serve_clients PRIVATE ctrl_serve)
add_dependencies(test_serve_clients ctrl_cli)
set_tests_properties(test_serve_clients PROPERTIES TIMEOUT 300)

# vLLM's NCCL weight-transfer engine (tests/serve/test_serve_weight_transfer.c): ctrl serve on the
# emulated CUDA device, a C trainer (weight_trainer.c) over the emulated NCCL (ctrl_nccl_emu, which
# the server dlopens through CTRL_NCCL_LIBRARY as it would libnccl.so.2). Label cuda-emu.
if(CTRL_HAVE_CUDA_EMU)
  add_executable(test_serve_weight_transfer ${CMAKE_CURRENT_LIST_DIR}/test_serve_weight_transfer.c
                 ${CMAKE_CURRENT_LIST_DIR}/weight_trainer.c ${CMAKE_SOURCE_DIR}/tests/test_main.c
                 ${CMAKE_SOURCE_DIR}/tests/test_registry.c ${CMAKE_SOURCE_DIR}/tests/fixture.c)
  ctrl_emu_target(test_serve_weight_transfer)
  target_compile_definitions(test_serve_weight_transfer PRIVATE CTRL_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
    CTRL_BINARY_DIR="${CMAKE_BINARY_DIR}" CTRL_PLUGIN_DIR="${CMAKE_BINARY_DIR}/plugins-emu"
    CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures" CTRL_SHARED_DIR="${CTRL_SHARED_DIR}")
  target_include_directories(test_serve_weight_transfer PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core
                                                               ${CMAKE_SOURCE_DIR}/kernels ${CJSON_INCLUDE_DIR})
  target_link_libraries(test_serve_weight_transfer PRIVATE ctrl_serve ctrl_cuda_emu ctrl_nccl_emu ctrl
                                                           ${MATH_LIBRARY} ${CJSON_LIBRARY})
  add_dependencies(test_serve_weight_transfer ctrl_cli eager_emu flash_emu paged_emu)
  add_test(NAME test_serve_weight_transfer COMMAND test_serve_weight_transfer WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(test_serve_weight_transfer PROPERTIES LABELS cuda-emu TIMEOUT 300
    FIXTURES_REQUIRED cuda_emu_plugins
    ENVIRONMENT "CTRL_CUDA_LIBRARY=$<TARGET_FILE:ctrl_cuda_emu>;CTRL_NCCL_LIBRARY=$<TARGET_FILE:ctrl_nccl_emu>")
endif()
