/* Chat templates as untrusted input (issue 15): each hostile template below once crashed the process
 * (stack overflow, SIGFPE), ran for seconds or aborted on memory; now each is a template error that
 * names the limit, reached in well under a second of CPU. The limits are in
 * core/template/tpl_internal.h. */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "template/template.h"
#include "test.h"

/* Under ASan+UBSan (scripts/test.sh runs this test there too) the code runs several times slower and
 * the process carries the sanitizer's shadow memory and quarantine: the bounds scale, the errors are
 * the same. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifdef UNDER_ASAN
static const double slow = 8.0;
static const long rss_cap_mb = 1024;
#else
static const double slow = 1.0;
static const long rss_cap_mb = 128;
#endif

/* CPU time: the machine running the suite may be shared */
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Compiles and renders src; the error (at compile or render) must contain `needle`, within 5 s of CPU
 * (well under 1 s in a normal build; the sanitizer build is several times slower). */
static void expect_error(const char *src, const char *needle) {
    const double t0 = now_s();
    ctrl_template *t = NULL;
    char *text = NULL;
    size_t len = 0;
    ctrl_status st = ctrl_template_compile(src, strlen(src), "hostile.jinja", &t);
    if (st == CTRL_OK) {
        cJSON *vars = cJSON_CreateObject();
        st = ctrl_template_render(t, vars, &text, &len, NULL);
        cJSON_Delete(vars);
        ctrl_template_free(t);
    }
    const double dt = now_s() - t0;
    CHECK_MSG(st == CTRL_ERR_FORMAT, "%.60s...: rendered (%zu bytes) instead of failing", src, len);
    if (st != CTRL_OK) {
        CHECK_CONTAINS(ctrl_error_message(), "hostile.jinja");
        CHECK_CONTAINS(ctrl_error_message(), needle);
    }
    CHECK_MSG(dt < 5.0 * slow, "%.60s...: %.2f s of CPU", src, dt);
    free(text);
}

/* pre, open × n, core, close × n, post */
static char *nested(const char *pre, const char *open, const char *core, const char *close, int n,
                    const char *post) {
    size_t lp = strlen(pre), lo = strlen(open), lc = strlen(core), lx = strlen(close), lq = strlen(post);
    char *s = malloc(lp + (lo + lx) * (size_t)n + lc + lq + 1), *p = s;
    memcpy(p, pre, lp), p += lp;
    for (int i = 0; i < n; i++) memcpy(p, open, lo), p += lo;
    memcpy(p, core, lc), p += lc;
    for (int i = 0; i < n; i++) memcpy(p, close, lx), p += lx;
    memcpy(p, post, lq + 1);
    return s;
}

TEST(recursion_is_bounded) {
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
                 "macro 'f': calls nested deeper than 100");
    expect_error("{% macro a() %}{{ b() }}{% endmacro %}{% macro b() %}{{ a() }}{% endmacro %}{{ a() }}",
                 "calls nested deeper than 100");
    /* parsing recurses per level of nesting */
    static const struct {
        const char *pre, *open, *core, *close, *post;
    } deep[] = {{"{{ ", "(", "1", ")", " }}"},
                {"{{ ", "not ", "1", "", " }}"},
                {"{{ ", "-", "1", "", " }}"},
                {"{{ ", "[", "1", "]", " }}"},
                {"{{ ", "{'a': ", "1", "}", " }}"},
                {"{{ ", "f(", "1", ")", " }}"},
                {"{{ ", "x[", "1", "]", " }}"},
                {"", "{% if true %}", "x", "{% endif %}", ""},
                {"", "{% for x in y %}", "x", "{% endfor %}", ""}};
    for (size_t i = 0; i < sizeof deep / sizeof deep[0]; i++) {
        char *src = nested(deep[i].pre, deep[i].open, deep[i].core, deep[i].close, 100000, deep[i].post);
        expect_error(src, "nested deeper than 100 levels");
        free(src);
    }
    /* chains parse in a loop but evaluate recursively */
    static const struct {
        const char *pre, *mid, *post;
    } chains[] = {{"{{ 1", " + 1", " }}"},
                  {"{{ x", ".a", " }}"},
                  {"{{ 'a'", "|upper", " }}"},
                  {"{{ 'a'", " ~ 'a'", " }}"}};
    for (size_t i = 0; i < sizeof chains / sizeof chains[0]; i++) {
        char *src = nested(chains[i].pre, chains[i].mid, "", "", 100000, chains[i].post);
        expect_error(src, "nested deeper than 500 levels"); /* ~1.4 KB of stack a level at most */
        free(src);
    }
    /* values nested by a loop: repr, tojson and == recurse on them */
    expect_error("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor "
                 "%}{{ ns.l }}",
                 "nested deeper than 1000 levels");
    expect_error(
        "{% set ns = namespace(d={}) %}{% for i in range(100000) %}{% set ns.d = dict(a=ns.d) %}{% endfor %}",
        "nested deeper than 1000 levels");
}

