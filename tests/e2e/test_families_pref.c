/* The mixture-of-experts load-balancing loss in the preference trainers, as TRL adds it (fixtures from
 * tests/reference/make_family_fixtures.py, make_pref_curve): the tiny Qwen3-MoE of qwen3_moe_sft_aux
 * (8 experts, top 2, router_aux_loss_coef 0.01 in its config) trained 10 optimizer steps on the
 * committed arithmetic rows by TRL and by ctrl from the same weights. DPO with the config's coefficient,
 * 2 x 2 accumulated (coef x aux / accumulation steps per micro-batch, over the real tokens of chosen and
 * rejected), and TRL's evaluate() after the steps (eval_loss holds coef x aux, eval_aux_loss); KTO with
 * [train] router_aux_loss_coef = 0.05 overriding the config (KL sequences out of the aux's tokens). Per
 * step: loss and grad_norm within 1e-4 relative, aux_loss within 1e-5, the learning rate, num_tokens and
 * the rewards / logps metrics within 1e-4 (floored near zero). Also: the key refused on a dense model. */
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

#define V(o, k) (cJSON_GetObjectItem((o), (k)) ? cJSON_GetObjectItem((o), (k))->valuedouble : NAN)

static double rel(double a, double b, double floor) { return fabs(a - b) / (fabs(b) + floor); }

/* The case's last evaluation line against TRL's evaluate(): eval_loss and eval_aux_loss. */
static void check_eval(const char *name, const cJSON *ours, const char *trl_path) {
    ctrl_status st;
    char *text = ctrl_read_text_file(trl_path, 1 << 16, &st);
    cJSON *b = text ? cJSON_Parse(text) : NULL;
    CHECK_MSG(ours && b, "%s: no evaluation to compare", name);
    if (ours && b) {
        static const char *const keys[] = {"eval_loss", "eval_aux_loss", "eval_rewards/chosen",
                                           "eval_rewards/margins", "eval_logps/chosen"};
        for (int i = 0; i < 5; i++)
            CHECK_MSG(rel(V(ours, keys[i]), V(b, keys[i]), 0.1) <= 1e-4, "%s: %s = %.7g, TRL %.7g", name,
                      keys[i], V(ours, keys[i]), V(b, keys[i]));
        printf("  %s: eval_loss %.7g (TRL %.7g), eval_aux_loss %.7g (TRL %.7g)\n", name, V(ours, "eval_loss"),
               V(b, "eval_loss"), V(ours, "eval_aux_loss"), V(b, "eval_aux_loss"));
    }
    cJSON_Delete(b);
    free(text);
}

