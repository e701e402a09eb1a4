# ctrl serve against the TRL and OpenAI clients' requests, over HTTP in this process
# (tests/serve/test_serve_clients.c): links the server module, and runs `ctrl model init`.
ctrl_add_c_test(${CMAKE_CURRENT_LIST_DIR}/test_serve_clients.c e2e)
target_link_libraries(test_serve_clients PRIVATE ctrl_serve)
add_dependencies(test_serve_clients ctrl_cli)
set_tests_properties(test_serve_clients PROPERTIES TIMEOUT 120)
