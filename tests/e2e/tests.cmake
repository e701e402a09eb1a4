# ctrl_e2e_test(<name> <script> [EMU | EMU_MPI] [SKIP] [TIMEOUT <seconds>]): the ctest <name> runs
# bash tests/e2e/<script> with the CLI, a plugin directory and the source tree as its arguments.
#   (neither)  label e2e, the ordinary plugins (build/plugins); registered where ctrl_cli is built.
#   EMU        a CUDA run under the emulator: label cuda-emu, the plugins of build/plugins-emu (the
#              fixture cuda_emu_plugins fills it), the emulator's libctrl_cuda.so as a 4th argument;
#              registered where ctrl_cuda_emu is built.
#   EMU_MPI    EMU with the emulator's libctrl_mpi.so (NCCL) as a 5th argument; where ctrl_mpi_emu is built.
#   SKIP       exit code 77 means skipped (no mpirun, ...).
#   TIMEOUT    300 seconds unless given.
function(ctrl_e2e_test name script)
  cmake_parse_arguments(PARSE_ARGV 2 arg "EMU;EMU_MPI;SKIP" "TIMEOUT" "")
  if(arg_UNPARSED_ARGUMENTS OR (arg_EMU AND arg_EMU_MPI))
    message(FATAL_ERROR "ctrl_e2e_test(${name}): bad arguments '${ARGN}'")
  endif()
  if(NOT TARGET ctrl_cli)
    return()
  endif()
  set(args $<TARGET_FILE:ctrl_cli>)
  set(props LABELS e2e)
  if(arg_EMU OR arg_EMU_MPI)
    if((arg_EMU AND NOT TARGET ctrl_cuda_emu) OR (arg_EMU_MPI AND NOT TARGET ctrl_mpi_emu))
      return()
    endif()
    list(APPEND args ${CMAKE_BINARY_DIR}/plugins-emu ${CMAKE_SOURCE_DIR} $<TARGET_FILE:ctrl_cuda_emu>)
    if(arg_EMU_MPI)
      list(APPEND args $<TARGET_FILE:ctrl_mpi_emu>)
    endif()
    set(props LABELS cuda-emu FIXTURES_REQUIRED cuda_emu_plugins)
  else()
    list(APPEND args ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  endif()
  if(arg_SKIP)
    list(APPEND props SKIP_RETURN_CODE 77)
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT 300)
  endif()
  add_test(NAME ${name} COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/${script} ${args})
  set_tests_properties(${name} PROPERTIES ${props} TIMEOUT ${arg_TIMEOUT})
endfunction()

# Out-of-tree plugin: install, build examples/reward_plugin with pkg-config, load, list.
add_test(NAME test_out_of_tree_plugin
         COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_out_of_tree_plugin.sh ${CMAKE_BINARY_DIR} ${CMAKE_SOURCE_DIR})
set_tests_properties(test_out_of_tree_plugin PROPERTIES LABELS e2e TIMEOUT 300)

# The SFT loop end to end (tests/e2e/test_train.sh).
ctrl_e2e_test(test_train test_train.sh)

# Checkpoints: exact resume, save_total_limit, kill -9 mid-save, SIGINT (tests/e2e/test_checkpoint.sh).
ctrl_e2e_test(test_checkpoint test_checkpoint.sh)

# Packing end to end: each strategy trains, padded wrapped rows, bad options (tests/e2e/test_packing.sh).
ctrl_e2e_test(test_packing_e2e test_packing.sh)

# The online trainers (grpo, rloo) end to end with colocated generation (tests/e2e/test_online.sh).
ctrl_e2e_test(test_online test_online.sh)

# The online trainers over MPI: online_dpo, gkd and ppo on 2 ranks x 2 prompts follow 1 x 4
# (tests/e2e/test_online_mpi.sh).
ctrl_e2e_test(test_online_mpi test_online_mpi.sh SKIP TIMEOUT 240)

# The online_dpo trainer end to end, colocated and server generation (tests/e2e/test_online_dpo.sh).
ctrl_e2e_test(test_online_dpo_e2e test_online_dpo.sh)

# Training health: collapse warning, non-finite stops (tests/e2e/test_train_health.sh).
ctrl_e2e_test(test_train_health test_train_health.sh)

