# The bf16 tests once more with the AVX-512 BF16 path switched off: the portable kernels.
add_test(NAME test_bf16_portable COMMAND test_bf16)
set_tests_properties(test_bf16_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
# The blocked bf16 GEMM: as is (AVX-512 BF16 where the CPU has it), then with it switched off.
ctrl_add_c_test(${CMAKE_CURRENT_LIST_DIR}/test_gemm_bf16.c unit)
add_test(NAME test_gemm_bf16_portable COMMAND test_gemm_bf16)
set_tests_properties(test_gemm_bf16_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
# The AMX kernel: its instructions' emulation on its own, then the GEMM tests run on the emulated AMX
# kernel (the same source as the hardware path) and with AMX forced off.
ctrl_add_c_test(${CMAKE_CURRENT_LIST_DIR}/test_gemm_bf16_amx_emu.c unit)
add_test(NAME test_gemm_bf16_amx COMMAND test_gemm_bf16)
set_tests_properties(test_gemm_bf16_amx PROPERTIES LABELS unit ENVIRONMENT CTRL_AMX_EMULATE=1 TIMEOUT 120)
# ... and on the tuning switches' other tile variant and small blocks (many depth, row and column blocks)
add_test(NAME test_gemm_bf16_amx_tuned COMMAND test_gemm_bf16)
set_tests_properties(test_gemm_bf16_amx_tuned PROPERTIES LABELS unit TIMEOUT 120
                     ENVIRONMENT "CTRL_AMX_EMULATE=1;CTRL_AMX_TILE=3;CTRL_AMX_BLOCKS=64,64,96")
add_test(NAME test_gemm_bf16_no_amx COMMAND test_gemm_bf16)
set_tests_properties(test_gemm_bf16_no_amx PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AMX=1 TIMEOUT 120)
# The bf16 unit tests (ctrl_cpu_gemm_bf16_nt on bf16 operands, the linear layer) on the emulated AMX kernel.
add_test(NAME test_bf16_amx COMMAND test_bf16)
set_tests_properties(test_bf16_amx PROPERTIES LABELS unit ENVIRONMENT CTRL_AMX_EMULATE=1 TIMEOUT 120)
# The model's bf16 parity with transformers (autocast) on the emulated AMX kernel.
add_test(NAME test_model_parity_amx COMMAND test_model_parity)
set_tests_properties(test_model_parity_amx PROPERTIES LABELS parity ENVIRONMENT CTRL_AMX_EMULATE=1 TIMEOUT 300)
# The products on pre-packed panels (forward and transposed) against the unpacked GEMM: as is, on the
# emulated AMX kernel, and with AVX-512 BF16 off (no panels: the products refuse).
ctrl_add_c_test(${CMAKE_CURRENT_LIST_DIR}/test_gemm_bf16_panels.c unit)
add_test(NAME test_gemm_bf16_panels_amx COMMAND test_gemm_bf16_panels)
set_tests_properties(test_gemm_bf16_panels_amx PROPERTIES LABELS unit ENVIRONMENT CTRL_AMX_EMULATE=1 TIMEOUT 120)
add_test(NAME test_gemm_bf16_panels_portable COMMAND test_gemm_bf16_panels)
set_tests_properties(test_gemm_bf16_panels_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
# Operands shared by several products (packed once) against the same products packing per call: as
# is, on the emulated AMX kernel, on it with small blocks, and with AVX-512 BF16 off (the products refuse).
ctrl_add_c_test(${CMAKE_CURRENT_LIST_DIR}/test_gemm_bf16_shared.c unit)
add_test(NAME test_gemm_bf16_shared_amx COMMAND test_gemm_bf16_shared)
set_tests_properties(test_gemm_bf16_shared_amx PROPERTIES LABELS unit ENVIRONMENT CTRL_AMX_EMULATE=1 TIMEOUT 120)
add_test(NAME test_gemm_bf16_shared_amx_tuned COMMAND test_gemm_bf16_shared)
set_tests_properties(test_gemm_bf16_shared_amx_tuned PROPERTIES LABELS unit TIMEOUT 120
                     ENVIRONMENT "CTRL_AMX_EMULATE=1;CTRL_AMX_BLOCKS=64,64,96")
add_test(NAME test_gemm_bf16_shared_portable COMMAND test_gemm_bf16_shared)
set_tests_properties(test_gemm_bf16_shared_portable PROPERTIES LABELS unit ENVIRONMENT CTRL_NO_AVX512BF16=1 TIMEOUT 120)
# AVX2 decoding's bf16 product (gemm_bf16_avx2.c) against its ordered fmaf sums, at 1 and 2 threads.
ctrl_add_c_test(${CMAKE_CURRENT_LIST_DIR}/test_gemm_bf16_avx2.c unit)
