/* Writing configs out: the effective config of a run, option tables as text for
 * `ctrl plugins describe`, and the Markdown reference (docs/config-reference.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config_internal.h"

/* Values are written so that iniparser reads back the same text: quoted when they hold a comment
 * character, a quote, spaces at either end or a trailing backslash (which would continue the line).
 * iniparser has no escapes, so a value holding both kinds of quote and needing quotes cannot be
 * written; 0 then. */
static int write_value(FILE *f, const char *v) {
    size_t n = strlen(v);
    int quote = n && (strpbrk(v, ";#\"'") || v[0] == ' ' || v[n - 1] == ' ' || v[n - 1] == '\\' ||
                      v[0] == '\t' || v[n - 1] == '\t');
    if (!quote) return fputs(v, f), 1;
    if (!strchr(v, '"')) return fprintf(f, "\"%s\"", v), 1;
    if (!strchr(v, '\'')) return fprintf(f, "'%s'", v), 1;
    return 0;
}

static ctrl_status write_section(FILE *f, const ctrl_config *cfg, const char *section) {
    int header = 0;
    for (int i = 0; i < cfg->n; i++) {
        const config_entry *e = &cfg->entries[i];
        if (strcmp(e->section, section) != 0) continue;
        if (!header) {
            fprintf(f, "\n[%s]\n", section);
            header = 1;
        }
        fprintf(f, "%s = ", e->key);
        if (!write_value(f, e->value))
            return ctrl_error_set(
                CTRL_ERR_CONFIG,
                "%s: [%s] %s: the value holds both kinds of quote and cannot be written as INI", e->where,
                section, e->key);
        fprintf(f, "  ; %s\n", e->where);
    }
    return CTRL_OK;
}

ctrl_status ctrl_config_write_effective(const ctrl_config *cfg, const char *path) {
    if (!cfg || !path)
        return ctrl_error_set(CTRL_ERR_USAGE, "ctrl_config_write_effective: no config or path");
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return ctrl_error_set(CTRL_ERR_IO, "%s: path too long", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return ctrl_error_set(CTRL_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    fprintf(f,
            "; Effective configuration of this run: %s with defaults filled in.\n"
            "; Each value's origin follows it (file:line, --set, or default).\n",
            cfg->path);
    ctrl_status st = CTRL_OK;
    for (const ctrl_config_section *s = ctrl_config_core_sections(); st == CTRL_OK && s->name; s++)
        st = write_section(f, cfg, s->name);
    /* Then the plugin sections, in the order their first key appears. */
    for (int i = 0; st == CTRL_OK && i < cfg->n; i++) {
        const char *sec = cfg->entries[i].section;
        int core = 0, seen = 0;
        for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
            if (!strcmp(s->name, sec)) core = 1;
        for (int j = 0; j < i; j++)
            if (!strcmp(cfg->entries[j].section, sec)) seen = 1;
        if (!core && !seen) st = write_section(f, cfg, sec);
    }
    int err = 0;
    if (ferror(f)) err = EIO;
    if (!err && (fflush(f) != 0 || fsync(fileno(f)) != 0)) err = errno;
    if (fclose(f) != 0 && !err) err = errno;
    if (!err && st == CTRL_OK && rename(tmp, path) != 0) err = errno;
    if (!err && st == CTRL_OK) return CTRL_OK;
    unlink(tmp);
    if (st != CTRL_OK) return st;
    return ctrl_error_set(CTRL_ERR_IO, "%s: cannot write: %s", path, strerror(err));
}

static const char *type_name(ctrl_option_type t) {
    switch (t) {
    case CTRL_OPT_STRING: return "string";
    case CTRL_OPT_INT: return "int";
    case CTRL_OPT_FLOAT: return "float";
    case CTRL_OPT_BOOL: return "bool";
    case CTRL_OPT_CHOICE: return "choice";
    case CTRL_OPT_LIST: return "list";
    case CTRL_OPT_PATH: return "path";
    }
    return "?";
}

/* "[0, 1)", ">= 1", "a|b|c", or "" */
static void range_text(const ctrl_option *o, char *out, size_t cap) {
    out[0] = '\0';
    if (o->choices) {
        snprintf(out, cap, "%s", o->choices);
        return;
    }
    int lo = (o->flags & CTRL_OPT_HAS_MIN) != 0, hi = (o->flags & CTRL_OPT_HAS_MAX) != 0;
    if (lo && hi)
        snprintf(out, cap, "%s%g, %g%s", (o->flags & CTRL_OPT_MIN_OPEN) ? "(" : "[", o->min, o->max,
                 (o->flags & CTRL_OPT_MAX_OPEN) ? ")" : "]");
    else if (lo)
        snprintf(out, cap, "%s %g", (o->flags & CTRL_OPT_MIN_OPEN) ? ">" : ">=", o->min);
    else if (hi)
        snprintf(out, cap, "%s %g", (o->flags & CTRL_OPT_MAX_OPEN) ? "<" : "<=", o->max);
}

static const char *default_text(const ctrl_option *o) {
    if (o->flags & CTRL_OPT_REQUIRED) return "(required)";
    if (!o->default_value) return "(none)";
    if (!o->default_value[0]) return "(empty)";
    return o->default_value;
}

void ctrl_option_table_print(FILE *out, const ctrl_option *options) {
    int wk = 3, wd = 7, wr = 13;
    char range[512];
    for (int i = 0; options && options[i].key; i++) {
        int k = (int)strlen(options[i].key), d = (int)strlen(default_text(&options[i]));
        range_text(&options[i], range, sizeof range);
        int r = (int)strlen(range);
        if (k > wk) wk = k;
        if (d > wd) wd = d;
        if (r > wr) wr = r;
    }
    fprintf(out, "  %-*s  %-6s  %-*s  %-*s  %s\n", wk, "KEY", "TYPE", wd, "DEFAULT", wr, "RANGE/CHOICES",
            "DOC");
    for (int i = 0; options && options[i].key; i++) {
        range_text(&options[i], range, sizeof range);
        fprintf(out, "  %-*s  %-6s  %-*s  %-*s  %s\n", wk, options[i].key, type_name(options[i].type), wd,
                default_text(&options[i]), wr, range[0] ? range : "-", options[i].doc ? options[i].doc : "");
    }
}

static void md_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", f);
        else
            fputc(*s, f);
    }
}