# GRPO and RLOO with a learned reward model as [reward.rm] plugin = reward_model (tests/e2e/test_reward_model.sh).
ctrl_e2e_test(test_reward_model_e2e test_reward_model.sh)

# Data parallel over MPI: 2 ranks follow one process's curve, resume (tests/e2e/test_mpi.sh).
ctrl_e2e_test(test_mpi test_mpi.sh SKIP)

# ZeRO stages 1 and 2 over MPI: the plain data-parallel curve, half the optimizer state per rank,
# sharded checkpoints and resume (tests/e2e/test_zero_mpi.sh).
ctrl_e2e_test(test_zero_mpi test_zero_mpi.sh SKIP)
# zero3 slices the embeddings and the LM head (tied and untied): plain data parallel's curve, the
# per-rank bytes about half, resume, saves, LoRA (tests/e2e/test_zero3_embed_mpi.sh).
ctrl_e2e_test(test_zero3_embed_mpi test_zero3_embed_mpi.sh SKIP)
# zero3's persistent parameters (stage3_param_persistence_threshold 0, auto, 1e9): plain data parallel's
# curve, the same saved model, fewer tensors gathered, resume, the refusals (tests/e2e/test_zero3_persist_mpi.sh).
ctrl_e2e_test(test_zero3_persist_mpi test_zero3_persist_mpi.sh SKIP)
# zero3 over a QLoRA base (the NF4 store sliced, a layer's gathered around each use): plain data
# parallel + nf4's curve, half the NF4 bytes per rank, resume, QDoRA (tests/e2e/test_zero3_nf4_mpi.sh).
ctrl_e2e_test(test_zero3_nf4_mpi test_zero3_nf4_mpi.sh SKIP)

# ZeRO-3's generation one layer at a time (ds3_gather_for_generation = false) over 2 MPI ranks: the
# whole gather's completions and curves, lockstep, the parameters resident (tests/e2e/test_zero3_generate_mpi.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_zero3_generate_mpi COMMAND bash ${CMAKE_SOURCE_DIR}/tests/e2e/test_zero3_generate_mpi.sh
                                            $<TARGET_FILE:ctrl_cli> ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_zero3_generate_mpi PROPERTIES LABELS e2e TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()

# offload_activations on the CPU: the layer inputs in a file, the same weights bit for bit
# (tests/e2e/test_offload_cpu.sh).
ctrl_e2e_test(test_offload_cpu test_offload_cpu.sh)

# offload_optimizer (and zero1's host step) on a CUDA run under the emulator
# (tests/e2e/test_offload_emu.sh).
ctrl_e2e_test(test_offload_emu test_offload_emu.sh EMU)

# Data parallel and ZeRO-2 on CUDA over NCCL: 2 ranks on the emulated runtime, NCCL and libctrl_mpi.so
# (tests/e2e/test_zero_cuda_emu.sh).
ctrl_e2e_test(test_zero_cuda_emu test_zero_cuda_emu.sh EMU_MPI SKIP TIMEOUT 600)
# GKD (the teacher whole on each device) and server mode (each push a whole-model gather on the devices)
# under zero3 on CUDA, against plain data parallel on CUDA (tests/e2e/test_zero3_trainers_cuda_emu.sh).
ctrl_e2e_test(test_zero3_trainers_cuda_emu test_zero3_trainers_cuda_emu.sh EMU_MPI SKIP TIMEOUT 300)

# GRPO and PPO over 2 ranks on CUDA (the value model's gradients over NCCL) against 2 ranks on the CPU,
# under the emulated runtime, NCCL and libctrl_mpi.so (tests/e2e/test_online_cuda_emu.sh).
ctrl_e2e_test(test_online_cuda_emu test_online_cuda_emu.sh EMU_MPI SKIP)

# LoRA training end to end: SFT, resume, adapter_path, GRPO's reference = adapters off, RLOO
# (tests/e2e/test_lora_train.sh).
ctrl_e2e_test(test_lora_train test_lora_train.sh)

