/* The host table's option readers (plugin_api.h's ctrl_option_*): a declared option reads its
 * validated value -- the file's, or the option table's default, with no default restated by the
 * plugin -- and a key without a value is a config error naming [section] key that sticks, so a
 * plugin reads all its options and checks once. */
#include "config_test_support.h"
#include "test.h"

static ctrl_config *load(ctrl_registry *reg, const char *ini) {
    char file[512];
    snprintf(file, sizeof file, "%s", write_ini("api.ini", ini, 0));
    ctrl_config *cfg = NULL;
    CHECK_EQ_INT(ctrl_config_load(file, NULL, 0, reg, &cfg), CTRL_OK);
    if (!cfg) printf("  %s\n", ctrl_error_message());
    return cfg;
}

TEST(option_readers_return_the_file_value_or_the_table_default) {
    ctrl_registry *reg = test_registry();
    ctrl_config *cfg = load(reg, BASE_INI "[adamw]\nadam_beta1 = 0.8\n[reward.len]\nplugin = length\n");
    const ctrl_host *h = ctrl_host_table();
    CHECK(h->size >= offsetof(ctrl_host, error_wrap) + sizeof h->error_wrap);
    ctrl_status st = CTRL_OK;
    CHECK_NEAR(h->option_float(cfg, "adamw", "adam_beta1", &st), 0.8, 0);
    CHECK_EQ_INT(h->option_int(cfg, "reward.len", "target_length", &st), 20); /* t_length's default */
    CHECK_STR(h->option_string(cfg, "reward.len", "unit", &st), "chars");
    CHECK_EQ_INT(st, CTRL_OK);
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(a_key_without_value_is_a_sticky_config_error) {
    ctrl_registry *reg = test_registry();
    ctrl_config *cfg = load(reg, BASE_INI "[reward.len]\nplugin = length\n");
    const ctrl_host *h = ctrl_host_table();
    ctrl_status st = CTRL_OK;
    CHECK_EQ_INT(h->option_int(cfg, "reward.len", "no_such_key", &st), 0);
    CHECK_EQ_INT(st, CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "[reward.len] no_such_key");
    /* Later reads neither succeed nor replace the first message. */
    CHECK_EQ_INT(h->option_int(cfg, "reward.len", "target_length", &st), 0);
    CHECK_EQ_INT(h->option_bool(cfg, "reward.len", "other_missing", &st), 0);
    CHECK_EQ_INT(st, CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "no_such_key");
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(a_value_of_another_type_is_a_config_error) {
    ctrl_registry *reg = test_registry();
    ctrl_config *cfg = load(reg, BASE_INI "[reward.len]\nplugin = length\n");
    ctrl_status st = CTRL_OK;
    ctrl_host_table()->option_float(cfg, "reward.len", "unit", &st); /* "chars" */
    CHECK_EQ_INT(st, CTRL_ERR_CONFIG);
    CHECK_CONTAINS(ctrl_error_message(), "[reward.len] unit = chars");
    ctrl_config_free(cfg);
    ctrl_registry_destroy(reg);
}

TEST(error_wrap_prefixes_the_message) {
    const ctrl_host *h = ctrl_host_table();
    h->error_set(CTRL_ERR_IO, "cannot read %s", "x.bin");
    CHECK_EQ_INT(h->error_wrap(CTRL_ERR_IO, "reward %s", "kw"), CTRL_ERR_IO);
    CHECK_STR(ctrl_error_message(), "reward kw: cannot read x.bin");
}
