/* ctrl_status: messages, wrapping and exit codes. */
#include <ctrl/status.h>

#include "test.h"

TEST(error_set_and_wrap) {
    ctrl_error_clear();
    CHECK_STR(ctrl_error_message(), "");
    CHECK_EQ_INT(ctrl_error_set(CTRL_ERR_IO, "cannot open %s", "x.ini"), CTRL_ERR_IO);
    CHECK_STR(ctrl_error_message(), "cannot open x.ini");
    CHECK_EQ_INT(ctrl_error_wrap(CTRL_ERR_IO, "loading %d", 3), CTRL_ERR_IO);
    CHECK_STR(ctrl_error_message(), "loading 3: cannot open x.ini");
}

TEST(exit_codes) {
    CHECK_EQ_INT(ctrl_status_exit_code(CTRL_OK), 0);
    CHECK_EQ_INT(ctrl_status_exit_code(CTRL_ERR_USAGE), 2);
    CHECK_EQ_INT(ctrl_status_exit_code(CTRL_ERR_CONFIG), 2);
    CHECK_EQ_INT(ctrl_status_exit_code(CTRL_ERR_INTERRUPTED), 130);
    CHECK_EQ_INT(ctrl_status_exit_code(CTRL_ERR_IO), 1);
    CHECK_EQ_INT(ctrl_status_exit_code(CTRL_ERR_RUNTIME), 1);
}

TEST(save_and_restore_around_cleanup) {
    ctrl_error_saved run;
    ctrl_error_save(&run, ctrl_error_set(CTRL_ERR_INTERRUPTED, "interrupted at step %d", 7));
    ctrl_error_set(CTRL_ERR_IO, "a cleanup step failed and overwrote the message");
    CHECK_EQ_INT(ctrl_error_restore(&run), CTRL_ERR_INTERRUPTED);
    CHECK_STR(ctrl_error_message(), "interrupted at step 7");
    /* CTRL_OK keeps nothing and restores nothing. */
    ctrl_error_saved ok;
    ctrl_error_save(&ok, CTRL_OK);
    ctrl_error_set(CTRL_ERR_IO, "later");
    CHECK_EQ_INT(ctrl_error_restore(&ok), CTRL_OK);
    CHECK_STR(ctrl_error_message(), "later");
}

TEST(the_first_of_several_failures) {
    ctrl_error_saved first = {.status = CTRL_OK};
    for (int i = 0; i < 3; i++) {
        ctrl_status st = i ? ctrl_error_set(CTRL_ERR_PLUGIN, "attempt %d failed", i) : CTRL_OK;
        if (st != CTRL_OK && first.status == CTRL_OK) ctrl_error_save(&first, st);
    }
    CHECK_EQ_INT(ctrl_error_restore(&first), CTRL_ERR_PLUGIN);
    CHECK_STR(ctrl_error_message(), "attempt 1 failed");
}

TEST(append_says_what_is_left) {
    ctrl_error_set(CTRL_ERR_RUNTIME, "loss is NaN at step 3");
    CHECK_EQ_INT(ctrl_error_append(CTRL_ERR_RUNTIME, "the last good checkpoint, %s, is intact", "ckpt-2"),
                 CTRL_ERR_RUNTIME);
    CHECK_STR(ctrl_error_message(), "loss is NaN at step 3; the last good checkpoint, ckpt-2, is intact");
}
