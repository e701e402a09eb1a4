/* ctrl's SFT loss curve against TRL's (fixtures from tests/reference/make_trl_sft_curves.py): the same
 * tiny model, data and hyper-parameters, 20 optimizer steps; per step, loss and grad_norm within
 * 1e-4 relative for steps 1-5 and 1e-3 through step 20, the learning rate, entropy and token
 * accuracy as TRL logs them, and the token count. Cases: padded batches, padding-free,
 * completion-only vs full loss, assistant-only loss, gradient accumulation, bfd packing, bfd_split
 * packing (sequences cut at max_length 8), wrapped packing (padded rows), pad_to_multiple_of with
 * padded rows and with padding-free batches (TRL's num_tokens then counts the flat row's padding);
 * padded batches in bf16 (TRL's bf16 = True: autocast) within 1e-2; and LoRA adapters (TRL + PEFT):
 * LoRA, DoRA, and LoRA in bf16. */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "file_text.h"
#include "test.h"
#include "test_registry.h"
#include "device/cuda_backend.h"
#include "train/train.h"

#define DIR CTRL_FIXTURE_DIR "/trl_sft"

/* tests/cuda/test_cuda_train.c includes this file with "cuda": the same curves, trained on a GPU. */
#ifndef TRL_PARITY_DEVICE
#define TRL_PARITY_DEVICE "cpu"
#endif

/* The case's INI with @DIR@ and @OUT@ filled in, written to tmp/<name>.ini. */
static int write_ini(const char *name, char *ini_path, size_t cap, char *out_dir, size_t out_cap) {
    char src_path[1024];
    snprintf(src_path, sizeof src_path, DIR "/%s.ini", name);
    snprintf(out_dir, out_cap, "%s/%s", test_tmp_dir(), name);
    snprintf(ini_path, cap, "%s/%s.ini", test_tmp_dir(), name);
    const char *const subs[][2] = {{"@DIR@", DIR}, {"@OUT@", out_dir}};
    return test_write_ini_template(src_path, ini_path, subs, 2);
}

static double rel(double a, double b) { return fabs(a - b) / fmax(fabs(b), 1e-12); }

/* bf16: the case runs `[train] dtype = bf16` against TRL's bf16 (autocast) curve, within the bf16
 * tolerance (1e-2 relative; token accuracy within acc_tol, as near-ties of the argmax may flip). */
static void run_case_curve(const char *name, const char *curve, int bf16, double acc_tol);
static void run_case_tol(const char *name, int bf16, double acc_tol) {
    run_case_curve(name, name, bf16, acc_tol);
}

/* The case `name` against TRL's curve `curve`.jsonl (another case's: the same run but for a key TRL
 * has no counterpart for). */
static void run_case_curve(const char *name, const char *curve, int bf16, double acc_tol) {
#ifdef TRL_PARITY_SMALL_CASES /* the device's run at CTRL_TEST_SMALL (the CUDA emulator): a subset */
    char key[64];
    snprintf(key, sizeof key, " %s ", name);
    if (getenv("CTRL_TEST_SMALL") && !strstr(TRL_PARITY_SMALL_CASES, key))
        TEST_SKIP("CTRL_TEST_SMALL: a data-pipeline case the CPU run covers (all run natively on a GPU)");
#endif
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    char ini[1200], out[1200], path[1300];
    CHECK(write_ini(name, ini, sizeof ini, out, sizeof out) == 0);
    mkdir(out, 0755);
    ctrl_device dev;
    const ctrl_cuda_backend *cuda;
    if (ctrl_device_select(TRL_PARITY_DEVICE, &dev, &cuda) != CTRL_OK) TEST_SKIP(ctrl_error_message());
    const char *device[] = {"run.device=" TRL_PARITY_DEVICE};
    ctrl_status st = test_train_ini(ini, device, 1);
    if (st == CTRL_ERR_UNSUPPORTED && bf16) TEST_SKIP(ctrl_error_message()); /* a device without bf16 */
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    snprintf(path, sizeof path, DIR "/%s.trl.jsonl", curve);
    char *ours, *theirs;
    if (st != CTRL_OK || !test_read_curves(out, path, &ours, &theirs)) return;
    char *save_a, *save_b;
    char *la = strtok_r(ours, "\n", &save_a), *lb = strtok_r(theirs, "\n", &save_b);
    int steps = 0;
    double worst_loss = 0, worst_norm = 0;
    for (; la && lb; la = strtok_r(NULL, "\n", &save_a), lb = strtok_r(NULL, "\n", &save_b)) {
        cJSON *a = cJSON_Parse(la), *b = cJSON_Parse(lb);
        if (!cJSON_GetObjectItem(a, "step")) { /* the final eval line */
            cJSON_Delete(a), cJSON_Delete(b);
            continue;
        }
        int step = cJSON_GetObjectItem(b, "step")->valueint;
        CHECK_EQ_INT(cJSON_GetObjectItem(a, "step")->valueint, step);
        const double tol = bf16 ? 1e-2 : step <= 5 ? 1e-4 : 1e-3;
        double el =
            rel(cJSON_GetObjectItem(a, "loss")->valuedouble, cJSON_GetObjectItem(b, "loss")->valuedouble);
        double eg = rel(cJSON_GetObjectItem(a, "grad_norm")->valuedouble,
                        cJSON_GetObjectItem(b, "grad_norm")->valuedouble);
        worst_loss = fmax(worst_loss, el), worst_norm = fmax(worst_norm, eg);
        CHECK_MSG(el <= tol, "%s step %d: loss %.7g vs TRL %.7g", name, step,
                  cJSON_GetObjectItem(a, "loss")->valuedouble, cJSON_GetObjectItem(b, "loss")->valuedouble);
        CHECK_MSG(eg <= tol, "%s step %d: grad_norm %.7g vs TRL %.7g", name, step,
                  cJSON_GetObjectItem(a, "grad_norm")->valuedouble,
                  cJSON_GetObjectItem(b, "grad_norm")->valuedouble);
        CHECK_NEAR(cJSON_GetObjectItem(a, "learning_rate")->valuedouble,
                   cJSON_GetObjectItem(b, "learning_rate")->valuedouble, 1e-9);
        CHECK_MSG(rel(cJSON_GetObjectItem(a, "entropy")->valuedouble,
                      cJSON_GetObjectItem(b, "entropy")->valuedouble) <= tol,
                  "%s step %d: entropy %.7g vs TRL %.7g", name, step,
                  cJSON_GetObjectItem(a, "entropy")->valuedouble,
                  cJSON_GetObjectItem(b, "entropy")->valuedouble);
        CHECK_NEAR(cJSON_GetObjectItem(a, "mean_token_accuracy")->valuedouble,
                   cJSON_GetObjectItem(b, "mean_token_accuracy")->valuedouble, bf16 ? acc_tol : 1e-6);
        CHECK_EQ_INT(cJSON_GetObjectItem(a, "num_tokens")->valuedouble,
                     cJSON_GetObjectItem(b, "num_tokens")->valuedouble);
        steps++;
        cJSON_Delete(a), cJSON_Delete(b);
    }
    CHECK_EQ_INT(steps, 20);
    printf("  %s (%s): 20 steps, worst relative error loss %.2g, grad_norm %.2g\n", name, TRL_PARITY_DEVICE,
           worst_loss, worst_norm);
    free(ours), free(theirs);
}

