# The optimizer plugins linked statically into one test (CTRL_PLUGIN_STATIC_NAME renames each
# plugin's entry function), replaying torch.optim trajectories from tests/fixtures/optimizer/.
# Both tests hand the plugins one host (optimizer_host.c: option readers over a table).
add_executable(test_optimizers ${CMAKE_SOURCE_DIR}/tests/optimizer/test_optimizers.c
               ${CMAKE_SOURCE_DIR}/tests/optimizer/optimizer_host.c
               ${CMAKE_SOURCE_DIR}/tests/test_main.c)
add_library(test_optimizer_adamw OBJECT ${CMAKE_SOURCE_DIR}/plugins/optimizer/adamw/adamw.c)
target_compile_definitions(test_optimizer_adamw PRIVATE CTRL_PLUGIN_STATIC_NAME=adamw)
# the plugin's own flags (plugins/optimizer/adamw/CMakeLists.txt): its update loop vectorised, as shipped
target_compile_options(test_optimizer_adamw PRIVATE -fno-math-errno -ffp-contract=off)
add_library(test_optimizer_sgd OBJECT ${CMAKE_SOURCE_DIR}/plugins/optimizer/sgd/sgd.c)
target_compile_definitions(test_optimizer_sgd PRIVATE CTRL_PLUGIN_STATIC_NAME=sgd)
foreach(t test_optimizer_adamw test_optimizer_sgd)
  target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/include)
  target_link_libraries(${t} PRIVATE OpenMP::OpenMP_C)
endforeach()
target_sources(test_optimizers PRIVATE $<TARGET_OBJECTS:test_optimizer_adamw> $<TARGET_OBJECTS:test_optimizer_sgd>)
target_include_directories(test_optimizers PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/include)
target_compile_definitions(test_optimizers PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_optimizers PRIVATE ctrl OpenMP::OpenMP_C m)
add_test(NAME test_optimizers COMMAND test_optimizers)
set_tests_properties(test_optimizers PROPERTIES LABELS parity SKIP_RETURN_CODE 77 TIMEOUT 120)
# adamw_8bit against bitsandbytes' own 8-bit AdamW steps (tests/reference/make_adamw8bit_fixtures.py).
add_executable(test_adamw8bit ${CMAKE_SOURCE_DIR}/tests/optimizer/test_adamw8bit.c
               ${CMAKE_SOURCE_DIR}/tests/optimizer/optimizer_host.c ${CMAKE_SOURCE_DIR}/tests/test_main.c
               ${CMAKE_SOURCE_DIR}/tests/fixture.c)
add_library(test_optimizer_adamw_8bit OBJECT ${CMAKE_SOURCE_DIR}/plugins/optimizer/adamw_8bit/adamw_8bit.c
            ${CMAKE_SOURCE_DIR}/plugins/optimizer/adamw_8bit/blockwise8.c)
target_compile_definitions(test_optimizer_adamw_8bit PRIVATE CTRL_PLUGIN_STATIC_NAME=adamw_8bit)
target_compile_options(test_optimizer_adamw_8bit PRIVATE -ffp-contract=off -fno-math-errno)
target_include_directories(test_optimizer_adamw_8bit PRIVATE ${CMAKE_SOURCE_DIR}/include)
target_link_libraries(test_optimizer_adamw_8bit PRIVATE OpenMP::OpenMP_C)
target_sources(test_adamw8bit PRIVATE $<TARGET_OBJECTS:test_optimizer_adamw_8bit>)
target_include_directories(test_adamw8bit PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/include)
target_compile_definitions(test_adamw8bit PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_adamw8bit PRIVATE ctrl OpenMP::OpenMP_C m)
add_test(NAME test_adamw8bit COMMAND test_adamw8bit)
set_tests_properties(test_adamw8bit PROPERTIES LABELS parity SKIP_RETURN_CODE 77 TIMEOUT 120)
