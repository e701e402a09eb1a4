/* For tests that need the built plugins or a validated config (ctrl_add_c_test links it in). */
#ifndef CTRL_TEST_REGISTRY_H
#define CTRL_TEST_REGISTRY_H

#include "config/config_load.h"
#include "model/model.h"
#include "registry/registry.h"

/* A registry holding every plugin built into CTRL_PLUGIN_DIR (free with ctrl_registry_destroy). */
ctrl_registry *test_plugin_registry(void);
/* `ini` (INI text) written to this test's scratch directory as `name`, loaded and validated against
 * `reg`; NULL (after a failed CHECK naming the error) when it does not load. */
ctrl_config *test_config_from_text(const ctrl_registry *reg, const char *name, const char *ini);
/* The same INI must be refused as a config error whose message contains `want` (e.g.
 * "name.ini:7: [dpo] loss_type"); a failed CHECK naming the case otherwise. */
void test_config_refused(const ctrl_registry *reg, const char *name, const char *ini, const char *want);

/* The fixtures' tiny Qwen2 (CTRL_FIXTURE_DIR/models/qwen2) on reg's `flash` attention plugin; NULL
 * after a failed CHECK when it cannot be loaded. */
ctrl_model *test_tiny_qwen2(const ctrl_registry *reg);
/* The reward fixtures' tiny Qwen2ForSequenceClassification (tests/fixtures/score/qwen2) beside the
 * tiny_bpe tokenizer (ctrl reads the tokenizer from the model's directory), symlinked into the
 * test's scratch directory once. */
const char *test_reward_model_dir(void);
/* 1 when `path` can be opened for reading. */
int test_file_exists(const char *path);
/* Gives `m` the built `paged` attention plugin to decode with (the registry lives until exit). */
void test_attach_paged(ctrl_model *m);
/* Copies the INI at src_path to dst_path with each subs[i][0] (e.g. "@DIR@") replaced by
 * subs[i][1]; 0 on success. */
int test_write_ini_template(const char *src_path, const char *dst_path, const char *const (*subs)[2],
                            int n_subs);
/* The training run of the INI at `ini` (`n_sets` --set overrides), with the built plugins. */
ctrl_status test_train_ini(const char *ini, const char *const *sets, int n_sets);
/* OUT_DIR/metrics.jsonl and a TRL curve fixture read whole into *ours and *theirs (free both);
 * 0, after a failed CHECK, when either is missing. */
int test_read_curves(const char *out_dir, const char *trl_path, char **ours, char **theirs);

#endif
