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
