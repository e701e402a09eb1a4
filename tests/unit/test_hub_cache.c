/* Hub ids in the local Hugging Face cache (core/hub_cache.c), against caches laid out as
 * huggingface_hub lays them out: models--ORG--NAME/refs/main holding a commit hash, snapshots/HASH
 * the directory; HF_HUB_CACHE before HF_HOME/hub; revisions by ref name or hash; a miss names
 * the places looked in; an existing local directory always wins. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hub_cache.h"
#include "test.h"

static char root[256];

static void put(const char *rel, const char *text) {
    char path[1024], dir[1100];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    snprintf(dir, sizeof dir, "mkdir -p \"$(dirname '%s')\"", path);
    if (system(dir) != 0) return;
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
}

static void setup(void) {
    snprintf(root, sizeof root, "/tmp/ctrl-hub-test-XXXXXX");
    CHECK(mkdtemp(root) != NULL);
    put("hub/models--Qwen--Qwen2.5-0.5B/refs/main", "abc123\n");
    put("hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc123/config.json", "{}");
    put("hub/models--Qwen--Qwen2.5-0.5B/refs/v2", "def456");
    put("hub/models--Qwen--Qwen2.5-0.5B/snapshots/def456/config.json", "{}");
    put("hub/models--gpt2/refs/main", "777");
    put("hub/models--gpt2/snapshots/777/config.json", "{}");
    put("home/hub/models--org--other/refs/main", "111");
    put("home/hub/models--org--other/snapshots/111/config.json", "{}");
}

TEST(ids_and_paths) {
    CHECK(ctrl_hub_looks_like_id("Qwen/Qwen2.5-0.5B") && ctrl_hub_looks_like_id("gpt2"));
    CHECK(ctrl_hub_looks_like_id("org/name@v1.0") && ctrl_hub_looks_like_id("runs/quickstart-model"));
    CHECK(!ctrl_hub_looks_like_id("/abs/path") && !ctrl_hub_looks_like_id("./rel") &&
          !ctrl_hub_looks_like_id("a/b/c"));
    CHECK(!ctrl_hub_looks_like_id("../x") && !ctrl_hub_looks_like_id("org/") && !ctrl_hub_looks_like_id(""));
    CHECK(!ctrl_hub_looks_like_id("a b/c") && !ctrl_hub_looks_like_id("org/name@../x"));
}

TEST(resolves_from_the_cache) {
    setup();
    char hub[512], home[512], out[4096], want[1024];
    snprintf(hub, sizeof hub, "%s/hub", root);
    snprintf(home, sizeof home, "%s/home", root);
    setenv("HF_HUB_CACHE", hub, 1);
    CHECK_EQ_INT(ctrl_hub_snapshot("Qwen/Qwen2.5-0.5B", out, sizeof out), CTRL_OK);
    snprintf(want, sizeof want, "%s/models--Qwen--Qwen2.5-0.5B/snapshots/abc123", hub);
    CHECK_STR(out, want);
    CHECK_EQ_INT(ctrl_hub_snapshot("Qwen/Qwen2.5-0.5B@v2", out, sizeof out), CTRL_OK); /* a ref name */
    CHECK(strstr(out, "snapshots/def456") != NULL);
    CHECK_EQ_INT(ctrl_hub_snapshot("Qwen/Qwen2.5-0.5B@def456", out, sizeof out), CTRL_OK); /* a hash */
    CHECK(strstr(out, "snapshots/def456") != NULL);
    CHECK_EQ_INT(ctrl_hub_snapshot("gpt2", out, sizeof out), CTRL_OK); /* no organisation */
    CHECK(strstr(out, "models--gpt2/snapshots/777") != NULL);
    /* a miss names where it looked and how to get the model */
    CHECK_EQ_INT(ctrl_hub_snapshot("org/missing", out, sizeof out), CTRL_ERR_IO);
    CHECK(strstr(ctrl_error_message(), "models--org--missing/refs/main") &&
          strstr(ctrl_error_message(), "huggingface-cli download org/missing"));
    /* HF_HOME/hub when HF_HUB_CACHE is unset */
    unsetenv("HF_HUB_CACHE");
    setenv("HF_HOME", home, 1);
    CHECK_EQ_INT(ctrl_hub_snapshot("org/other", out, sizeof out), CTRL_OK);
    CHECK(strstr(out, "home/hub/models--org--other/snapshots/111") != NULL);
    /* resolve: an existing directory wins over the cache; an unknown id stays as written */
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(root) == 0);
    put("org/other/config.json", "{}");
    CHECK_STR(ctrl_hub_resolve("org/other", out, sizeof out), "org/other");
    CHECK(chdir(cwd) == 0);
    CHECK(strstr(ctrl_hub_resolve("org/other", out, sizeof out), "snapshots/111") != NULL);
    CHECK_STR(ctrl_hub_resolve("org/nowhere", out, sizeof out), "org/nowhere");
    unsetenv("HF_HOME");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    CHECK(system(cmd) == 0);
}
