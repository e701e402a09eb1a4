# The sft trainer plugin linked statically, against transformers' loss with num_items_in_batch.
add_executable(test_trainer_sft ${CMAKE_SOURCE_DIR}/tests/trainer/test_trainer_sft.c ${CMAKE_SOURCE_DIR}/tests/test_main.c
               ${CMAKE_SOURCE_DIR}/plugins/trainer/sft/sft.c)
set_source_files_properties(${CMAKE_SOURCE_DIR}/plugins/trainer/sft/sft.c TARGET_DIRECTORY test_trainer_sft
                            PROPERTIES COMPILE_DEFINITIONS CTRL_PLUGIN_STATIC_NAME=sft)
target_include_directories(test_trainer_sft PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/core)
target_compile_definitions(test_trainer_sft PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures")
target_link_libraries(test_trainer_sft PRIVATE ctrl m)
add_test(NAME test_trainer_sft COMMAND test_trainer_sft)
set_tests_properties(test_trainer_sft PROPERTIES LABELS parity SKIP_RETURN_CODE 77 TIMEOUT 60)

# The reward trainer plugin linked statically, on the score head, against TRL's RewardTrainer.
add_executable(test_trainer_reward ${CMAKE_SOURCE_DIR}/tests/trainer/test_trainer_reward.c ${CMAKE_SOURCE_DIR}/tests/test_main.c
               ${CMAKE_SOURCE_DIR}/tests/test_registry.c ${CMAKE_SOURCE_DIR}/plugins/trainer/reward/reward.c)
set_source_files_properties(${CMAKE_SOURCE_DIR}/plugins/trainer/reward/reward.c TARGET_DIRECTORY test_trainer_reward
                            PROPERTIES COMPILE_DEFINITIONS CTRL_PLUGIN_STATIC_NAME=reward)
target_include_directories(test_trainer_reward PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/include
                           ${CMAKE_SOURCE_DIR}/core ${CMAKE_SOURCE_DIR}/kernels ${CJSON_INCLUDE_DIR})
target_compile_definitions(test_trainer_reward PRIVATE CTRL_FIXTURE_DIR="${CMAKE_SOURCE_DIR}/tests/fixtures"
                           CTRL_PLUGIN_DIR="${CTRL_PLUGIN_OUTPUT_DIR}")
target_link_libraries(test_trainer_reward PRIVATE ctrl ${CJSON_LIBRARY} m)
add_dependencies(test_trainer_reward reward eager)
add_test(NAME test_trainer_reward COMMAND test_trainer_reward)
set_tests_properties(test_trainer_reward PROPERTIES LABELS parity TIMEOUT 60)

# The dpo trainer plugin (loaded from build/plugins) and the sequence kind against TRL 1.16's
# DPOTrainer (tests/reference/make_dpo_fixtures.py).
foreach(t test_dpo)
  ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/trainer/${t}.c parity)
  target_sources(${t} PRIVATE ${CMAKE_SOURCE_DIR}/tests/trainer/dpo_case.c)
  add_dependencies(${t} dpo flash eager)
endforeach()

# The kto trainer plugin (loaded from build/plugins) on the sequence kind against TRL 1.16's
# KTOTrainer (tests/reference/make_kto_fixtures.py).
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/trainer/test_kto.c parity)
target_sources(test_kto PRIVATE ${CMAKE_SOURCE_DIR}/tests/trainer/dpo_case.c)
add_dependencies(test_kto kto flash eager)

# The distillation head (model_jsd.c) against TRL 1.16's GKD generalized_jsd_loss
# (tests/reference/make_gkd_fixtures.py).
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/trainer/test_gkd_jsd.c parity)
target_sources(test_gkd_jsd PRIVATE ${CMAKE_SOURCE_DIR}/tests/trainer/dpo_case.c)
add_dependencies(test_gkd_jsd eager gkd)

# The online_dpo trainer plugin (loaded from build/plugins) against TRL 1.16's
# OnlineDPOTrainer.training_step (tests/reference/make_online_dpo_fixtures.py).
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/trainer/test_online_dpo.c parity)
target_sources(test_online_dpo PRIVATE ${CMAKE_SOURCE_DIR}/tests/trainer/dpo_case.c)
add_dependencies(test_online_dpo online_dpo flash eager)

# The gkd trainer end to end: learning, seq_kd, KL variants, a bf16 teacher, refusals (test_gkd.sh).
if(TARGET ctrl_cli)
  add_test(NAME test_gkd COMMAND bash ${CMAKE_SOURCE_DIR}/tests/trainer/test_gkd.sh $<TARGET_FILE:ctrl_cli>
                                 ${CTRL_PLUGIN_OUTPUT_DIR} ${CMAKE_SOURCE_DIR})
  set_tests_properties(test_gkd PROPERTIES LABELS e2e TIMEOUT 300)
  if(CTRL_HAVE_CUDA_EMU) # its device check runs the emulated plugins (build/plugins-emu)
    set_tests_properties(test_gkd PROPERTIES FIXTURES_REQUIRED cuda_emu_plugins)
  endif()
endif()

# The ppo trainer plugin (loaded from build/plugins) against TRL 0.25's PPOTrainer
# (tests/reference/make_ppo_fixtures.py): rollout, losses, gradients and metrics.
ctrl_add_c_test(${CMAKE_SOURCE_DIR}/tests/trainer/test_ppo.c parity)
add_dependencies(test_ppo ppo adamw paged flash eager)
