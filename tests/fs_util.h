// fs_util.h — temporary directories for the tests that write files.
// defines: test_mkdtemp, test_rmtree
#pragma once
#include <stddef.h>

// A fresh directory /tmp/<prefix>_XXXXXX into buf (n >= strlen(prefix) + 13); fails the test if it
// cannot be made.
void test_mkdtemp(char *buf, size_t n, const char *prefix);
// Removes dir and everything under it (nothing when dir is empty or "").
void test_rmtree(const char *dir);
