/* Validation of plugin files and descriptors before anything of theirs is used. */
#ifndef CTRL_CORE_PLUGIN_CHECK_H
#define CTRL_CORE_PLUGIN_CHECK_H

#include <ctrl/plugin.h>

/* The file is a regular, readable ELF shared object (checked before dlopen, so that a text file
 * named x.so gets a clear message instead of the loader's). */
ctrl_status ctrl_plugin_check_file(const char *path);

/* ABI number, size, signature, kind, name, vtable size and option table of one descriptor. */
ctrl_status ctrl_plugin_check(const ctrl_plugin *p, const char *origin);

#endif