TEST(integer_overflow_is_an_error) {
    expect_error("{{ (-9223372036854775807 - 1) // -1 }}", "integer overflow in -9223372036854775808 // -1");
    expect_error("{{ 9223372036854775807 + 1 }}", "integer overflow in 9223372036854775807 + 1");
    expect_error("{{ -9223372036854775807 - 2 }}", "integer overflow in -9223372036854775807 - 2");
    expect_error("{{ 4294967296 * 4294967296 }}", "integer overflow in 4294967296 * 4294967296");
    expect_error("{{ 2 ** 63 }}", "integer overflow in 2 ** 63");
    expect_error("{{ 3 ** 9223372036854775807 }}", "integer overflow in 3 ** 9223372036854775807");
    expect_error("{{ -(-9223372036854775807 - 1) }}", "integer overflow in 0 - -9223372036854775808");
    expect_error("{{ (-9223372036854775807 - 1)|abs }}", "integer overflow in abs(-9223372036854775808)");
    expect_error("{{ [9223372036854775807, 1]|sum }}", "integer overflow in 9223372036854775807 + 1");
    expect_error("{{ 99999999999999999999 }}",
                 "integer literal 99999999999999999999 does not fit in 64 bits");
    expect_error("{{ 1e300|int }}", "int: 1e+300 does not fit in 64 bits");
}

TEST(sizes_are_checked_before_building) {
    expect_error("{{ 'a' * 2147483647 }}", "string repetition would build a string of 2147483647 × 1 bytes");
    expect_error("{{ 'ab' * 9223372036854775807 }}", "more than the 16 MiB limit");
    expect_error("{{ [1] * 2147483647 }}", "list repetition would build a list of 2147483647 items");
    expect_error("{{ [1, 2] * 9223372036854775807 }}", "list repetition would build a list of");
    expect_error("{{ [[1]]|tojson(indent=100000000) }}", "a string would exceed the 16 MiB limit");
    expect_error("{{ 'a\nb'|indent(1000000000) }}", "a string would exceed the 16 MiB limit");
    expect_error("{{ range(9223372036854775807)|length }}",
                 "range() of 9223372036854775807 items exceeds the limit 1000000");
    expect_error("{{ range(-9223372036854775807 - 1, 9223372036854775807)|length }}",
                 "range() of 18446744073709551615 items exceeds");
    /* doubling a list of 1 MB strings, then joining or printing it */
    const char *doubling = "{% set ns = namespace(l=['x' * 1000000]) %}{% for i in range(20) %}"
                           "{% set ns.l = ns.l + ns.l %}{% endfor %}";
    char src[512];
    snprintf(src, sizeof src, "%s{{ ns.l|join }}", doubling);
    expect_error(src, "a string would exceed the 16 MiB limit");
    snprintf(src, sizeof src, "%s{{ ns.l }}", doubling);
    expect_error(src, "a string would exceed the 16 MiB limit");
    expect_error("{% for c in 'x' * 5000000 %}{% endfor %}",
                 "iterating a string would build a list of 5000000 items");
    expect_error("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
                 "the output would exceed 16 MiB");
    /* quadratic accumulation: every step's string stays in the render's arena */
    expect_error(
        "{% set ns = namespace(s='') %}{% for i in range(100000) %}{% set ns.s = ns.s ~ ('x' * 1000000) %}"
        "{% endfor %}",
        "the template used more than 64 MiB of memory");
}

