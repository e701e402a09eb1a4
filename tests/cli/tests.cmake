# The ctrl program from the outside: exit codes and messages (tests/cli/test_cli.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_cli COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/test_cli.sh $<TARGET_FILE:ctrl_cli>
                                 ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_cli PROPERTIES LABELS e2e TIMEOUT 300)
endif()
# ctrl serve under abuse (tests/cli/test_serve.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_serve COMMAND bash ${CMAKE_SOURCE_DIR}/tests/cli/test_serve.sh $<TARGET_FILE:ctrl_cli>
                                   ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_serve PROPERTIES LABELS e2e TIMEOUT 300)
endif()
