/* Declared options: the core and every plugin describe the INI keys they read in a table of
 * these, so that the whole config is validated before any work and documented from one place. */
#ifndef CTRL_OPTION_H
#define CTRL_OPTION_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ctrl_option_type {
    CTRL_OPT_STRING = 0, /* any text */
    CTRL_OPT_INT,        /* 64-bit signed integer */
    CTRL_OPT_FLOAT,      /* double; accepts 1e-5, 0.1, 3 */
    CTRL_OPT_BOOL,       /* true|false|yes|no|on|off|1|0 */
    CTRL_OPT_CHOICE,     /* one of `choices` */
    CTRL_OPT_LIST,       /* comma-separated words, each one of `choices` when choices is set */
    CTRL_OPT_PATH,       /* a file or directory path (relative to the current directory, as in TRL) */
} ctrl_option_type;

enum {
    CTRL_OPT_REQUIRED = 1u << 0, /* must be present (no default) */
    CTRL_OPT_HAS_MIN = 1u << 1,  /* value >= min */
    CTRL_OPT_HAS_MAX = 1u << 2,  /* value <= max */
    CTRL_OPT_MIN_OPEN = 1u << 3, /* value > min (with HAS_MIN) */
    CTRL_OPT_MAX_OPEN = 1u << 4, /* value < max (with HAS_MAX) */
};

typedef struct ctrl_option {
    const char *key; /* INI key, TRL's name where TRL has one */
    ctrl_option_type type;
    const char *default_value; /* as INI text; NULL = no default */
    unsigned flags;            /* CTRL_OPT_REQUIRED | CTRL_OPT_HAS_MIN | ... */
    double min, max;           /* range for INT and FLOAT, per flags */
    const char *choices;       /* "a|b|c" for CHOICE and LIST (a STRING declaring them is held to them) */
    const char *doc;           /* one sentence for `ctrl plugins describe` and the reference */
} ctrl_option;

/* Tables end with an entry whose key is NULL. */
#define CTRL_OPTION_END                                                                                      \
    { 0 }

/* A run configuration, validated against the core's and every selected plugin's option tables:
 * each declared key holds the file's value or its option's default. Opaque; read through the host
 * table (a plugin) or config.h (libctrl's users). */
typedef struct ctrl_config ctrl_config;

#ifdef __cplusplus
}
#endif
#endif
