// fs_util.c — see fs_util.h.
#define _XOPEN_SOURCE 700
#include "fs_util.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

void test_mkdtemp(char *buf, size_t n, const char *prefix) {
    snprintf(buf, n, "/tmp/%s_XXXXXX", prefix);
    cr_assert_not_null(mkdtemp(buf), "mkdtemp %s", buf);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

void test_rmtree(const char *dir) {
    if (dir && dir[0]) nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int test_run_cmd(const char *cmd, char *out, size_t cap) {
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    const size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    while (fgetc(p) != EOF) {
    }
    const int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

int test_run_vfmt(char *out, size_t cap, const char *fmt, va_list ap) {
    char cmd[4096];
    const int len = vsnprintf(cmd, sizeof cmd, fmt, ap);
    cr_assert(len >= 0 && (size_t)len + 5 < sizeof cmd, "command too long: %s", fmt);
    strcat(cmd, " 2>&1");
    return test_run_cmd(cmd, out, cap);
}

char *test_slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    cr_assert(len >= 0, "%s: cannot tell its size", path);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    cr_assert(b && fread(b, 1, (size_t)len, f) == (size_t)len, "reading %s", path);
    fclose(f);
    b[len] = 0;
    if (n) *n = (size_t)len;
    return b;
}