static void md_table(FILE *f, const ctrl_option *options) {
    if (!options || !options[0].key) {
        fprintf(f, "No options.\n\n");
        return;
    }
    fprintf(f, "| key | type | default | range / choices | description |\n|---|---|---|---|---|\n");
    for (int i = 0; options[i].key; i++) {
        const ctrl_option *o = &options[i];
        char range[512];
        range_text(o, range, sizeof range);
        fprintf(f, "| `%s` | %s | ", o->key, type_name(o->type));
        const char *d = default_text(o);
        if (d[0] == '(')
            fputs(d, f);
        else {
            fputc('`', f);
            md_escape(f, d);
            fputc('`', f);
        }
        fputs(" | ", f);
        md_escape(f, range[0] ? range : "");
        fputs(" | ", f);
        md_escape(f, o->doc ? o->doc : "");
        fputs(" |\n", f);
    }
    fputc('\n', f);
}

ctrl_status ctrl_config_reference_write(const ctrl_registry *reg, FILE *f) {
    fprintf(f,
            "# Configuration reference\n\n"
            "Generated by `ctrl --plugin-dir build/plugins config reference`; do not edit by hand (a test\n"
            "compares this file with the generated one). A run is one INI file; `ctrl config check RUN.ini`\n"
            "validates it in full, and `--set section.key=value` overrides any key.\n\n"
            "Plugin options live in their own sections: the trainer's in `[NAME]` (e.g. `[grpo]`), the\n"
            "optimizer's in `[NAME]`, each memory strategy's in `[NAME]`, the attention plugin's in\n"
            "`[attention.NAME]`, and each reward function in its own `[reward.NAME]` section. A section\n"
            "for a plugin the run does not select is an error (it is usually the wrong section).\n\n"
            "## File syntax\n\n"
            "- `[section]` headers and `key = value` lines; section and key names are letters, digits, `_`,\n"
            "  `-` and `.`, read lower-cased. Each section and each key appears once.\n"
            "- Comments are lines starting with `;` or `#`, or the rest of a value line after `;` or `#`\n"
            "  (not after a section header). Quote a value that holds `;` or `#`: `\"a;b\"` or `'a;b'`;\n"
            "  there are no escapes, and nothing but a comment may follow the closing quote.\n"
            "- One line per setting, at most 1000 characters; a line may not end with `\\` (no continuation\n"
            "  lines). UTF-8 without a byte-order mark.\n"
            "- Lists are separated by commas and/or blanks. Booleans are `true|false|yes|no|on|off|1|0`.\n"
            "- `--set section.key=value`: the section is everything before the last dot, so\n"
            "  `--set reward.len.weight=2` sets `weight` in `[reward.len]`.\n"
            "- The run's output directory holds `config.ini`, the effective config: every value in use\n"
            "  with where it came from (`file:line`, `--set`, or `default`).\n\n"
            "## Core sections\n\n");
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++) {
        fprintf(f, "### [%s]\n\n%s\n\n", s->name, s->doc);
        md_table(f, s->options);
    }
    fprintf(f, "### [reward.NAME]\n\nOne reward function; besides these, the keys of its plugin.\n\n");
    md_table(f, config_reward_instance_options);
    fprintf(f, "## Plugins\n\n");
    for (int i = 0; i < ctrl_registry_count(reg); i++) {
        const ctrl_plugin *p = ctrl_registry_at(reg, i)->plugin;
        const char *kind = ctrl_kind_name(p->kind);
        if (p->kind == CTRL_KIND_REWARD)
            fprintf(f, "### %s/%s — in `[reward.NAME]` with `plugin = %s`\n\n", kind, p->name, p->name);
        else if (p->kind == CTRL_KIND_ATTENTION)
            fprintf(f, "### %s/%s — section `[attention.%s]`\n\n", kind, p->name, p->name);
        else
            fprintf(f, "### %s/%s — section `[%s]`\n\n", kind, p->name, p->name);
        fprintf(f, "%s\n\n", p->summary ? p->summary : "");
        md_table(f, p->options);
    }
    return ferror(f) ? ctrl_error_set(CTRL_ERR_IO, "config reference: write error") : CTRL_OK;
}
