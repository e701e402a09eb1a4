/* The registry against purpose-built plugins (tests/registry/tests.cmake): every way a plugin can
 * be broken gives one clear error naming the file, never a crash, and good plugins beside a bad
 * one still load. Files that are not ELF at all are written by the test itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "registry/registry.h"
#include "test.h"

static ctrl_status load_case(const char *dir, ctrl_registry **out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", CTRL_TEST_PLUGIN_DIR, dir);
    CHECK(ctrl_registry_create(out) == CTRL_OK);
    ctrl_log_set_level(CTRL_LOG_OFF); /* the registry logs each failure; the test checks the message */
    ctrl_status st = ctrl_registry_load_dir(*out, path);
    ctrl_log_set_level(CTRL_LOG_INFO);
    return st;
}

static void expect_failure(const char *dir, const char *file, const char *a, const char *b) {
    ctrl_registry *reg;
    ctrl_status st = load_case(dir, &reg);
    const char *msg = ctrl_error_message();
    CHECK_MSG(st == CTRL_ERR_PLUGIN, "%s: status %s: %s", dir, ctrl_status_name(st), msg);
    CHECK_CONTAINS(msg, file);
    if (a) CHECK_CONTAINS(msg, a);
    if (b) CHECK_CONTAINS(msg, b);
    ctrl_registry_destroy(reg);
}

TEST(good_plugin_loads) {
    ctrl_registry *reg;
    CHECK_EQ_INT(load_case("good", &reg), CTRL_OK);
    CHECK_EQ_INT(ctrl_registry_count(reg), 1);
    const ctrl_plugin_entry *e = ctrl_registry_find(reg, CTRL_KIND_REWARD, "good");
    CHECK(e != NULL);
    if (e) CHECK_CONTAINS(e->file, "good/good.so");
    CHECK(ctrl_registry_find(reg, CTRL_KIND_TRAINER, "good") == NULL);
    ctrl_registry_destroy(reg);
}

TEST(wrong_abi_prints_both_numbers) {
    char want[64];
    snprintf(want, sizeof want, "plugin ABI %u, this ctrl expects %u", CTRL_PLUGIN_ABI + 6, CTRL_PLUGIN_ABI);
    expect_failure("wrong_abi", "wrong_abi.so", want, NULL);
}

TEST(wrong_signature_prints_both) {
    expect_failure("wrong_signature", "wrong_signature.so", "ctrl1-ilp32", CTRL_PLUGIN_SIGNATURE);
}

TEST(small_descriptor) {
    expect_failure("small_descriptor", "small_descriptor.so", "descriptor size 8", NULL);
}
TEST(null_ops) { expect_failure("null_ops", "null_ops.so", "no ops table", NULL); }
TEST(init_failure_carries_the_plugin_message) {
    expect_failure("init_fails", "init_fails.so", "failed to initialise", "license file not found");
}
TEST(missing_entry_symbol) { expect_failure("no_entry", "no_entry.so", "no 'ctrl_plugins' symbol", NULL); }
TEST(entry_returning_null) { expect_failure("null_list", "null_list.so", "returned NULL", NULL); }
TEST(bad_name) { expect_failure("bad_name", "Bad Name.so", "'Bad Name'", "[a-z0-9_]+"); }

TEST(duplicate_names_both_files) {
    ctrl_registry *reg;
    CHECK_EQ_INT(load_case("duplicate", &reg), CTRL_ERR_PLUGIN);
    const char *msg = ctrl_error_message();
    CHECK_CONTAINS(msg, "twin_copy.so");
    CHECK_CONTAINS(msg, "twin.so");
    CHECK_CONTAINS(msg, "already loaded");
    /* The first of the twins and the unrelated plugin are registered. */
    CHECK(ctrl_registry_find(reg, CTRL_KIND_REWARD, "twin") != NULL);
    CHECK(ctrl_registry_find(reg, CTRL_KIND_REWARD, "other") != NULL);
    ctrl_registry_destroy(reg);
}

