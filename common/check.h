// check.h — fail loudly and early: error exits, checked allocation and file opening.
// defines: die, vdie_code, errf, xmalloc, xcalloc, fopen_check
// Every C program in this repository reports a problem with one line on stderr that
// names what went wrong, then exits with a non-zero code. Nothing fails silently.
#pragma once
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#ifdef __cplusplus
extern "C" {
#endif

// Print "error: <message>" to stderr and exit(1).
__attribute__((noreturn, format(printf, 1, 2))) void die(const char *fmt, ...);
// The same with the exit code given and the arguments as a va_list (die, arg_die).
__attribute__((noreturn, format(printf, 2, 0))) void vdie_code(int code, const char *fmt, va_list ap);

// For functions that report errors to their caller: format a one-line message into err
// (if err is not NULL) and return -1, so `return errf(err, errlen, "...", ...);` reads naturally.
__attribute__((format(printf, 3, 4))) int errf(char *err, int errlen, const char *fmt, ...);

// malloc/calloc that exit with a message naming the size instead of returning NULL.
void *xmalloc_impl(size_t bytes, const char *file, int line);
void *xcalloc_impl(size_t n, size_t size, const char *file, int line);
#define xmalloc(bytes) xmalloc_impl((bytes), __FILE__, __LINE__)
#define xcalloc(n, size) xcalloc_impl((n), (size), __FILE__, __LINE__)

// fopen that exits with the path, the mode and strerror(errno) on failure.
FILE *fopen_check_impl(const char *path, const char *mode, const char *file, int line);
#define fopen_check(path, mode) fopen_check_impl((path), (mode), __FILE__, __LINE__)

#ifdef __cplusplus
}
#endif
