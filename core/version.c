#include <ctrl/version.h>

const char *ctrl_version(void) { return CTRL_VERSION_STRING; }