TEST(bad_plugin_among_good_ones) {
    ctrl_registry *reg;
    CHECK_EQ_INT(load_case("mixed", &reg), CTRL_ERR_PLUGIN);
    CHECK_CONTAINS(ctrl_error_message(), "broken.so");
    CHECK_EQ_INT(ctrl_registry_count(reg), 2);
    CHECK(ctrl_registry_find(reg, CTRL_KIND_REWARD, "alpha") &&
          ctrl_registry_find(reg, CTRL_KIND_REWARD, "zulu"));
    ctrl_registry_destroy(reg);
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

TEST(not_elf_and_truncated_elf) {
    char dir[] = "/tmp/ctrl-registry-test-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[512];
    snprintf(path, sizeof path, "%s/text.so", dir);
    write_file(path, "this is not a shared object\n", 28);
    ctrl_registry *reg;
    CHECK_EQ_INT(ctrl_registry_create(&reg), CTRL_OK);
    CHECK_EQ_INT(ctrl_registry_load_file(reg, path), CTRL_ERR_PLUGIN);
    CHECK_CONTAINS(ctrl_error_message(), "text.so");
    CHECK_CONTAINS(ctrl_error_message(), "not a shared object");
    /* The first 200 bytes of a real plugin: an ELF header with nothing behind it. */
    char good[1024];
    snprintf(good, sizeof good, "%s/good/good.so", CTRL_TEST_PLUGIN_DIR);
    FILE *f = fopen(good, "rb");
    char head[200] = {0};
    size_t n = f ? fread(head, 1, sizeof head, f) : 0;
    if (f) fclose(f);
    CHECK_EQ_INT(n, sizeof head);
    snprintf(path, sizeof path, "%s/cut.so", dir);
    write_file(path, head, sizeof head);
    CHECK_EQ_INT(ctrl_registry_load_file(reg, path), CTRL_ERR_PLUGIN);
    CHECK_CONTAINS(ctrl_error_message(), "cut.so");
    CHECK_CONTAINS(ctrl_error_message(), "truncated");
    /* An empty file and a file that is not a .so in a scanned directory. */
    snprintf(path, sizeof path, "%s/empty.so", dir);
    write_file(path, "", 0);
    snprintf(path, sizeof path, "%s/README.txt", dir);
    write_file(path, "ignored\n", 8);
    ctrl_log_set_level(CTRL_LOG_OFF);
    CHECK_EQ_INT(ctrl_registry_load_dir(reg, dir), CTRL_ERR_PLUGIN);
    ctrl_log_set_level(CTRL_LOG_INFO);
    CHECK_CONTAINS(ctrl_error_message(), "cut.so"); /* the first failure, in name order */
    CHECK_EQ_INT(ctrl_registry_count(reg), 0);
    ctrl_registry_destroy(reg);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

TEST(missing_directory_and_search_order) {
    ctrl_registry *reg;
    CHECK_EQ_INT(ctrl_registry_create(&reg), CTRL_OK);
    const char *dirs[] = {"/nonexistent-plugin-dir"};
    CHECK_EQ_INT(ctrl_registry_load_standard(reg, dirs, 1), CTRL_ERR_PLUGIN);
    CHECK_CONTAINS(ctrl_error_message(), "/nonexistent-plugin-dir");
    ctrl_registry_destroy(reg);
    /* CTRL_PLUGIN_PATH is searched after --plugin-dir; the same directory twice loads once. */
    char good[1024];
    snprintf(good, sizeof good, "%s/good", CTRL_TEST_PLUGIN_DIR);
    setenv("CTRL_PLUGIN_PATH", good, 1);
    CHECK_EQ_INT(ctrl_registry_create(&reg), CTRL_OK);
    const char *same[] = {good};
    CHECK_EQ_INT(ctrl_registry_load_standard(reg, same, 1), CTRL_OK);
    CHECK_EQ_INT(ctrl_registry_count(reg), 1);
    ctrl_registry_destroy(reg);
    unsetenv("CTRL_PLUGIN_PATH");
}

TEST(kind_names) {
    CHECK_STR(ctrl_kind_name(CTRL_KIND_ATTENTION), "attention");
    CHECK_STR(ctrl_kind_name(CTRL_KIND_REWARD), "reward");
    CHECK_EQ_INT(ctrl_kind_parse("optimizer"), CTRL_KIND_OPTIMIZER);
    CHECK_EQ_INT(ctrl_kind_parse("widget"), -1);
}