static void check_case(const char *name, int steps) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    char ini[1024], out[1024], dir[512], src[600], path[1100];
    snprintf(dir, sizeof dir, CTRL_FIXTURE_DIR "/families/%s", name);
    snprintf(src, sizeof src, "%s/case.ini", dir);
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    snprintf(ini, sizeof ini, "%s/%s.ini", tmp, name);
    const char *const subs[][2] = {{"@FIX@", CTRL_FIXTURE_DIR}, {"@OUT@", out}};
    CHECK(test_write_ini_template(src, ini, subs, 2) == 0);
    mkdir(out, 0755);
    ctrl_status st = test_train_ini(ini, NULL, 0);
    CHECK_MSG(st == CTRL_OK, "%s: %s", name, ctrl_error_message());
    if (st != CTRL_OK) return;
    char *ours, *theirs;
    snprintf(path, sizeof path, "%s/case.trl.jsonl", dir);
    if (!test_read_curves(out, path, &ours, &theirs)) return;
    static const char *const metrics[] = {"rewards/chosen", "rewards/rejected", "rewards/margins",
                                          "logps/chosen",   "logps/rejected",   "kl"};
    char *sa, *sb;
    char *la = strtok_r(ours, "\n", &sa), *lb = strtok_r(theirs, "\n", &sb);
    int n = 0;
    double worst = 0, worst_aux = 0;
    cJSON *last_eval = NULL;
    for (; la; la = strtok_r(NULL, "\n", &sa)) {
        cJSON *a = cJSON_Parse(la);
        if (cJSON_GetObjectItem(a, "eval_loss")) {
            cJSON_Delete(last_eval), last_eval = a;
            continue;
        }
        if (!lb || !cJSON_GetObjectItem(a, "step")) {
            cJSON_Delete(a);
            continue;
        }
        cJSON *b = cJSON_Parse(lb);
        lb = strtok_r(NULL, "\n", &sb);
        const int step = (int)V(b, "step");
        CHECK_EQ_INT((int)V(a, "step"), step);
        const double el = rel(V(a, "loss"), V(b, "loss"), 0),
                     eg = rel(V(a, "grad_norm"), V(b, "grad_norm"), 0),
                     ea = rel(V(a, "aux_loss"), V(b, "aux_loss"), 0);
        worst = fmax(worst, fmax(el, eg)), worst_aux = fmax(worst_aux, ea);
        CHECK_MSG(el <= 1e-4, "%s step %d: loss %.7g vs TRL %.7g", name, step, V(a, "loss"), V(b, "loss"));
        CHECK_MSG(eg <= 1e-4, "%s step %d: grad_norm %.7g vs TRL %.7g", name, step, V(a, "grad_norm"),
                  V(b, "grad_norm"));
        CHECK_MSG(ea <= 1e-5, "%s step %d: aux_loss %.7g vs TRL %.7g", name, step, V(a, "aux_loss"),
                  V(b, "aux_loss"));
        CHECK_NEAR(V(a, "learning_rate"), V(b, "learning_rate"), 1e-9);
        CHECK_EQ_INT((long)V(a, "num_tokens"), (long)V(b, "num_tokens"));
        for (size_t i = 0; i < sizeof metrics / sizeof metrics[0]; i++) {
            if (!cJSON_GetObjectItem(b, metrics[i])) continue; /* KTO: a batch without that label */
            const double e = rel(V(a, metrics[i]), V(b, metrics[i]), 0.1);
            worst = fmax(worst, e);
            CHECK_MSG(e <= 1e-4, "%s step %d: %s = %.7g, TRL %.7g", name, step, metrics[i], V(a, metrics[i]),
                      V(b, metrics[i]));
        }
        n++;
        cJSON_Delete(a), cJSON_Delete(b);
    }
    CHECK_EQ_INT(n, steps);
    printf("  %s: %d steps, worst relative error %.2g (loss, grad_norm, metrics), aux_loss %.2g\n", name, n,
           worst, worst_aux);
    snprintf(path, sizeof path, "%s/case.trl_eval.json", dir);
    if (access(path, R_OK) == 0) check_eval(name, last_eval, path);
    cJSON_Delete(last_eval);
    free(ours), free(theirs);
}

TEST(qwen3_moe_dpo_with_aux_loss_matches_trl) { check_case("qwen3_moe_dpo_aux", 10); }
TEST(qwen3_moe_kto_with_overridden_aux_loss_matches_trl) { check_case("qwen3_moe_kto_aux", 10); }

/* [train] router_aux_loss_coef > 0 on a dense model: refused naming the key (TRL raises there). */
TEST(router_aux_loss_coef_refused_on_a_dense_model) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    char ini[1024], out[1024];
    snprintf(out, sizeof out, "%s/aux_dense", tmp);
    snprintf(ini, sizeof ini, "%s/aux_dense.ini", tmp);
    const char *const subs[][2] = {{"@FIX@", CTRL_FIXTURE_DIR}, {"@OUT@", out}};
    CHECK(test_write_ini_template(CTRL_FIXTURE_DIR "/families/qwen3_moe_kto_aux/case.ini", ini, subs, 2) ==
          0);
    const char *const dense[] = {"model.path=" CTRL_FIXTURE_DIR "/trl_sft/model", "train.max_steps=1"};
    const ctrl_status st = test_train_ini(ini, dense, 2);
    CHECK_EQ_INT(st, CTRL_ERR_CONFIG);
    CHECK_MSG(strstr(ctrl_error_message(), "router_aux_loss_coef") && strstr(ctrl_error_message(), ".ini:"),
              "%s", ctrl_error_message());
}