TEST(work_is_bounded) {
    expect_error("{% set big = range(1000000)|list %}{% for i in range(1000) %}{% if -1 in big %}{% endif %}"
                 "{% endfor %}",
                 "the template ran more than 10000000 steps");
    expect_error("{{ range(1000000)|unique|list|length }}", "the template ran more than 10000000 steps");
    /* == walks nested values: charged by their size, not their length (1000 lists of 1000) */
    expect_error(
        "{% set big = [range(1000)|list] * 1000 %}{% for i in range(100000) %}{% if big == big %}{% endif %}"
        "{% endfor %}",
        "the template ran more than 10000000 steps");
    expect_error(
        "{% set big = [range(1000)|list] * 1000 %}{% for i in range(100000) %}{% if [1] in big %}{% endif %}"
        "{% endfor %}",
        "the template ran more than 10000000 steps");
    /* nested loops: each iteration's `loop` stayed in the arena until the render ended (now one live
     * `loop` per loop: the steps run out, not the memory) */
    expect_error("{% set r = range(1000000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
                 "the template ran more than 10000000 steps");
    /* a range() built per outer iteration is 16 MB of values each time */
    expect_error("{% for i in range(1000000) %}{% for j in range(1000000) %}{% endfor %}{% endfor %}",
                 "the template used more than 64 MiB of memory");
}

/* What the limits must not break: long but linear work still renders, quickly. */
TEST(large_legitimate_renders_still_work) {
    const double t0 = now_s();
    char *src = nested("", "{{ x }}", "", "", 200000, ""); /* the parser once copied its node list per node */
    ctrl_template *t = NULL;
    CHECK_EQ_INT(ctrl_template_compile(src, strlen(src), "long.jinja", &t), CTRL_OK);
    free(src);
    cJSON *vars = cJSON_CreateObject();
    cJSON_AddStringToObject(vars, "x", "ab");
    char *text = NULL;
    size_t len = 0;
    CHECK_EQ_INT(ctrl_template_render(t, vars, &text, &len, NULL), CTRL_OK);
    CHECK_EQ_INT(len, 400000);
    free(text);
    ctrl_template_free(t);
    /* sorting a reversed list (insertion sort was quadratic), slicing a long non-ASCII string
     * backwards (each index was found from the start), counting in a long string */
    const char *linear = "{{ (range(300000)|reverse|sort)[299999] }} {{ ('héllo' * 100000)[::-1][:5] }} "
                         "{{ ('ab' * 1000000).count('ba') }} {% for i in range(100000) %}{% endfor %}";
    CHECK_EQ_INT(ctrl_template_compile(linear, strlen(linear), "linear.jinja", &t), CTRL_OK);
    CHECK_EQ_INT(ctrl_template_render(t, vars, &text, &len, NULL), CTRL_OK);
    CHECK_STR(text, "299999 olléh 999999 ");
    free(text);
    ctrl_template_free(t);
    cJSON_Delete(vars);
    const double dt = now_s() - t0;
    CHECK_MSG(dt < 5.0 * slow, "%.2f s of CPU", dt);
}

/* A message object of many keys (a request's, in `ctrl serve`) was turned into a dict one key at a
 * time, each looked up first: quadratic. Repeated keys keep their first place and their last value,
 * as Python's json.loads and dict give them. */
/* Renders src with vars (consumed) and checks the text, within 5 s of CPU from t0. */
static void expect_render(const char *src, cJSON *vars, const char *want, double t0) {
    ctrl_template *t = NULL;
    CHECK_EQ_INT(ctrl_template_compile(src, strlen(src), "big.jinja", &t), CTRL_OK);
    char *text = NULL;
    size_t len = 0;
    if (t) CHECK_EQ_INT(ctrl_template_render(t, vars, &text, &len, NULL), CTRL_OK);
    CHECK_STR(text, want);
    free(text);
    ctrl_template_free(t);
    cJSON_Delete(vars);
    const double dt = now_s() - t0;
    CHECK_MSG(dt < 5.0 * slow, "%.2f s of CPU", dt);
}

