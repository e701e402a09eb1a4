/* Reading an INI file. iniparser gives the values; a line scanner that follows the same syntax
 * gives what iniparser does not keep: the line of every section and key, duplicate keys and
 * sections (iniparser silently keeps the last), syntax errors with their line, and lines longer
 * than iniparser's buffer (which it would truncate).
 *
 * The scanner also refuses, each with its line, the constructs where iniparser 4.1 would either
 * fail without saying where or silently read something else than the user wrote:
 *   - a line ending in '\' (iniparser joins the next line to it, even to a comment);
 *   - a comment after a section header ("[run] ; x" is a syntax error to iniparser);
 *   - a quoted value without its closing quote (iniparser keeps the quote as text) or with text
 *     after the closing quote (iniparser drops that text);
 *   - a UTF-8 byte-order mark, and UTF-16 files (iniparser reads the mark as part of the name). */
#include <ctype.h>
#include <errno.h>
#include <iniparser.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "config/config_internal.h"

#define INI_MAX_LINE 1000 /* iniparser 4.1 reads lines into a 1024-byte buffer */
#define INI_MAX_BYTES (16 << 20)

char *config_trim(char *s) {
    while (isspace((unsigned char)*s)) s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1])) *--e = '\0';
    return s;
}

static void lower(char *s) {
    for (; *s; s++) *s = (char)tolower((unsigned char)*s);
}

static ctrl_status add_section(ctrl_config *cfg, const char *name, int line) {
    for (int i = 0; i < cfg->n_sections; i++)
        if (!strcmp(cfg->sections[i].name, name))
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: [%s]: duplicate section (first at line %d)",
                                  cfg->file_name, line, name, cfg->sections[i].line);
    char where[512];
    snprintf(where, sizeof where, "%s:%d", cfg->file_name, line);
    return config_add_section(cfg, name, where, line);
}

/* A value that opens with a quote must close it, with only a comment after the closing quote. */
static ctrl_status check_quotes(const ctrl_config *cfg, int line, const char *section, const char *key,
                                const char *value) {
    if (*value != '"' && *value != '\'') return CTRL_OK;
    const char *close = strchr(value + 1, *value);
    if (!close)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: [%s] %s: unterminated quote (missing closing %c)",
                              cfg->file_name, line, section, key, *value);
    const char *rest = close + 1;
    while (isspace((unsigned char)*rest)) rest++;
    if (*rest && *rest != ';' && *rest != '#')
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s:%d: [%s] %s: unexpected text after the closing quote: '%s'", cfg->file_name,
                              line, section, key, rest);
    return CTRL_OK;
}

/* Pass 1: structure and line numbers over the file's bytes. Values are stored provisionally and
 * replaced by iniparser's in pass 2. */
