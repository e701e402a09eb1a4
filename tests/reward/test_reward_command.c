/* The `command` reward plugin, loaded from its .so through the registry: scores from a program over
 * JSON lines (tests/reward/command_helper.c), against TRL's reward_len on the fixture TRL wrote
 * (tests/reference/make_reward_fixtures.py); the row's columns and completion ids reach the
 * program; a program that exits, stalls or answers garbage is an error naming the reward. */
#include <math.h>
#include <signal.h>
#include <unistd.h>

#include "reward_case.h"

static ctrl_reward *make(const char *options, ctrl_config **cfg) {
    return reward_case_make("command", options, cfg);
}

static void setup(void) { reward_case_setup("command"); }

TEST(matches_trl_reward_len) {
    setup();
    CHECK(ops != NULL);
    if (!ops) return;
    ctrl_config *cfg;
    ctrl_reward *r = make("command = " CTRL_HELPER " len\n", &cfg);
    CHECK(r != NULL);
    reward_case_check_len(r, 3); /* the same program serves batch after batch */
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
}

TEST(columns_and_ids_reach_the_program) {
    setup();
    if (!ops) return;
    ctrl_config *cfg;
    float got[3];
    ctrl_reward *r = make("command = " CTRL_HELPER " column answer\n", &cfg);
    CHECK(r && reward_case_score_columns(r, got) == CTRL_OK);
    CHECK(got[0] == 42.0f && isnan(got[1]) && isnan(got[2])); /* null: the reward does not apply */
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
    r = make("command = " CTRL_HELPER " ids\n", &cfg);
    CHECK(r && reward_case_score_columns(r, got) == CTRL_OK);
    CHECK(got[0] == 2.007f && got[1] == 2.5f && got[2] == 0.0f);
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
}

/* A program that misbehaves: the score call fails naming the reward and the cause. */
static void expect_error(const char *options, const char *part) {
    ctrl_config *cfg;
    ctrl_reward *r = make(options, &cfg);
    CHECK(r != NULL);
    float got[2];
    if (r) {
        CHECK_EQ_INT(reward_case_score_pair(r, got), CTRL_ERR_RUNTIME);
        CHECK_MSG(strstr(ctrl_error_message(), "reward.x") && strstr(ctrl_error_message(), part),
                  "'%s' lacks '%s'", ctrl_error_message(), part);
        CHECK_EQ_INT(reward_case_score_pair(r, got), CTRL_ERR_RUNTIME); /* and stays stopped */
        ops->destroy(r);
    }
    ctrl_config_free(cfg);
}

TEST(misbehaving_programs_are_clear_errors) {
    setup();
    if (!ops) return;
    expect_error("command = exit 3\n", "status 3");
    expect_error("command = sleep 30\ntimeout = 0.3\n", "no reply within");
    expect_error("command = \"echo hello; cat >/dev/null\"\n", "not a JSON list of 2");
    expect_error("command = \"echo '[1]'; cat >/dev/null\"\n", "not a JSON list of 2");
    expect_error("command = kill -9 $$\n", "signal 9");
}

/* Stopping the reward stops what its shell started too: `sh -c` does not exec a command it must wait
 * for, and a wrapper's children would otherwise outlive the run (here a `sleep` that wrote its pid). */
TEST(stopping_it_stops_what_the_shell_started) {
    setup();
    if (!ops) return;
    char pidfile[256];
    snprintf(pidfile, sizeof pidfile, "%s/sleeper.pid", test_tmp_dir());
    char options[512];
    snprintf(options, sizeof options, "command = \"sleep 30 & echo $! >%s; wait\"\n", pidfile);
    ctrl_config *cfg;
    ctrl_reward *r = make(options, &cfg);
    CHECK(r != NULL);
    long pid = 0;
    for (int i = 0; i < 100 && pid <= 0; i++) { /* the shell writes the sleeper's pid */
        FILE *f = fopen(pidfile, "r");
        if (f && fscanf(f, "%ld", &pid) != 1) pid = 0;
        if (f) fclose(f);
        if (pid <= 0) usleep(20000);
    }
    CHECK_MSG(pid > 0, "the command never wrote %s", pidfile);
    if (r) ops->destroy(r);
    ctrl_config_free(cfg);
    if (pid > 0) {
        int gone = 0;
        for (int i = 0; i < 100 && !gone; i++) { /* killed; reaped by init once it is an orphan */
            gone = kill((pid_t)pid, 0) != 0;
            if (!gone) usleep(20000);
        }
        CHECK_MSG(gone, "the shell's child %ld outlived the reward", pid);
    }
}
