# The bf16 tests once more with the AVX-512 BF16 path switched off: the portable kernels.
add_test(NAME test_bf16_portable COMMAND test_bf16)
set_tests_properties(test_bf16_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
# The blocked bf16 GEMM: as is (AVX-512 BF16 where the CPU has it), then with it switched off.
ctrl_add_c_test(${CMAKE_CURRENT_LIST_DIR}/test_gemm_bf16.c unit)
add_test(NAME test_gemm_bf16_portable COMMAND test_gemm_bf16)
set_tests_properties(test_gemm_bf16_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
