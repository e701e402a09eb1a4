/* The offline trainer kinds on a GPU (`[run] device = cuda`) against the CPU backend on the same
 * seed, each from its TRL parity fixture's config cut to 3 steps: DPO with a live reference model on
 * the device, and with the reference log-probs precomputed there plus the sft loss and gradient
 * accumulation; KTO (its KL rows), and with desirable / undesirable weights and a precomputed
 * reference; reward models (the sequence classifier's score head on the device, centering and
 * margins), with gradient accumulation, and under a PEFT LoRA adapter of task_type SEQ_CLS. Every
 * logged metric within 1e-4 relative + 1e-6 absolute and the saved weights (the adapter with LoRA)
 * within 5e-5 of the CPU's (measured under the emulator: metrics within 2.1e-5 relative, weights
 * within 7.9e-7). The optimizer steps on the device, so two readers of the host's parameters were
 * wrong there before this test: DPO's and KTO's logits/chosen and logits/rejected (the LM head's
 * mean row, now taken from the device's copy) and the saved LoRA adapter (now brought back from
 * the device first). SFT's device runs are tests/cuda/test_cuda_train.c (against TRL's curves), the
 * online kinds' and GKD's tests/cuda/test_cuda_online.c. Skips without a GPU; under the CUDA
 * emulator it is test_cuda_trainers_emu (about 30 s). */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda/cuda_ops.h"
#include "device/cuda_backend.h"
#include "device_vs_cpu.h"
#include "test.h"
#include "test_registry.h"

/* tests/fixtures/<set>/<name>.ini run 3 steps on the CPU and on the device. */
static void kind_case(const char *set, const char *name) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    if (!need_gpu()) TEST_SKIP(ctrl_cuda_unavailable_reason());
    char dir[1024], src[1200], ini[1200], cpu_out[1200], dev_out[1200], o1[1300], o2[1300];
    snprintf(dir, sizeof dir, CTRL_FIXTURE_DIR "/%s", set);
    snprintf(src, sizeof src, "%s/%s.ini", dir, name);
    snprintf(ini, sizeof ini, "%s/%s_%s.ini", tmp, set, name);
    snprintf(cpu_out, sizeof cpu_out, "%s/%s_%s-cpu", tmp, set, name);
    snprintf(dev_out, sizeof dev_out, "%s/%s_%s-cuda", tmp, set, name);
    mkdir(cpu_out, 0755), mkdir(dev_out, 0755);
    const char *const subs[][2] = {{"@DIR@", dir},
                                   {"@SFT@", CTRL_FIXTURE_DIR "/trl_sft"},
                                   {"@MODEL@", !strcmp(set, "trl_reward") ? test_reward_model_dir() : ""},
                                   {"@OUT@", cpu_out}};
    CHECK(test_write_ini_template(src, ini, subs, 4) == 0);
    snprintf(o1, sizeof o1, "run.output_dir=%s", cpu_out);
    snprintf(o2, sizeof o2, "run.output_dir=%s", dev_out);
    const char *on_cpu[] = {"train.max_steps=3", o1},
               *on_dev[] = {"train.max_steps=3", o2, "run.device=cuda"};
    ctrl_status st = test_train_ini(ini, on_cpu, 2);
    CHECK_MSG(st == CTRL_OK, "%s on the CPU: %s", name, ctrl_error_message());
    if (st == CTRL_OK) st = test_train_ini(ini, on_dev, 3);
    CHECK_MSG(st == CTRL_OK, "%s on the device: %s", name, ctrl_error_message());
    if (st != CTRL_OK) return;
    char *ma = read_file(dev_out, "metrics.jsonl"), *mb = read_file(cpu_out, "metrics.jsonl");
    const double wm = ma && mb ? compare_metrics(name, ma, mb) : 0;
    const double ww = compare_weights(name, dev_out, cpu_out);
    printf("  %s: device vs CPU over 3 steps: metrics within %.2g relative, weights within %.2g\n", name, wm,
           ww);
    free(ma), free(mb);
}

TEST(dpo_live_reference_on_device) { kind_case("trl_dpo", "sigmoid"); }
TEST(dpo_precomputed_reference_sft_ga_on_device) { kind_case("trl_dpo", "sigmoid_sft_precompute_ga"); }
TEST(kto_on_device) { kind_case("trl_kto", "kto"); }
TEST(kto_weights_precompute_ga_on_device) { kind_case("trl_kto", "kto_weights_precompute_ga"); }
TEST(reward_on_device) { kind_case("trl_reward", "margin_center"); }
TEST(reward_grad_accum_on_device) { kind_case("trl_reward", "grad_accum"); }
TEST(reward_lora_on_device) { kind_case("trl_reward", "lora_margin"); }