static void run_case_dtype(const char *name, int bf16) { run_case_tol(name, bf16, 0.05); }
static void run_case(const char *name) { run_case_dtype(name, 0); }

TEST(padded) { run_case("padded"); }
TEST(padded_bf16) { run_case_dtype("padded_bf16", 1); }
TEST(padding_free) { run_case("padding_free"); }
TEST(full_loss) { run_case("full_loss"); }
TEST(assistant_only) { run_case("assistant_only"); }
TEST(grad_accum) { run_case("grad_accum"); }
TEST(bfd_packing) { run_case("bfd_packing"); }
TEST(bfd_split_packing) { run_case("bfd_split_packing"); }
TEST(wrapped_packing) { run_case("wrapped_packing"); }
TEST(padded_multiple) { run_case("padded_multiple"); }
TEST(padding_free_multiple) { run_case("padding_free_multiple"); }
/* LoRA ([peft] enabled, all-linear r 8, from the initial adapter PEFT saved): TRL + PEFT's curve
 * (tests/reference/make_lora_sft_curve.py) */
TEST(lora_padded) { run_case("lora_padded"); }
/* DoRA ([peft] use_dora, PEFT's initial adapter with its magnitudes): TRL + PEFT's curve */
TEST(dora_padded) { run_case("dora_padded"); }
/* LoRA under bf16 autocast against TRL + PEFT's bf16 curve (the bf16 tolerance; token accuracy
 * within one token of the 11 a step scores: one near-tie of the argmax flips at step 11) */
TEST(lora_padded_bf16) { run_case_tol("lora_padded_bf16", 1, 1.0 / 11 + 1e-6); }
/* The same with the frozen embedding (tied to the head) held in bf16 ([peft] embedding_dtype = bf16:
 * the lookups rounded) against TRL + PEFT's autocast curve with the table's values rounded to bf16
 * (lora_padded_bf16_emb16.trl.jsonl: the same arithmetic). CPU only. */
TEST(lora_padded_bf16_embedding_bf16) {
    if (strcmp(TRL_PARITY_DEVICE, "cpu") != 0) TEST_SKIP("[peft] embedding_dtype = bf16 is for the CPU");
    run_case_tol("lora_padded_bf16_emb16", 1, 1.0 / 11 + 1e-6);
}
/* The default, embedding_dtype = auto, is that on the CPU under bf16 compute: lora_padded_bf16's run
 * without the key (lora_padded_bf16_auto.ini) follows the rounded table's curve. */
TEST(lora_padded_bf16_embedding_auto) {
    if (strcmp(TRL_PARITY_DEVICE, "cpu") != 0) TEST_SKIP("[peft] embedding_dtype = auto is bf16 on the CPU");
    run_case_curve("lora_padded_bf16_auto", "lora_padded_bf16_emb16", 1, 1.0 / 11 + 1e-6);
}
