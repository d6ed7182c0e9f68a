// check.c — see check.h.
#include "check.h"

#include <errno.h>
#include <string.h>

void vdie_code(int code, const char *fmt, va_list ap) {
    fprintf(stderr, "error: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    exit(code);
}

void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdie_code(1, fmt, ap);
}

int errf(char *err, int errlen, const char *fmt, ...) {
    if (err && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, (size_t)errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

void *xmalloc_impl(size_t bytes, const char *file, int line) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) die("out of memory allocating %zu bytes (%s:%d)", bytes, file, line);
    return p;
}

void *xcalloc_impl(size_t n, size_t size, const char *file, int line) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) die("out of memory allocating %zu x %zu bytes (%s:%d)", n, size, file, line);
    return p;
}

FILE *fopen_check_impl(const char *path, const char *mode, const char *file, int line) {
    FILE *f = fopen(path, mode);
    if (!f) {
        die("cannot open '%s' (mode \"%s\"): %s (%s:%d)%s", path, mode, strerror(errno), file, line,
            mode[0] == 'r' ? " -- check the path" : " -- does the directory exist and is it writable?");
    }
    return f;
}
