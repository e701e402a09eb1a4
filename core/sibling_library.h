/* Libraries of libctrl's own that a run loads only when it needs them (libctrl_cuda.so for a GPU,
 * libctrl_mpi.so for several ranks), so that a plain run never maps what they link. */
#ifndef CTRL_CORE_SIBLING_LIBRARY_H
#define CTRL_CORE_SIBLING_LIBRARY_H

#include <stddef.h>

/* dlopen()s `name` from libctrl's directory (the build tree and the install prefix keep them
 * together), then from the loader's path -- or only the file the environment variable
 * `override_env` names, when set (may be NULL) -- and returns what its function `table_fn` (no
 * arguments) returns. `global`: RTLD_GLOBAL (the library's dependencies load plugins of their own that need
 * its symbols). NULL with the reason in `why` when it cannot be loaded. */
const void *ctrl_sibling_library_table(const char *name, const char *override_env, const char *table_fn,
                                       int global, char *why, size_t cap);

#endif
