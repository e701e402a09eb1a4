# The built-in reward plugins, loaded as .so files through the registry with a real config.
add_executable(test_reward_length ${CMAKE_SOURCE_DIR}/tests/reward/test_reward_length.c ${CMAKE_SOURCE_DIR}/tests/test_main.c)
target_include_directories(test_reward_length PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/tests/reward ${CMAKE_SOURCE_DIR}/core)
target_compile_definitions(test_reward_length PRIVATE CTRL_PLUGIN_DIR="${CTRL_PLUGIN_OUTPUT_DIR}"
                           CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_reward_length PRIVATE ctrl)
add_dependencies(test_reward_length length)
add_test(NAME test_reward_length COMMAND test_reward_length)
set_tests_properties(test_reward_length PROPERTIES LABELS parity TIMEOUT 60)

# The `command` reward against a program of the test's own (tests/reward/command_helper.c).
add_executable(reward_command_helper ${CMAKE_SOURCE_DIR}/tests/reward/command_helper.c)
target_include_directories(reward_command_helper PRIVATE ${CJSON_INCLUDE_DIR})
target_link_libraries(reward_command_helper PRIVATE ${CJSON_LIBRARY})
add_executable(test_reward_command ${CMAKE_SOURCE_DIR}/tests/reward/test_reward_command.c ${CMAKE_SOURCE_DIR}/tests/test_main.c)
target_include_directories(test_reward_command PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core)
target_compile_definitions(test_reward_command PRIVATE CTRL_PLUGIN_DIR="${CTRL_PLUGIN_OUTPUT_DIR}"
                           CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures"
                           CTRL_HELPER="$<TARGET_FILE:reward_command_helper>")
target_link_libraries(test_reward_command PRIVATE ctrl m)
add_dependencies(test_reward_command command reward_command_helper)
add_test(NAME test_reward_command COMMAND test_reward_command)
set_tests_properties(test_reward_command PROPERTIES LABELS parity TIMEOUT 60)

# The `http` reward against a tiny HTTP server the test runs in a thread.
add_executable(test_reward_http ${CMAKE_SOURCE_DIR}/tests/reward/test_reward_http.c ${CMAKE_SOURCE_DIR}/tests/test_main.c)
target_include_directories(test_reward_http PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/tests/reward ${CMAKE_SOURCE_DIR}/core ${CJSON_INCLUDE_DIR})
target_compile_definitions(test_reward_http PRIVATE CTRL_PLUGIN_DIR="${CTRL_PLUGIN_OUTPUT_DIR}"
                           CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_reward_http PRIVATE ctrl ${CJSON_LIBRARY} m pthread)
add_dependencies(test_reward_http http)
add_test(NAME test_reward_http COMMAND test_reward_http)
set_tests_properties(test_reward_http PROPERTIES LABELS parity TIMEOUT 60)
