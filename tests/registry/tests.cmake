# Purpose-built plugins, good and broken, each in its own directory under build/test-plugins/
# so that a test can load one case alone. See tests/registry/bad_plugin.c for the cases.
set(CTRL_TEST_PLUGIN_DIR ${CMAKE_BINARY_DIR}/test-plugins)
function(ctrl_test_plugin case_dir target case name)
  add_library(${target} MODULE ${CMAKE_SOURCE_DIR}/tests/registry/bad_plugin.c)
  set_target_properties(${target} PROPERTIES PREFIX "" OUTPUT_NAME ${name}
                        LIBRARY_OUTPUT_DIRECTORY ${CTRL_TEST_PLUGIN_DIR}/${case_dir} C_VISIBILITY_PRESET hidden)
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/include)
  target_compile_definitions(${target} PRIVATE BAD_CASE=${case} BAD_NAME="${name}")
  add_dependencies(test_registry ${target})
endfunction()

add_executable(test_registry ${CMAKE_SOURCE_DIR}/tests/registry/test_registry.c ${CMAKE_SOURCE_DIR}/tests/test_main.c)
target_include_directories(test_registry PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core)
target_compile_definitions(test_registry PRIVATE CTRL_TEST_PLUGIN_DIR="${CTRL_TEST_PLUGIN_DIR}")
target_link_libraries(test_registry PRIVATE ctrl)
add_test(NAME test_registry COMMAND test_registry)
set_tests_properties(test_registry PROPERTIES LABELS unit TIMEOUT 60)

ctrl_test_plugin(good tp_good 0 good)
ctrl_test_plugin(wrong_abi tp_wrong_abi 1 wrong_abi)
ctrl_test_plugin(wrong_signature tp_wrong_sig 2 wrong_signature)
ctrl_test_plugin(small_descriptor tp_small 3 small_descriptor)
ctrl_test_plugin(null_ops tp_null_ops 4 null_ops)
ctrl_test_plugin(init_fails tp_init_fails 5 init_fails)
ctrl_test_plugin(no_entry tp_no_entry 6 no_entry)
ctrl_test_plugin(null_list tp_null_list 7 null_list)
ctrl_test_plugin(bad_name tp_bad_name 0 "Bad Name")
# Two files registering the same (kind, name), plus a good one beside them.
ctrl_test_plugin(duplicate tp_dup_a 0 twin)
ctrl_test_plugin(duplicate tp_dup_b 0 twin)
set_target_properties(tp_dup_b PROPERTIES OUTPUT_NAME twin_copy)
ctrl_test_plugin(duplicate tp_dup_good 0 other)
# A mixed directory: one broken plugin among good ones; loading goes on.
ctrl_test_plugin(mixed tp_mixed_a 0 alpha)
ctrl_test_plugin(mixed tp_mixed_bad 1 broken)
ctrl_test_plugin(mixed tp_mixed_z 0 zulu)

# Built plugins reach the core only through the host table: no undefined ctrl_* symbols.
add_test(NAME test_plugins_self_contained
         COMMAND bash -c "bad=0; for so in ${CTRL_PLUGIN_OUTPUT_DIR}/*.so; do u=$(nm -D --undefined-only \"$so\" | grep -w 'ctrl_[a-z_0-9]*'); if [ -n \"$u\" ]; then echo \"$so uses core symbols: $u\"; bad=1; fi; done; exit $bad")
set_tests_properties(test_plugins_self_contained PROPERTIES LABELS unit TIMEOUT 60)
