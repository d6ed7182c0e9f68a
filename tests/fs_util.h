// fs_util.h — temporary directories for the tests that write files.
// defines: test_mkdtemp, test_rmtree, test_run_cmd, test_slurp
#pragma once
#include <stddef.h>

// A fresh directory /tmp/<prefix>_XXXXXX into buf (n >= strlen(prefix) + 13); fails the test if it
// cannot be made.
void test_mkdtemp(char *buf, size_t n, const char *prefix);
// Removes dir and everything under it (nothing when dir is empty or "").
void test_rmtree(const char *dir);
// Runs the shell command cmd; its stdout (the first cap - 1 bytes, NUL-terminated) into out, the
// rest read and dropped. Returns the exit code, -1 if it did not exit normally.
int test_run_cmd(const char *cmd, char *out, size_t cap);
// The whole file, NUL-terminated (malloc'ed; *n its size when n != NULL), or NULL when it cannot
// be opened.
char *test_slurp(const char *path, size_t *n);
