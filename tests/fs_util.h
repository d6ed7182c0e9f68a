// fs_util.h — temporary directories for the tests that write files.
// defines: test_mkdtemp, test_rmtree, test_run_cmd, test_run_vfmt, test_slurp
#pragma once
#include <stdarg.h>
#include <stddef.h>

// A fresh directory /tmp/<prefix>_XXXXXX into buf (n >= strlen(prefix) + 13); fails the test if it
// cannot be made.
void test_mkdtemp(char *buf, size_t n, const char *prefix);
// Removes dir and everything under it (nothing when dir is empty or "").
void test_rmtree(const char *dir);
// Runs the shell command cmd; its stdout (the first cap - 1 bytes, NUL-terminated) into out, the
// rest read and dropped. Returns the exit code, -1 if it did not exit normally.
int test_run_cmd(const char *cmd, char *out, size_t cap);
// The same for the command printf would make of fmt and ap, with its stderr joined to stdout (2>&1).
int test_run_vfmt(char *out, size_t cap, const char *fmt, va_list ap);
// The whole file, NUL-terminated (malloc'ed; *n its size when n != NULL), or NULL when it cannot
// be opened.
char *test_slurp(const char *path, size_t *n);