/* step 1's logged value of `key` in out/metrics.jsonl (NAN when absent). */
static double step1(const char *out, const char *key) {
    char path[1100];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    ctrl_status st;
    char *text = ctrl_read_text_file(path, 1 << 20, &st), *save;
    double v = NAN;
    for (char *l = text ? strtok_r(text, "\n", &save) : NULL; l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(l);
        if (o && V(o, "step") == 1 && cJSON_GetObjectItem(o, key)) v = V(o, key);
        cJSON_Delete(o);
    }
    free(text);
    return v;
}

/* The online trainers (GRPO, RLOO) on the tiny Qwen3-MoE: one step of 2 x 2 micro-batches with the
 * config's coefficient (0.01) and with [train] router_aux_loss_coef = 0 from the same weights and seed
 * (the same completions): the logged loss differs by exactly coef x the logged aux_loss (the mean over
 * micro-batches of coef x aux / accumulation steps, summed), and the run without it logs no aux_loss. */
static void check_online(const char *trainer) {
    const char *tmp = test_tmp_dir();
    if (!tmp) TEST_SKIP("no temporary directory");
    char ini[1024], out[2][1024];
    snprintf(ini, sizeof ini, "%s/%s_aux.ini", tmp, trainer);
    FILE *f = fopen(ini, "w");
    CHECK(f != NULL);
    if (!f) return;
    fprintf(
        f,
        "[run]\ntrainer = %s\noutput_dir = %s/%s_aux\nseed = 3\ndevice = cpu\n[model]\npath = %s\n"
        "attention = eager\n[data]\ntrain_file = %s\n[train]\ndtype = fp32\nlearning_rate = 1e-3\n"
        "max_steps = 1\nper_device_train_batch_size = 4\ngradient_accumulation_steps = 2\nlogging_steps = 1\n"
        "save_strategy = no\n[generation]\nkv_cache_bytes = 4000000\n[reward.len]\nplugin = length\n"
        "target_length = 3\n[%s]\nnum_generations = 2\nmax_completion_length = 4\n",
        trainer, tmp, trainer, CTRL_FIXTURE_DIR "/families/qwen3_moe_sft_aux/model",
        CTRL_FIXTURE_DIR "/trl_dpo/eval_pairs.jsonl", trainer);
    fclose(f);
    for (int run = 0; run < 2; run++) {
        char o[1300];
        snprintf(out[run], sizeof out[run], "%.900s/%s_aux%d", tmp, trainer, run);
        snprintf(o, sizeof o, "run.output_dir=%.1000s", out[run]);
        mkdir(out[run], 0755);
        const char *const sets[] = {o, "train.router_aux_loss_coef=0"};
        const ctrl_status st = test_train_ini(ini, sets, run ? 2 : 1);
        CHECK_MSG(st == CTRL_OK, "%s: %s", trainer, ctrl_error_message());
        if (st != CTRL_OK) return;
    }
    const double with = step1(out[0], "loss"), without = step1(out[1], "loss"),
                 aux = step1(out[0], "aux_loss");
    CHECK_MSG(aux > 1 && aux < 8, "%s: aux_loss %g (E sum f P lies in [1, E])", trainer, aux);
    CHECK_MSG(fabs(with - without - 0.01 * aux) <= 1e-5 * fabs(with) + 1e-7,
              "%s: loss %.8g with, %.8g without, 0.01 x aux_loss %.8g", trainer, with, without, 0.01 * aux);
    CHECK(isnan(step1(out[1], "aux_loss")));
    printf("  %s: loss %.7g with the aux loss, %.7g without, 0.01 x aux_loss %.7g\n", trainer, with, without,
           0.01 * aux);
}

TEST(grpo_adds_the_aux_loss) { check_online("grpo"); }
TEST(rloo_adds_the_aux_loss) { check_online("rloo"); }
