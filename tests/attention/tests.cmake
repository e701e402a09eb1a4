# The attention plugins linked statically into one parity suite (the same cases run on each).
set(CTRL_ATTENTION_TEST_SOURCES ${CMAKE_SOURCE_DIR}/plugins/attention/eager/eager.c
                                ${CMAKE_SOURCE_DIR}/plugins/attention/eager/eager_cpu.c)
add_library(test_attention_eager OBJECT ${CTRL_ATTENTION_TEST_SOURCES})
target_compile_definitions(test_attention_eager PRIVATE CTRL_PLUGIN_STATIC_NAME=eager)
target_include_directories(test_attention_eager PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(test_attention_eager PRIVATE OpenMP::OpenMP_C)

add_library(test_attention_flash OBJECT ${CMAKE_SOURCE_DIR}/plugins/attention/flash/flash.c
                                        ${CMAKE_SOURCE_DIR}/plugins/attention/flash/flash_cpu.c)
target_compile_definitions(test_attention_flash PRIVATE CTRL_PLUGIN_STATIC_NAME=flash)
target_include_directories(test_attention_flash PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(test_attention_flash PRIVATE OpenMP::OpenMP_C ctrl_openblas)

add_executable(test_attention ${CMAKE_SOURCE_DIR}/tests/attention/test_attention.c ${CMAKE_SOURCE_DIR}/tests/test_main.c
               ${CMAKE_SOURCE_DIR}/tests/fixture.c $<TARGET_OBJECTS:test_attention_eager>
               $<TARGET_OBJECTS:test_attention_flash>)
target_include_directories(test_attention PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core)
target_compile_definitions(test_attention PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_attention PRIVATE ctrl OpenMP::OpenMP_C ctrl_openblas m)
add_test(NAME test_attention COMMAND test_attention)
set_tests_properties(test_attention PROPERTIES LABELS parity TIMEOUT 300)