TEST(variables_with_many_keys_load_in_n_log_n) {
    const double t0 = now_s();
    const int n = 200000;
    char *json = malloc((size_t)n * 24 + 64), *p = json;
    p += sprintf(p, "{\"d\": {");
    for (int i = 0; i < n; i++) p += sprintf(p, "\"k%d\": %d, ", i, i);
    p += sprintf(p, "\"k5\": \"last\"}}");
    cJSON *vars = cJSON_Parse(json);
    free(json);
    CHECK(vars != NULL);
    expect_render("{{ d|length }} {{ d.k5 }} {{ (d|list)[5] }} {{ (d|list)[-1] }} {{ d.k199999 }}", vars,
                  "200000 last k5 k199999 199999", t0);
}

/* A dict literal of many keys was set one key at a time, each looked up first: quadratic. */
TEST(a_dict_literal_of_many_keys_is_built_in_n_log_n) {
    const double t0 = now_s();
    const int n = 100000;
    char *src = malloc((size_t)n * 24 + 64), *p = src;
    p += sprintf(p, "{%% set d = {");
    for (int i = 0; i < n; i++) p += sprintf(p, "'k%d': %d, ", i, i);
    p += sprintf(p, "'k7': 'again'} %%}{{ d|length }} {{ d.k7 }} {{ (d|list)[7] }} {{ d.k99999 }}");
    expect_render(src, cJSON_CreateObject(), "100000 again k7 99999", t0);
    free(src);
}

/* ---- F9 and the walks the step budget did not see (issue 15): each template below ran for seconds
 * to hours, or held hundreds of MB, before its error. Rendered in a child process, so that its peak
 * memory (ru_maxrss) is its own: the render budget is 64 MiB, the child may hold 128 MB at most
 * (1 GB under ASan). ---- */

/* Renders src with the given variables (JSON, or NULL) in a child; the error must contain `needle`
 * (NULL: the render must succeed), within `cpu_s` of CPU and 128 MB of peak memory (both scaled
 * under ASan). */
