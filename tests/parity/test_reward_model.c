/* The `reward_model` reward plugin (plugins/reward/reward_model) loaded from its .so with a real
 * config: the tiny Qwen2ForSequenceClassification of tests/fixtures/score/qwen2 scores prompt +
 * completion texts as TRL's GRPOTrainer scores them with a reward model (the texts tokenized by
 * the tiny_bpe tokenizer without special tokens, right-padded, transformers' scores:
 * make_score_fixtures.py), in batches of 3 so that a batch boundary falls inside; a causal LM or a
 * missing directory is a clear error naming the section. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/reward.h>

#include "file_text.h"
#include "test.h"
#include "test_registry.h"

static const char *const BASE = "[run]\ndevice = cpu\n[model]\npath = " CTRL_FIXTURE_DIR "/score/qwen2\n";

static ctrl_status create(ctrl_registry *reg, const char *extra, ctrl_reward **r, const ctrl_reward_ops **ops,
                          ctrl_config **cfg) {
    char ini[4096];
    snprintf(ini, sizeof ini, "%s[reward.rm]\nplugin = reward_model\n%s", BASE, extra);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_REWARD, "reward_model");
    CHECK(e != NULL);
    *cfg = test_config_from_text(reg, "rm.ini", ini);
    if (!e || !*cfg) return CTRL_ERR_CONFIG;
    *ops = e->plugin->ops;
    return (*ops)->create(ctrl_host_table(), *cfg, "reward.rm", r);
}

TEST(reward_model_scores_as_transformers) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_reward *r = NULL;
    const ctrl_reward_ops *ops = NULL;
    ctrl_config *cfg = NULL;
    ctrl_status st = create(reg,
                            "path = " CTRL_FIXTURE_DIR "/score/qwen2\ntokenizer = " CTRL_FIXTURE_DIR
                            "/tokenizer/tiny_bpe\nbatch_size = 3\n",
                            &r, &ops, &cfg);
    CHECK_MSG(st == CTRL_OK, "%s", ctrl_error_message());
    ctrl_status rst;
    char *text = ctrl_read_text_file(CTRL_FIXTURE_DIR "/score/qwen2/reward_plugin.json", 1 << 20, &rst);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL);
    if (st != CTRL_OK || !root) return;
    const char *prompts[8], *completions[8];
    float want[8], got[8];
    int n = 0;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompts")->child,
                *c = cJSON_GetObjectItemCaseSensitive(root, "completions")->child,
                *s = cJSON_GetObjectItemCaseSensitive(root, "scores")->child;
    for (; p && c && s && n < 8; p = p->next, c = c->next, s = s->next, n++)
        prompts[n] = p->valuestring, completions[n] = c->valuestring, want[n] = (float)s->valuedouble;
    CHECK_EQ_INT(n, 4);
    const ctrl_reward_batch b = {.size = sizeof b, .n = n, .prompts = prompts, .completions = completions};
    CHECK_EQ_INT(ops->score(r, &b, got), CTRL_OK);
    const double e = test_rel_error_f32(got, want, n);
    CHECK_MSG(e <= 1e-5, "scores relative error %.3g", e);
    printf("  reward_model: 4 completions, scores rel %.1e against transformers\n", e);
    ops->destroy(r);
    cJSON_Delete(root);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

/* Conversational prompts as TRL's GRPOTrainer scores them with a reward model
 * (make_score_fixtures.py chat_fixture, trl.data_utils.apply_chat_template): the prompt's messages
 * plus the completion as the assistant's message, rendered with the reward model's chat template --
 * the text equal to TRL's byte for byte, the end-of-turn after the completion included -- and the
 * scores equal to transformers'. The rendered prompt the batch also carries (the policy's, ending
 * in the generation prompt) is not what TRL scores. */
