# Tokenizer parity with the `tokenizers` library (fixtures from tests/reference/make_tokenizer_fixtures.py).
add_executable(test_tokenizer_parity ${CMAKE_SOURCE_DIR}/tests/tokenizer/test_tokenizer_parity.c
               ${CMAKE_SOURCE_DIR}/tests/test_main.c)
target_include_directories(test_tokenizer_parity PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core
                           ${CJSON_INCLUDE_DIR})
target_compile_definitions(test_tokenizer_parity PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures"
                           CTRL_SHARED_DIR="${CTRL_SHARED_DIR}")
target_link_libraries(test_tokenizer_parity PRIVATE ctrl ${CJSON_LIBRARY})
add_test(NAME test_tokenizer_parity COMMAND test_tokenizer_parity)
set_tests_properties(test_tokenizer_parity PROPERTIES LABELS parity SKIP_RETURN_CODE 77 TIMEOUT 300)

# SentencePiece-style variants of the tiny tokenizer (edits + expected ids/texts in tiny_sp_variants.jsonl).
# Also "unit": fast, so the sanitizer build (scripts/test.sh, ctest -L 'unit|e2e') runs it too.
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/tokenizer/test_tokenizer_sp_variants.c parity)
set_tests_properties(test_tokenizer_sp_variants PROPERTIES LABELS "parity;unit")

# Ids from untrusted tokenizer.json / tokenizer_config.json: each bad one refused where it is read.
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/tokenizer/test_tokenizer_ids.c unit)

# Long lines: linear encoding time, interruption.
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/tokenizer/test_tokenizer_long_input.c unit)