static ctrl_status scan(ctrl_config *cfg, char *text, size_t size) {
    char section[256] = "";
    int line = 0;
    int saw_content = 0;
    char *next = text;
    const unsigned char *u = (const unsigned char *)text;
    if (size >= 2 && ((u[0] == 0xff && u[1] == 0xfe) || (u[0] == 0xfe && u[1] == 0xff)))
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s:1: the file is UTF-16; save it as UTF-8", cfg->file_name);
    if (size >= 3 && !memcmp(text, "\xef\xbb\xbf", 3))
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s:1: the file starts with a UTF-8 byte-order mark; save it without one",
                              cfg->file_name);
    while (next < text + size) {
        char *s = next;
        char *nl = memchr(s, '\n', (size_t)(text + size - s));
        size_t len = nl ? (size_t)(nl - s) : (size_t)(text + size - s);
        next = s + len + 1;
        line++;
        if (memchr(s, '\0', len))
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: binary data (NUL byte); not an INI file",
                                  cfg->file_name, line);
        if (len > INI_MAX_LINE)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: line longer than %d characters", cfg->file_name,
                                  line, INI_MAX_LINE);
        s[len] = '\0';
        s = config_trim(s);
        if (*s && s[strlen(s) - 1] == '\\')
            return ctrl_error_set(CTRL_ERR_CONFIG,
                                  "%s:%d: line ends with '\\', which would join the next line to it; "
                                  "remove the backslash or quote the value",
                                  cfg->file_name, line);
        if (!*s || *s == ';' || *s == '#') continue;
        saw_content = 1;
        if (*s == '[') {
            char *end = strchr(s, ']');
            if (!end)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: section header without closing ']'",
                                      cfg->file_name, line);
            char *rest = config_trim(end + 1);
            if (*rest == ';' || *rest == '#')
                return ctrl_error_set(CTRL_ERR_CONFIG,
                                      "%s:%d: comment after a section header; put it on a line of its own",
                                      cfg->file_name, line);
            if (*rest)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: unexpected text after section header: '%s'",
                                      cfg->file_name, line, rest);
            *end = '\0';
            char *name = config_trim(s + 1);
            if (!*name)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: empty section name", cfg->file_name, line);
            if (strlen(name) >= sizeof section)
                return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: section name too long", cfg->file_name, line);
            for (char *c = name; *c; c++)
                if (!(isalnum((unsigned char)*c) || *c == '_' || *c == '.' || *c == '-'))
                    return ctrl_error_set(
                        CTRL_ERR_CONFIG,
                        "%s:%d: [%s]: section names use letters, digits, '_', '-' and '.' only",
                        cfg->file_name, line, name);
            lower(name);
            strcpy(section, name);
            ctrl_status st = add_section(cfg, section, line);
            if (st != CTRL_OK) return st;
            continue;
        }
        char *eq = strchr(s, '=');
        if (!eq)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: expected 'key = value' or '[section]', got '%s'",
                                  cfg->file_name, line, s);
        *eq = '\0';
        char *key = config_trim(s);
        if (!*key) return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: '=' without a key", cfg->file_name, line);
        for (char *c = key; *c; c++)
            if (!(isalnum((unsigned char)*c) || *c == '_' || *c == '.' || *c == '-'))
                return ctrl_error_set(CTRL_ERR_CONFIG,
                                      "%s:%d: '%s': keys use letters, digits, '_', '-' and '.' only",
                                      cfg->file_name, line, key);
        lower(key);
        if (!section[0])
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: %s: key outside any [section]", cfg->file_name,
                                  line, key);
        ctrl_status qst = check_quotes(cfg, line, section, key, config_trim(eq + 1));
        if (qst != CTRL_OK) return qst;
        config_entry *dup = config_find(cfg, section, key);
        if (dup)
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s:%d: [%s] %s: duplicate key (first at line %d)",
                                  cfg->file_name, line, section, key, dup->line);
        char where[512];
        snprintf(where, sizeof where, "%s:%d", cfg->file_name, line);
        ctrl_status st = config_put(cfg, section, key, "", where, line);
        if (st != CTRL_OK) return st;
    }
    if (!saw_content)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: the file is empty (expected sections such as [run] and [model])",
                              cfg->file_name);
    return CTRL_OK;
}

static int quiet_iniparser(const char *fmt, ...) {
    (void)fmt;
    return 0;
}

ctrl_status config_read_file(ctrl_config *cfg, const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot read config: %s", path, strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return ctrl_error_set(CTRL_ERR_IO, "%s: is a directory, not a config file", path);
    /* iniparser opens the file by name after the scanner has read it: a pipe or device would be
     * read twice, so only regular files are accepted. */
    if (!S_ISREG(sb.st_mode)) return ctrl_error_set(CTRL_ERR_IO, "%s: not a regular file", path);
    if (sb.st_size > INI_MAX_BYTES)
        return ctrl_error_set(CTRL_ERR_CONFIG, "%s: config file too large (%lld bytes)", path,
                              (long long)sb.st_size);
    FILE *f = fopen(path, "rb");
    if (!f) return ctrl_error_set(CTRL_ERR_IO, "%s: cannot read config: %s", path, strerror(errno));
    size_t size = (size_t)sb.st_size;
    char *text = malloc(size + 1);
    if (!text) {
        fclose(f);
        return ctrl_error_set(CTRL_ERR_NOMEM, "config: out of memory");
    }
    size_t got = fread(text, 1, size, f);
    int read_error = ferror(f);
    fclose(f);
    if (read_error || got != size) {
        free(text);
        return ctrl_error_set(CTRL_ERR_IO, "%s: read error", path);
    }
    text[size] = '\0';
    ctrl_status st = scan(cfg, text, size);
    free(text);
    if (st != CTRL_OK) return st;

    iniparser_set_error_callback(quiet_iniparser);
    dictionary *d = iniparser_load(path);
    iniparser_set_error_callback(NULL);
    if (!d) return ctrl_error_set(CTRL_ERR_CONFIG, "%s: iniparser could not parse the file", cfg->file_name);
    for (int i = 0; i < cfg->n; i++) {
        config_entry *e = &cfg->entries[i];
        char full[1024];
        snprintf(full, sizeof full, "%s:%s", e->section, e->key);
        const char *v = iniparser_getstring(d, full, NULL);
        if (!v) {
            iniparser_freedict(d);
            return ctrl_error_set(CTRL_ERR_CONFIG, "%s: [%s] %s: could not read the value", e->where,
                                  e->section, e->key);
        }
        char *copy = strdup(v);
        if (!copy) {
            iniparser_freedict(d);
            return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", cfg->file_name);
        }
        free(e->value);
        e->value = copy;
    }
    iniparser_freedict(d);
    return CTRL_OK;
}