static void expect_bounded(const char *src, const char *vars_json, const char *needle, double cpu_s) {
    int fds[2];
    CHECK(pipe(fds) == 0);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(60); /* a hang fails the test (the child dies) instead of stalling it */
        close(fds[0]);
        ctrl_template *t = NULL;
        char *text = NULL;
        size_t len = 0;
        ctrl_status st = ctrl_template_compile(src, strlen(src), "hostile.jinja", &t);
        if (st == CTRL_OK) {
            cJSON *vars = vars_json ? cJSON_Parse(vars_json) : cJSON_CreateObject();
            st = ctrl_template_render(t, vars, &text, &len, NULL);
            cJSON_Delete(vars);
        }
        char msg[600];
        int n =
            snprintf(msg, sizeof msg, "%d %s", (int)st, st == CTRL_OK ? "rendered" : ctrl_error_message());
        if (write(fds[1], msg, (size_t)n) != n) _exit(2);
        _exit(0);
    }
    close(fds[1]);
    char msg[600] = {0};
    size_t got = 0;
    for (ssize_t k; got < sizeof msg - 1 && (k = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0;)
        got += (size_t)k;
    close(fds[0]);
    int status = 0;
    struct rusage ru;
    CHECK(wait4(pid, &status, 0, &ru) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%.60s...: the child died (status %d)", src,
              status);
    const double cpu = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
                       (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
    const long rss_mb = ru.ru_maxrss / 1024;
    if (needle) { /* one of the alternatives "a|b" */
        CHECK_MSG(atoi(msg) == CTRL_ERR_FORMAT, "%.60s...: %s", src, msg);
        CHECK_CONTAINS(msg, "hostile.jinja");
        int found = 0;
        for (const char *alt = needle; alt && !found; alt = strchr(alt, '|') ? strchr(alt, '|') + 1 : NULL) {
            const size_t k = strchr(alt, '|') ? (size_t)(strchr(alt, '|') - alt) : strlen(alt);
            for (const char *at = msg; !found && (at = strchr(at, alt[0])); at++)
                found = !strncmp(at, alt, k);
        }
        CHECK_MSG(found, "\"%s\" names none of \"%s\"", msg, needle);
    } else {
        CHECK_MSG(atoi(msg) == CTRL_OK, "%.60s...: %s", src, msg);
    }
    CHECK_MSG(cpu < cpu_s * slow, "%.60s...: %.2f s of CPU", src, cpu);
    CHECK_MSG(rss_mb < rss_cap_mb, "%.60s...: %ld MB at its peak", src, rss_mb);
}

#define STEPS "the template ran more than 10000000 steps"
#define MEMORY "the template used more than 64 MiB of memory"
#define BUDGET STEPS "|" MEMORY

/* F9 (fuzz_template, 724,545 inputs in): nested for loops over strings rendered for 23.6 s and held
 * 700 MB under ASan: each iteration made a new `loop` dict that lived until the render ended, and
 * only one step was charged per iteration. Now one live `loop` per loop, the iteration's setup is
 * charged, and the arena counts the blocks it mallocs. */
TEST(nested_loops_are_bounded_F9) {
    const char *s36 = "{% set s = 'abcdefghijklmnopqrstuvwxyz0123456789' %}";
    char src[4096];
    snprintf(src, sizeof src,
             "%s{%% for a in s %%}{%% for b in s %%}{%% for c in s %%}{%% for d in s %%}{%% for e in s %%}"
             "{%% if loop.last and a == e %%}{{ loop.index }}{%% endif %%}"
             "{%% endfor %%}{%% endfor %%}{%% endfor %%}{%% endfor %%}{%% endfor %%}",
             s36);
    expect_bounded(src, NULL, BUDGET, 2.0);
    /* filtered loops (each item was tried in a new scope) */
    snprintf(
        src, sizeof src,
        "%s{%% for a in s if a %%}{%% for b in s if b != a %%}{%% for c in s if c %%}{%% for d in s if d %%}"
        "{%% endfor %%}{%% endfor %%}{%% endfor %%}{%% endfor %%}",
        s36);
    expect_bounded(src, NULL, BUDGET, 2.0);
    /* without the budget error: 10^6 iterations that once built 350 MB of `loop` dicts now render */
    expect_bounded("{% set s = 'x' * 100 %}{% for a in s %}{% for b in s %}{% for c in s %}{% endfor %}"
                   "{% endfor %}{% endfor %}done",
                   NULL, NULL, 2.0);
    /* a name looked up from 95 loops deep walks every scope out to the root: charged by the walk */
    char *deep = nested("", "{% for a in 'x' %}",
                        "{% set r = range(1000000) %}{% for i in r %}{% for j in r %}{{ zz }}{% endfor %}"
                        "{% endfor %}",
                        "{% endfor %}", 95, "");
    expect_bounded(deep, NULL, BUDGET, 2.0); /* each {{ }} of a non-string makes a string */
    free(deep);
    /* macros called from nested loops */
    expect_bounded("{% macro m(x) %}{{ x }}{% endmacro %}{% set r = range(1000000) %}{% for i in r %}"
                   "{% for j in r %}{{ m(j) }}{% endfor %}{% endfor %}",
                   NULL, BUDGET "|the output would exceed 16 MiB", 2.0);
}

#define DOUBLED_SAMEAS                                                                                       \
    ("{% set ns = namespace(l=[]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}"       \
     "{{ ns.l is sameas ns.l }}")

/* Work proportional to a string's, a list's or a dict's length was one step: each of these loops
 * walked 16 MB (or a million items) per iteration and ran for minutes to hours. Bounded now: ~1 s
 * each here; the cap leaves room for a loaded host (2.12 s for the join on a 16-core VM running the
 * suite 8 tests at a time) and is still far below what the unbounded walks took. */
#define WALK_CPU_S 5.0
TEST(walks_are_charged_to_the_step_budget) {
    static const char *const walks[] = {
        "{% set s = 'é' * 8000000 %}{% for i in range(1000000) %}{{ s|length }}{% endfor %}",
        "{% set s = 'é' * 8000000 %}{% for i in range(1000000) %}{{ s[-1] }}{% endfor %}",
        "{% set s = 'é' * 8000000 %}{% for i in range(1000000) %}{{ s[-1:] }}{% endfor %}",
        "{% set s = 'a' * 16000000 %}{% for i in range(1000000) %}{{ s.isalpha() }}{% endfor %}",
        "{% set s = ' ' * 16000000 ~ 'x' %}{% for i in range(1000000) %}{{ s.strip() }}{% endfor %}",
        "{% set s = 'a' * 16000000 %}{% for i in range(1000000) %}{{ s.split('b') is defined }}{% endfor %}",
        "{% set s = 'a' * 16000000 %}{% for i in range(1000000) %}{{ s is lower }}{% endfor %}",
        "{% set b = [''] * 1000000 %}{% for i in range(1000000) %}{{ b|join }}{% endfor %}",
        "{% set b = [''] * 1000000 %}{% for i in range(1000000) %}{{ ''.join(b) }}{% endfor %}",
        "{% set b = [none] * 1000000 %}{% for i in range(1000000) %}{{ b|select|first }}{% endfor %}",
        /* each option of startswith compared in full */
        "{% set s = 'a' * 16000000 %}{% set o = [s] * 1000000 %}{{ s.startswith(o) }}",
        /* == on a value shared 2^60 ways (sameas did not charge it) */
        DOUBLED_SAMEAS,
        /* strip tried every character of a long `chars` at each position of a matching string */
        "{% set s = 'a' * 16000000 %}{{ s.strip('b' * 8000000 ~ 'a')|length }}",
    };
    for (size_t i = 0; i < sizeof walks / sizeof walks[0]; i++) expect_bounded(walks[i], NULL, BUDGET, WALK_CPU_S);
    /* split compared the separator at every position, len(s) × len(sep): now memmem, linear */
    expect_bounded("{% set s = 'a' * 16000000 %}{{ s.split('a' * 8000000 ~ 'b')|length }}", NULL, NULL, WALK_CPU_S);
    /* a key looked up in a dict of many keys (a dict literal of 20,000 keys, read in a loop) */
    const int n = 20000;
    char *src = malloc((size_t)n * 24 + 256), *p = src;
    p += sprintf(p, "{%% set d = {");
    for (int i = 0; i < n; i++) p += sprintf(p, "'k%d': %d, ", i, i);
    p += sprintf(p, "} %%}{%% for i in range(1000000) %%}{{ d.k19999 }}{{ d['k1'] }}{%% endfor %%}");
    expect_bounded(src, NULL, STEPS, WALK_CPU_S);
    /* dict() merged mappings key by key, each looked up first: quadratic; now n log n */
    p = src + sprintf(src, "{%% set d = {");
    for (int i = 0; i < n; i++) p += sprintf(p, "'k%d': %d, ", i, i);
    p += sprintf(p, "} %%}{{ dict(d, k7='x')|length }} {{ dict(d, k7='x').k7 }} {{ namespace(d).k19999 }}");
    expect_bounded(src, NULL, NULL, WALK_CPU_S);
    free(src);
}

/* What the lower limits must still allow: a conversation of 4,000 messages (about 5 MB, over a
 * million tokens) renders through the real chat templates with room to spare. */
TEST(a_long_conversation_still_renders) {
    const int n = 4000;
    char *json = malloc((size_t)n * 1400 + 1024), *p = json;
    p += sprintf(p, "{\"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", "
                    "\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}");
    for (int i = 0; i < n; i++) {
        p += sprintf(p, ", {\"role\": \"%s\", \"content\": \"%s", i % 2 ? "assistant" : "user",
                     i % 2 ? "<think>\\nfirst this, then that\\n</think>\\n\\n" : "");
        for (int w = 0; w < 120; w++) p += sprintf(p, "word%d ", (i * 7 + w) % 1000);
        p += sprintf(p, "\"}");
    }
    sprintf(p, ", {\"role\": \"user\", \"content\": \"and now?\"}]}");
    static const char *const names[] = {"qwen3_training", "qwen3", "llama3_1", "mistral_v0.3", "qwen2_5"};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/templates/%s.jinja", CTRL_FIXTURE_DIR, names[k]);
        FILE *f = fopen(path, "rb");
        CHECK_MSG(f != NULL, "%s", path);
        if (!f) continue;
        static char src[1 << 16];
        size_t len = fread(src, 1, sizeof src - 1, f);
        fclose(f);
        src[len] = 0;
        expect_bounded(src, json, NULL, 2.0);
    }
    free(json);
}
