/* PCRE2 patterns for the `format` and `regex` reward plugins, with Python `re` semantics where
 * TRL's reward functions rely on them: UTF-8 text, DOTALL / MULTILINE / IGNORECASE flags, and
 * re.match (anchored at the start), re.search, re.fullmatch and re.findall (non-overlapping, empty
 * matches advance one character). */
#ifndef CTRL_PLUGINS_REWARD_REGEX_H
#define CTRL_PLUGINS_REWARD_REGEX_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <string.h>

#include <ctrl/plugin_api.h>

enum { RX_MATCH, RX_SEARCH, RX_FULLMATCH };

/* Compiles [section] pattern with the section's dotall / multiline / ignore_case flags (each
 * plugin's option table declares them with its defaults); an empty or invalid pattern is a config
 * error naming the section, the key and the offset. */
static inline ctrl_status rx_compile(const ctrl_config *cfg, const char *section, pcre2_code **out) {
    ctrl_status st = CTRL_OK;
    const char *pattern = ctrl_option_string(cfg, section, "pattern", &st);
    uint32_t flags = PCRE2_UTF | PCRE2_UCP;
    if (ctrl_option_bool(cfg, section, "dotall", &st)) flags |= PCRE2_DOTALL;
    if (ctrl_option_bool(cfg, section, "multiline", &st)) flags |= PCRE2_MULTILINE;
    if (ctrl_option_bool(cfg, section, "ignore_case", &st)) flags |= PCRE2_CASELESS;
    if (st != CTRL_OK) return st;
    if (!pattern[0]) return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] pattern: must not be empty", section);
    int err;
    PCRE2_SIZE at;
    *out = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, flags, &err, &at, NULL);
    if (!*out) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ctrl_error_set(CTRL_ERR_CONFIG, "[%s] pattern: invalid at offset %zu: %s", section, (size_t)at,
                              (const char *)msg);
    }
    return CTRL_OK;
}

/* The plugins' check_options (plugin.h): the pattern compiles, when the config is validated. */
static inline ctrl_status rx_check_options(const ctrl_config *cfg, const char *section) {
    pcre2_code *re = NULL;
    ctrl_status st = rx_compile(cfg, section, &re);
    pcre2_code_free(re);
    return st;
}

/* 1 when `text` matches in `mode`, 0 when not, -1 on a matching error (e.g. invalid UTF-8). */
static inline int rx_matches(const pcre2_code *re, const char *text, int mode) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    const uint32_t opts = mode == RX_MATCH       ? PCRE2_ANCHORED
                          : mode == RX_FULLMATCH ? PCRE2_ANCHORED | PCRE2_ENDANCHORED
                                                 : 0;
    int rc = pcre2_match(re, (PCRE2_SPTR)text, strlen(text), 0, opts, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0 ? 1 : rc == PCRE2_ERROR_NOMATCH ? 0 : -1;
}

/* The number of non-overlapping matches (re.findall), or -1 on a matching error. */
static inline long rx_count(const pcre2_code *re, const char *text) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    const size_t len = strlen(text);
    size_t at = 0;
    long n = 0;
    while (at <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)text, len, at, 0, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            n = -1;
            break;
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        n++;
        if (ov[1] > ov[0]) {
            at = ov[1];
        } else { /* an empty match: step over one UTF-8 character */
            at = ov[1] + 1;
            while (at < len && ((unsigned char)text[at] & 0xC0) == 0x80) at++;
        }
    }
    pcre2_match_data_free(md);
    return n;
}

#endif
