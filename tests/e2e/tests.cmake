# Out-of-tree plugin: install, build examples/reward_plugin with pkg-config, load, list.
add_test(NAME test_out_of_tree_plugin
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_out_of_tree_plugin.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
set_tests_properties(test_out_of_tree_plugin PROPERTIES LABELS e2e TIMEOUT 300)

# The SFT loop end to end (tests/e2e/test_train.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_train COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_train.sh $<TARGET_FILE:ctrl_cli>
                                   ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_train PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# Checkpoints: exact resume, save_total_limit, kill -9 mid-save, SIGINT (tests/e2e/test_checkpoint.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_checkpoint COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_checkpoint.sh $<TARGET_FILE:ctrl_cli>
                                        ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_checkpoint PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# Packing end to end: each strategy trains, padded wrapped rows, bad options (tests/e2e/test_packing.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_packing_e2e COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_packing.sh $<TARGET_FILE:ctrl_cli>
                                         ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_packing_e2e PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# The online trainers (grpo, rloo) end to end with colocated generation (tests/e2e/test_online.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_online COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_online.sh $<TARGET_FILE:ctrl_cli>
                                    ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_online PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# The online trainers over MPI: online_dpo, gkd and ppo on 2 ranks x 2 prompts follow 1 x 4
# (tests/e2e/test_online_mpi.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_online_mpi COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_online_mpi.sh
                                        $<TARGET_FILE:ctrl_cli> ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_online_mpi PROPERTIES LABELS e2e TIMEOUT 240 SKIP_RETURN_CODE 77)
endif()

# The online_dpo trainer end to end, colocated and server generation (tests/e2e/test_online_dpo.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_online_dpo_e2e COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_online_dpo.sh
                                            $<TARGET_FILE:ctrl_cli> ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_online_dpo_e2e PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# Training health: collapse warning, non-finite stops (tests/e2e/test_train_health.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_train_health COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_train_health.sh
                                          $<TARGET_FILE:ctrl_cli> ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_train_health PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# GRPO and RLOO with a learned reward model as [reward.rm] plugin = reward_model (tests/e2e/test_reward_model.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_reward_model_e2e COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_reward_model.sh
                                              $<TARGET_FILE:ctrl_cli> ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_reward_model_e2e PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# Data parallel over MPI: 2 ranks follow one process's curve, resume (tests/e2e/test_mpi.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_mpi COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_mpi.sh $<TARGET_FILE:ctrl_cli>
                                 ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_mpi PROPERTIES LABELS e2e TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# ZeRO stages 1 and 2 over MPI: the plain data-parallel curve, half the optimizer state per rank,
# sharded checkpoints and resume (tests/e2e/test_zero_mpi.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_zero_mpi COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_zero_mpi.sh $<TARGET_FILE:ctrl_cli>
                                      ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_zero_mpi PROPERTIES LABELS e2e TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# offload_activations on the CPU: the layer inputs in a file, the same weights bit for bit
# (tests/e2e/test_offload_cpu.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_offload_cpu COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_offload_cpu.sh $<TARGET_FILE:ctrl_cli>
                                         ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_offload_cpu PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# offload_optimizer (and zero1's host step) on a CUDA run under the emulator
# (tests/e2e/test_offload_emu.sh).
if(TARGET ctrl_cli AND TARGET ctrl_cuda_emu)
  add_test(NAME test_offload_emu COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_offload_emu.sh $<TARGET_FILE:ctrl_cli>
                                         ${CMAKE_BINARY_DIR}/plugins-emu ${CMAKE_SOURCE_DIR} $<TARGET_FILE:ctrl_cuda_emu>)
  set_tests_properties(test_offload_emu PROPERTIES LABELS cuda-emu TIMEOUT 300 FIXTURES_REQUIRED cuda_emu_plugins)
endif()

# Data parallel and ZeRO-2 on CUDA over NCCL: 2 ranks on the emulated runtime, NCCL and libctrl_mpi.so
# (tests/e2e/test_zero_cuda_emu.sh).
if(TARGET ctrl_cli AND TARGET ctrl_mpi_emu)
  add_test(NAME test_zero_cuda_emu COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_zero_cuda_emu.sh $<TARGET_FILE:ctrl_cli>
                                           ${CMAKE_BINARY_DIR}/plugins-emu ${CMAKE_SOURCE_DIR} $<TARGET_FILE:ctrl_cuda_emu>
                                           $<TARGET_FILE:ctrl_mpi_emu>)
  set_tests_properties(test_zero_cuda_emu PROPERTIES LABELS cuda-emu TIMEOUT 600 SKIP_RETURN_CODE 77
                                                     FIXTURES_REQUIRED cuda_emu_plugins)