# Evaluation split over 2 ranks (each its batches, the sums reduced): SFT, DPO, KTO and GKD's eval_
# values one process's, uneven shares, zero3 (tests/e2e/test_eval_ranks_mpi.sh).
ctrl_e2e_test(test_eval_ranks_mpi test_eval_ranks_mpi.sh SKIP TIMEOUT 180)
# The online trainers' evaluation split over 2 ranks (each its eval batches' prompts sampled and
# scored, the reward sums reduced): GRPO, RLOO, online DPO and PPO's eval_ values one process's,
# uneven and empty shares, zero3 both ways, server mode (tests/e2e/test_eval_online_mpi.sh).
ctrl_e2e_test(test_eval_online_mpi test_eval_online_mpi.sh SKIP TIMEOUT 120)
# DPO over MPI: 2 ranks x 2 pairs follow 1 x 4, metrics gathered over the ranks (tests/e2e/test_dpo_mpi.sh).
ctrl_e2e_test(test_dpo_mpi test_dpo_mpi.sh SKIP TIMEOUT 120)
# DPO's and KTO's reference sliced under zero3 on 2 ranks: plain data parallel's curves, its bytes per
# rank, resume (tests/e2e/test_zero3_ref_mpi.sh).
ctrl_e2e_test(test_zero3_ref_mpi test_zero3_ref_mpi.sh SKIP TIMEOUT 120)
# What zero3 refused before on the CPU: TR-DPO's reference sync, GKD (its teacher sliced) and server
# mode's weight pushes, against plain data parallel on 2 ranks (tests/e2e/test_zero3_trainers_mpi.sh).
ctrl_e2e_test(test_zero3_trainers_mpi test_zero3_trainers_mpi.sh SKIP TIMEOUT 240)

# The ppo trainer end to end: value model, colocated and server generation, bad options (tests/e2e/test_ppo.sh).
ctrl_e2e_test(test_ppo_e2e test_ppo.sh)

# [train] bf16_fallback: bf16 without a bf16 kernel computes fp32's products (or bf16's rounded ones),
# the log says which (tests/e2e/test_bf16_fallback.sh).
ctrl_e2e_test(test_bf16_fallback test_bf16_fallback.sh)
# adamw_8bit end to end: the 8-bit state saved and resumed exactly, ZeRO refused (tests/e2e/test_adamw8bit.sh).
ctrl_e2e_test(test_adamw8bit_e2e test_adamw8bit.sh)

# adamw_8bit on a CUDA run under the emulator: stepped on the host, the CPU's curve, resume
# (tests/e2e/test_adamw8bit_emu.sh).
ctrl_e2e_test(test_adamw8bit_emu test_adamw8bit_emu.sh EMU)

# adamw_8bit with zero1/2/3 over 2 MPI ranks: the slices' 8-bit state, per-rank files, resume
# (tests/e2e/test_adamw8bit_mpi.sh; skips without mpirun).
ctrl_e2e_test(test_adamw8bit_mpi test_adamw8bit_mpi.sh SKIP)

# ZeRO-3 on CUDA in bf16 (the layers gathered as bf16, fp32 master slices): 2 ranks on the emulated
# runtime, NCCL and libctrl_mpi.so against plain data parallel in bf16 (tests/e2e/test_zero3_cuda_emu.sh).
ctrl_e2e_test(test_zero3_cuda_emu test_zero3_cuda_emu.sh EMU_MPI SKIP)
# overlap_comm on CUDA: zero2 and zero3's reduce-scatters on the communication stream, bit for bit
# overlap_comm = false's (tests/e2e/test_zero_overlap_cuda_emu.sh).
ctrl_e2e_test(test_zero_overlap_cuda_emu test_zero_overlap_cuda_emu.sh EMU_MPI SKIP)
# ZeRO-3 on CUDA with LoRA (the frozen base sliced and gathered with each layer, the adapter saved
# alone), with offload_optimizer (the slices stepped on the host), with DPO / KTO / reward: 2 ranks on
# the emulated runtime against plain data parallel (tests/e2e/test_zero3_{lora,offload,pref}_cuda_emu.sh).
foreach(what lora offload pref)
  ctrl_e2e_test(test_zero3_${what}_cuda_emu test_zero3_${what}_cuda_emu.sh EMU_MPI SKIP)
endforeach()
