# The whole model against transformers (tests/reference/make_model_fixtures.py), with each
# attention plugin linked in statically.
add_executable(test_model_parity ${CMAKE_SOURCE_DIR}/tests/model/test_model_parity.c ${CMAKE_SOURCE_DIR}/tests/test_main.c
               $<TARGET_OBJECTS:test_attention_eager> $<TARGET_OBJECTS:test_attention_flash>)
target_include_directories(test_model_parity PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core
                           ${CMAKE_SOURCE_DIR}/kernels ${CJSON_INCLUDE_DIR})
target_compile_definitions(test_model_parity PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_model_parity PRIVATE ctrl ${CJSON_LIBRARY} OpenMP::OpenMP_C ctrl_openblas m)
add_test(NAME test_model_parity COMMAND test_model_parity)
set_tests_properties(test_model_parity PROPERTIES LABELS parity TIMEOUT 300)
# bf16 once more on the portable path (where the CPU has AVX-512 BF16, the run above takes that one).
add_test(NAME test_model_parity_portable COMMAND test_model_parity)
set_tests_properties(test_model_parity_portable PROPERTIES LABELS parity ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 300)
# The sequence-classification head against transformers (tests/reference/make_score_fixtures.py).
add_executable(test_score ${CMAKE_SOURCE_DIR}/tests/model/test_score.c ${CMAKE_SOURCE_DIR}/tests/test_main.c
               $<TARGET_OBJECTS:test_attention_eager>)
target_include_directories(test_score PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core
                           ${CMAKE_SOURCE_DIR}/kernels ${CJSON_INCLUDE_DIR})
target_compile_definitions(test_score PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_score PRIVATE ctrl ${CJSON_LIBRARY} OpenMP::OpenMP_C ctrl_openblas m)
add_test(NAME test_score COMMAND test_score)
set_tests_properties(test_score PROPERTIES LABELS parity TIMEOUT 120)
# LoRA against PEFT (tests/reference/make_lora_fixtures.py), the adapter's finite differences,
# PEFT's adapter files both ways.
add_executable(test_lora ${CMAKE_SOURCE_DIR}/tests/model/test_lora.c ${CMAKE_SOURCE_DIR}/tests/test_main.c
               $<TARGET_OBJECTS:test_attention_eager>)
target_include_directories(test_lora PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/core
                           ${CMAKE_SOURCE_DIR}/kernels ${CJSON_INCLUDE_DIR})
target_compile_definitions(test_lora PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_lora PRIVATE ctrl ${CJSON_LIBRARY} OpenMP::OpenMP_C ctrl_openblas m)
add_test(NAME test_lora COMMAND test_lora)
set_tests_properties(test_lora PROPERTIES LABELS parity TIMEOUT 120)
# Saving as save_pretrained saves, against its own directories (tests/reference/make_save_fixtures.py).
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/model/test_save.c parity)
target_sources(test_save PRIVATE $<TARGET_OBJECTS:test_attention_eager>)
target_link_libraries(test_save PRIVATE OpenMP::OpenMP_C ctrl_openblas)
add_dependencies(test_save sft adamw flash eager checkpointing)
set_tests_properties(test_save PROPERTIES TIMEOUT 120)
# trainable_token_indices beside LoRA past the PEFT parity of test_lora.c (test_lora_tokens.c).
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/model/test_lora_tokens.c parity)
target_sources(test_lora_tokens PRIVATE $<TARGET_OBJECTS:test_attention_eager>)
target_link_libraries(test_lora_tokens PRIVATE OpenMP::OpenMP_C ctrl_openblas)
set_tests_properties(test_lora_tokens PROPERTIES TIMEOUT 60)
# The frozen base of a LoRA model held in bf16 changes no number (test_lora_bf16_base.c), on the
# AVX-512 BF16 path and the portable one.
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/model/test_lora_bf16_base.c parity)
target_sources(test_lora_bf16_base PRIVATE $<TARGET_OBJECTS:test_attention_eager>)
target_link_libraries(test_lora_bf16_base PRIVATE OpenMP::OpenMP_C ctrl_openblas)
set_tests_properties(test_lora_bf16_base PROPERTIES TIMEOUT 60)
add_test(NAME test_lora_bf16_base_portable COMMAND test_lora_bf16_base)
set_tests_properties(test_lora_bf16_base_portable PROPERTIES LABELS parity ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 60)