endif()

# GRPO and PPO over 2 ranks on CUDA (the value model's gradients over NCCL) against 2 ranks on the CPU,
# under the emulated runtime, NCCL and libctrl_mpi.so (tests/e2e/test_online_cuda_emu.sh).
if(TARGET ctrl_cli AND TARGET ctrl_mpi_emu)
  add_test(NAME test_online_cuda_emu COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_online_cuda_emu.sh $<TARGET_FILE:ctrl_cli>
                                             ${CMAKE_BINARY_DIR}/plugins-emu ${CMAKE_SOURCE_DIR} $<TARGET_FILE:ctrl_cuda_emu>
                                             $<TARGET_FILE:ctrl_mpi_emu>)
  set_tests_properties(test_online_cuda_emu PROPERTIES LABELS cuda-emu TIMEOUT 300 SKIP_RETURN_CODE 77
                                                       FIXTURES_REQUIRED cuda_emu_plugins)
endif()

# LoRA training end to end: SFT, resume, adapter_path, GRPO's reference = adapters off, RLOO
# (tests/e2e/test_lora_train.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_lora_train COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_lora_train.sh $<TARGET_FILE:ctrl_cli>
                                        ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_lora_train PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# DPO over MPI: 2 ranks x 2 pairs follow 1 x 4, metrics gathered over the ranks (tests/e2e/test_dpo_mpi.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_dpo_mpi COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_dpo_mpi.sh $<TARGET_FILE:ctrl_cli>
                                     ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_dpo_mpi PROPERTIES LABELS e2e TIMEOUT 120 SKIP_RETURN_CODE 77)
endif()

# The ppo trainer end to end: value model, colocated and server generation, bad options (tests/e2e/test_ppo.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_ppo_e2e COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_ppo.sh $<TARGET_FILE:ctrl_cli>
                                      ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_ppo_e2e PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# adamw_8bit end to end: the 8-bit state saved and resumed exactly, ZeRO refused (tests/e2e/test_adamw8bit.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_adamw8bit_e2e COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_adamw8bit.sh $<TARGET_FILE:ctrl_cli>
                                           ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_adamw8bit_e2e PROPERTIES LABELS e2e TIMEOUT 300)
endif()

# adamw_8bit on a CUDA run under the emulator: stepped on the host, the CPU's curve, resume
# (tests/e2e/test_adamw8bit_emu.sh).
if(TARGET ctrl_cli AND TARGET ctrl_cuda_emu)
  add_test(NAME test_adamw8bit_emu COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_adamw8bit_emu.sh $<TARGET_FILE:ctrl_cli>
                                           ${CMAKE_BINARY_DIR}/plugins-emu ${CMAKE_SOURCE_DIR} $<TARGET_FILE:ctrl_cuda_emu>)
  set_tests_properties(test_adamw8bit_emu PROPERTIES LABELS cuda-emu TIMEOUT 300 FIXTURES_REQUIRED cuda_emu_plugins)
endif()

# adamw_8bit with zero1/2/3 over 2 MPI ranks: the slices' 8-bit state, per-rank files, resume
# (tests/e2e/test_adamw8bit_mpi.sh; skips without mpirun).
if(TARGET ctrl_cli)
  add_test(NAME test_adamw8bit_mpi COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_adamw8bit_mpi.sh $<TARGET_FILE:ctrl_cli>
                                           ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_adamw8bit_mpi PROPERTIES LABELS e2e SKIP_RETURN_CODE 77 TIMEOUT 300)
endif()

# ZeRO-3 on CUDA in bf16 (the layers gathered as bf16, fp32 master slices): 2 ranks on the emulated
# runtime, NCCL and libctrl_mpi.so against plain data parallel in bf16 (tests/e2e/test_zero3_cuda_emu.sh).
if(TARGET ctrl_cli AND TARGET ctrl_mpi_emu)
  add_test(NAME test_zero3_cuda_emu COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_zero3_cuda_emu.sh
                                                 $<TARGET_FILE:ctrl_cli> ${CMAKE_BINARY_DIR}/plugins-emu ${CMAKE_SOURCE_DIR}
                                                 $<TARGET_FILE:ctrl_cuda_emu> $<TARGET_FILE:ctrl_mpi_emu>)
  set_tests_properties(test_zero3_cuda_emu PROPERTIES LABELS cuda-emu TIMEOUT 300 SKIP_RETURN_CODE 77
                                                           FIXTURES_REQUIRED cuda_emu_plugins)
endif()
