/* ctrl's DPO curves against TRL's DPOTrainer (fixtures from tests/reference/make_trl_dpo_curves.py):
 * the tiny model of tests/fixtures/trl_sft, arithmetic preference pairs, 20 optimizer steps through
 * `ctrl_train_run` (the preference loader, the sequence kind, the dpo plugin, the loop). Per step:
 * loss and grad_norm within 1e-4 relative, the learning rate, num_tokens, and every metric TRL logs
 * (the rewards, logps and logits metrics, entropy, mean_token_accuracy) within 1e-4 relative plus a small
 * absolute floor for the values fp32 cancellation leaves near zero (a reward is a difference of two
 * log-prob sums of ~-25). Cases: sigmoid with a live reference; sigmoid + sft with loss_weights, a
 * precomputed reference and gradient accumulation; TR-DPO (sync_ref_model every 3 steps); ipo with
 * WPO weighting and LD-DPO; and sigmoid with an eval set, whose last evaluation equals TRL's evaluate()
 * (eval_loss and every eval_ metric). Interrupted after step 10 and resumed (sigmoid: the live reference
 * reloaded; the precomputed case without its stored sums: computed again from the initial weights),
 * the curve is still TRL's uninterrupted one; TR-DPO interrupted and resumed equals TRL's own resumed
 * run (resume_from_checkpoint: the reference reloaded, syncs at the global steps). */
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
#include "train/train.h"

#define DIR CTRL_FIXTURE_DIR "/trl_dpo"

/* The case's INI with @DIR@, @SFT@ and @OUT@ filled in, written to tmp/dpo_<name>.ini. */
static int write_ini(const char *name, char *ini_path, size_t cap, char *out_dir, size_t out_cap) {
    char src_path[1024];
    snprintf(src_path, sizeof src_path, DIR "/%s.ini", name);
    snprintf(out_dir, out_cap, "%s/dpo_%s", test_tmp_dir(), name);
    snprintf(ini_path, cap, "%s/dpo_%s.ini", test_tmp_dir(), name);
    const char *const subs[][2] = {
        {"@DIR@", DIR}, {"@SFT@", CTRL_FIXTURE_DIR "/trl_sft"}, {"@OUT@", out_dir}};
    return test_write_ini_template(src_path, ini_path, subs, 3);
}

static const char *const metrics[] = {"entropy",          "mean_token_accuracy", "rewards/chosen",
                                      "rewards/rejected", "rewards/margins",     "rewards/accuracies",
                                      "logps/chosen",     "logps/rejected",      "logits/chosen",
                                      "logits/rejected"};

/* Interrupts the run after its 10th step (the loop polls once per step). */
static int polls;
static int after_ten(void) { return ++polls == 10; }

/* Trains the case's config with `overrides`; `interrupt`: stopped after step 10 (a checkpoint). */
static ctrl_status train(const char *ini, const char *const *overrides, int n, int interrupt) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_config *cfg = NULL;
    ctrl_status st = ctrl_config_load(ini, overrides, n, reg, &cfg);
    polls = 0;
    if (st == CTRL_OK) st = ctrl_train_run(cfg, interrupt ? after_ten : NULL);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
    return st;
}

/* resume: trained to step 10, interrupted (checkpoint), then resumed to step 20 in the same
 * output_dir; the curve must still be TRL's uninterrupted one. */
