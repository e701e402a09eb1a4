/* A program for the `command` reward's tests: reads JSON batches on stdin, one per line, and
 * answers each with a JSON list on stdout.
 *   len[N]       -|N - code points of the completion| (N = 20 by default: TRL's reward_len)
 *   column NAME  the row's NAME column when it is a number, else null
 *   ids          the number of completion ids, plus the first id / 1000 */
#include <cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long code_points(const char *s) {
    long n = 0;
    for (; *s; s++) n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    static char line[1 << 20];
    while (fgets(line, sizeof line, stdin)) {
        cJSON *b = cJSON_Parse(line), *out = cJSON_CreateArray();
        const cJSON *c = cJSON_GetObjectItem(b, "completions"),
                    *ids = cJSON_GetObjectItem(b, "completion_ids");
        const int n = cJSON_GetArraySize(c);
        for (int i = 0; i < n; i++) {
            if (!strncmp(argv[1], "len", 3)) {
                const long len = code_points(cJSON_GetArrayItem(c, i)->valuestring),
                           target = atol(argv[1] + 3);
                cJSON_AddItemToArray(out, cJSON_CreateNumber(-labs((target ? target : 20) - len)));
            } else if (!strcmp(argv[1], "column") && argc > 2) {
                const cJSON *v = cJSON_GetArrayItem(cJSON_GetObjectItem(b, argv[2]), i);
                cJSON_AddItemToArray(out, cJSON_IsNumber(v) ? cJSON_CreateNumber(v->valuedouble)
                                                            : cJSON_CreateNull());
            } else {
                const cJSON *row = cJSON_GetArrayItem(ids, i);
                const double first = cJSON_GetArraySize(row) ? cJSON_GetArrayItem(row, 0)->valuedouble : 0;
                cJSON_AddItemToArray(out, cJSON_CreateNumber(cJSON_GetArraySize(row) + first / 1000));
            }
        }
        char *text = cJSON_PrintUnformatted(out);
        printf("%s\n", text);
        fflush(stdout);
        free(text);
        cJSON_Delete(out);
        cJSON_Delete(b);
    }
    return 0;
}
