# test_exp_approx runs with UBSan's checks for the undefined behaviour a bit-trick exp can hit
# (a NaN converted to an integer, a negative value shifted), aborting on the first report.
if(CMAKE_C_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(test_exp_approx PRIVATE -fsanitize=float-cast-overflow,shift,signed-integer-overflow
                                                 -fno-sanitize-recover=all)
  target_link_options(test_exp_approx PRIVATE -fsanitize=float-cast-overflow,shift,signed-integer-overflow)
endif()
# QLoRA's NF4 products (kernels/cpu/gemm_nf4.c) on the emulated AMX kernel (its B panels packed from
# the NF4 source as the AVX-512 kernel's are) and with the AVX-512 BF16 path off (the banded fallback).
add_test(NAME test_nf4_gemm_amx COMMAND test_nf4_gemm)
set_tests_properties(test_nf4_gemm_amx PROPERTIES LABELS unit ENVIRONMENT CTRL_AMX_EMULATE=1 TIMEOUT 120)
add_test(NAME test_nf4_gemm_portable COMMAND test_nf4_gemm)
set_tests_properties(test_nf4_gemm_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
# LoRA's frozen embedding in bf16 ([peft] embedding_dtype = bf16) on the portable bf16 path as well
# (the tied head's SGEMM on widened blocks of the table).
add_test(NAME test_lora_embed16_portable COMMAND test_lora_embed16)
set_tests_properties(test_lora_embed16_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
add_test(NAME test_lora_embed16_values COMMAND test_lora_embed16)
set_tests_properties(test_lora_embed16_values PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_EMBED_PANELS=1 TIMEOUT 120)
# Decoding's packed weights with AVX-512 BF16 off: the AVX2 panels where AVX2 runs, and a frozen model's
# hold as panels refused (the model decodes as before).
add_test(NAME test_decode_packed_portable COMMAND test_decode_packed)
set_tests_properties(test_decode_packed_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