static void run_case_resume(const char *name, int resume) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    char ini[1200], out[1200], path[1300];
    CHECK(write_ini(name, ini, sizeof ini, out, sizeof out) == 0);
    mkdir(out, 0755);
    ctrl_status st;
    if (resume) {
        const char *first[] = {"train.save_strategy=steps", "train.save_steps=100"};
        st = train(ini, first, 2, 1);
        CHECK_MSG(st == CTRL_ERR_INTERRUPTED, "%s: interrupted run: %d %s", name, st, ctrl_error_message());
        if (strstr(name, "precompute")) { /* without the stored sums: computed from the initial weights */
            snprintf(path, sizeof path, "%s/ref_logps.bin", out);
            CHECK(unlink(path) == 0);
        }
        const char *again[] = {"train.save_strategy=steps", "train.save_steps=100",
                               "train.resume_from_checkpoint=last"};
        st = train(ini, again, 3, 0);
    } else {
        st = train(ini, NULL, 0, 0);
    }
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    if (st != CTRL_OK) return;
    snprintf(path, sizeof path, DIR "/%s.trl.jsonl", name);
    char *ours, *theirs;
    if (!test_read_curves(out, path, &ours, &theirs)) return;
    char *save_a, *save_b;
    char *la = strtok_r(ours, "\n", &save_a), *lb = strtok_r(theirs, "\n", &save_b);
    int steps = 0;
    double worst_loss = 0, worst_norm = 0, worst_metric = 0;
    cJSON *last_eval = NULL;
    for (; la && lb; la = strtok_r(NULL, "\n", &save_a)) {
        cJSON *a = cJSON_Parse(la);
        if (cJSON_GetObjectItem(a, "eval_loss")) { /* our evaluation lines: the last one is compared below */
            cJSON_Delete(last_eval);
            last_eval = a;
            continue;
        }
        cJSON *b = cJSON_Parse(lb);
        lb = strtok_r(NULL, "\n", &save_b);
        const int step = cJSON_GetObjectItem(b, "step")->valueint;
        CHECK_EQ_INT(cJSON_GetObjectItem(a, "step")->valueint, step);
#define V(o, k) (cJSON_GetObjectItem((o), (k)) ? cJSON_GetObjectItem((o), (k))->valuedouble : NAN)
        const double el = fabs(V(a, "loss") - V(b, "loss")) / fabs(V(b, "loss"));
        const double eg = fabs(V(a, "grad_norm") - V(b, "grad_norm")) / fabs(V(b, "grad_norm"));
        worst_loss = fmax(worst_loss, el), worst_norm = fmax(worst_norm, eg);
        CHECK_MSG(el <= 1e-4, "%s step %d: loss %.7g vs TRL %.7g", name, step, V(a, "loss"), V(b, "loss"));
        CHECK_MSG(eg <= 1e-4, "%s step %d: grad_norm %.7g vs TRL %.7g", name, step, V(a, "grad_norm"),
                  V(b, "grad_norm"));
        CHECK_NEAR(V(a, "learning_rate"), V(b, "learning_rate"), 1e-9);
        if (cJSON_GetObjectItem(b, "num_tokens")) /* absent where TRL's own count restarted (a resume) */
            CHECK_EQ_INT((long)V(a, "num_tokens"), (long)V(b, "num_tokens"));
        for (size_t i = 0; i < sizeof metrics / sizeof metrics[0]; i++) {
            const double x = V(a, metrics[i]), y = V(b, metrics[i]);
            const double e = fabs(x - y) / (fabs(y) + 0.1); /* relative, floored where ~0 */
            worst_metric = fmax(worst_metric, e);
            CHECK_MSG(e <= 1e-4, "%s step %d: %s = %.7g, TRL %.7g", name, step, metrics[i], x, y);
        }
        steps++;
        cJSON_Delete(a), cJSON_Delete(b);
    }
    for (; la; la = strtok_r(NULL, "\n", &save_a)) { /* the final evaluation */
        cJSON *a = cJSON_Parse(la);
        if (cJSON_GetObjectItem(a, "eval_loss"))
            cJSON_Delete(last_eval), last_eval = a;
        else
            cJSON_Delete(a);
    }
    snprintf(path, sizeof path, DIR "/%s.trl_eval.json", name);
    char *trl_eval = access(path, R_OK) == 0 ? ctrl_read_text_file(path, 1 << 16, &st) : NULL;
    if (trl_eval) { /* TRL's evaluate() after the steps: eval_loss and every eval_ metric */
        cJSON *b = cJSON_Parse(trl_eval);
        CHECK_MSG(last_eval != NULL, "%s: no evaluation line", name);
        int compared = 0;
        for (cJSON *it = b ? b->child : NULL; it && last_eval; it = it->next) {
            if (strstr(it->string, "runtime") || strstr(it->string, "per_second") ||
                !strcmp(it->string, "eval_num_tokens"))
                continue;
            const double x = V(last_eval, it->string), y = it->valuedouble;
            const double e = fabs(x - y) / (fabs(y) + 0.1);
            worst_metric = fmax(worst_metric, e);
            CHECK_MSG(e <= 1e-4, "%s: %s = %.7g, TRL %.7g", name, it->string, x, y);
            compared++;
        }
        CHECK_MSG(compared >= 11, "%s: %d evaluation metrics compared", name, compared);
        printf("  %s: %d evaluation metrics match TRL's evaluate()\n", name, compared);
        cJSON_Delete(b);
        free(trl_eval);
    }
#undef V
    cJSON_Delete(last_eval);
    CHECK_EQ_INT(steps, 20);
    if (strstr(name, "precompute")) { /* the reference sums stored beside the run */
        struct stat sb;
        snprintf(path, sizeof path, "%s/ref_logps.bin", out);
        CHECK_MSG(stat(path, &sb) == 0 && sb.st_size > 0, "%s: no %s", name, path);
    }
    printf("  %s: 20 steps, worst relative error loss %.2g, grad_norm %.2g, metrics %.2g\n", name, worst_loss,
           worst_norm, worst_metric);
    free(ours), free(theirs);
}

static void run_case(const char *name) { run_case_resume(name, 0); }

TEST(sigmoid) { run_case("sigmoid"); }
/* interrupted at step 10 and resumed: the live reference is the initial weights again */
TEST(sigmoid_resumed) { run_case_resume("sigmoid", 1); }
TEST(sigmoid_eval) { run_case("sigmoid_eval"); }
TEST(sigmoid_sft_precompute_ga) {
    run_case("sigmoid_sft_precompute_ga");
    run_case("sigmoid_sft_precompute_ga"); /* again: the reference sums read back from ref_logps.bin */
}
/* interrupted and resumed without ref_logps.bin: the policy has moved, so the pass before the resumed
 * steps loads the initial weights for it (and stores the sums again) */
TEST(sigmoid_sft_precompute_ga_resumed) { run_case_resume("sigmoid_sft_precompute_ga", 1); }
TEST(ipo_wpo_ld) { run_case("ipo_wpo_ld"); }
TEST(sigmoid_tr_dpo) { run_case("sigmoid_tr_dpo"); }
/* TR-DPO interrupted at step 10 and resumed, against TRL's own resumed run: the reference is the
 * initial weights again and the syncs stay at global steps 12, 15 and 18 */
TEST(sigmoid_tr_dpo_resumed) { run_case_resume("sigmoid_tr_dpo_resumed", 1); }