TEST(reward_model_scores_conversations_as_trl) {
    ctrl_status rst;
    char *text = ctrl_read_text_file(CTRL_FIXTURE_DIR "/score/qwen2/reward_plugin_chat.json", 1 << 20, &rst);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK(root != NULL);
    if (!root) return;
    const char *prompts[8], *completions[8];
    char *messages[8];
    float want[8], got[8];
    int n = 0;
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "messages")->child,
                *c = cJSON_GetObjectItemCaseSensitive(root, "completions")->child,
                *t = cJSON_GetObjectItemCaseSensitive(root, "texts")->child,
                *s = cJSON_GetObjectItemCaseSensitive(root, "scores")->child;
    for (; m && c && t && s && n < 8; m = m->next, c = c->next, t = t->next, s = s->next, n++) {
        messages[n] = cJSON_PrintUnformatted(m), completions[n] = c->valuestring,
        want[n] = (float)s->valuedouble;
        prompts[n] = "<|im_start|>user\n(the policy's rendering)<|im_end|>\n<|im_start|>assistant\n";
    }
    CHECK_EQ_INT(n, 4);
    ctrl_registry *reg = test_plugin_registry();
    /* the text, through the host table as the plugin gets it */
    ctrl_config *cfg = test_config_from_text(reg, "rm_chat.ini", BASE);
    ctrl_score_model *sm = NULL;
    CHECK_EQ_INT(ctrl_host_table()->score_model_open(cfg, CTRL_FIXTURE_DIR "/score/qwen2",
                                                     CTRL_FIXTURE_DIR "/tokenizer/tiny_bpe", &sm),
                 CTRL_OK);
    t = cJSON_GetObjectItemCaseSensitive(root, "texts")->child;
    for (int i = 0; sm && t && i < n; i++, t = t->next) {
        char *ours = NULL;
        CHECK_EQ_INT(ctrl_host_table()->score_model_chat_text(sm, messages[i], completions[i], &ours),
                     CTRL_OK);
        CHECK_MSG(ours && !strcmp(ours, t->valuestring), "conversation %d: '%s', TRL '%s'", i,
                  ours ? ours : "", t->valuestring);
        free(ours);
    }
    ctrl_host_table()->score_model_close(sm);
    ctrl_config_free(cfg);
    /* the scores, through the plugin */
    ctrl_reward *r = NULL;
    const ctrl_reward_ops *ops = NULL;
    ctrl_status st = create(reg,
                            "path = " CTRL_FIXTURE_DIR "/score/qwen2\ntokenizer = " CTRL_FIXTURE_DIR
                            "/tokenizer/tiny_bpe\nbatch_size = 3\n",
                            &r, &ops, &cfg);
    CHECK_MSG(st == CTRL_OK, "%s", ctrl_error_message());
    if (st == CTRL_OK) {
        const ctrl_reward_batch b = {.size = sizeof b,
                                     .n = n,
                                     .prompts = prompts,
                                     .completions = completions,
                                     .prompt_messages = (const char *const *)messages};
        CHECK_EQ_INT(ops->score(r, &b, got), CTRL_OK);
        const double e = test_rel_error_f32(got, want, n);
        CHECK_MSG(e <= 1e-5, "conversation scores relative error %.3g", e);
        printf(
            "  reward_model: 4 conversations, texts equal to TRL's, scores rel %.1e against transformers\n",
            e);
        ops->destroy(r);
    }
    for (int i = 0; i < n; i++) free(messages[i]);
    cJSON_Delete(root);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(a_causal_lm_or_no_model_is_a_clear_error) {
    ctrl_registry *reg = test_plugin_registry();
    ctrl_reward *r = NULL;
    const ctrl_reward_ops *ops = NULL;
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(create(reg,
                        "path = " CTRL_FIXTURE_DIR "/models/qwen2\ntokenizer = " CTRL_FIXTURE_DIR
                        "/tokenizer/tiny_bpe\n",
                        &r, &ops, &cfg),
                 CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "[reward.rm]");
    CHECK_CONTAINS(ctrl_error_message(), "not a reward model");
    ctrl_config_free(cfg);
    CHECK(create(reg, "path = /nonexistent/rm\n", &r, &ops, &cfg) != CTRL_OK);
    CHECK_CONTAINS(ctrl_error_message(), "/nonexistent/rm");
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}
