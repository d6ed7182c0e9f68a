// args.c — see args.h.
#include "args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu.h"

void arg_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vdie_code(ARG_EXIT, fmt, ap);
}

void arg_help_or_unknown(const char *a, void (*usage)(FILE *)) {
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
        usage(stdout);
        exit(0);
    }
    usage(stderr);
    arg_die("unknown or incomplete argument: %s", a);
}

// The value as it goes into a one-line message: control bytes as \xNN, cut after 60 bytes.
static const char *shown(const char *s, char *buf, size_t cap) {
    size_t k = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && k + 8 < cap; p++) {
        if (p - (const unsigned char *)s >= 60) {
            k += (size_t)snprintf(buf + k, cap - k, "...");
            break;
        }
        if (*p < 0x20 || *p == 0x7f) k += (size_t)snprintf(buf + k, cap - k, "\\x%02X", *p);
        else buf[k++] = (char)*p;
    }
    buf[k] = 0;
    return buf;
}

// Whole-string decimal integer: 0 and *out, or -1 (not an integer) / -2 (does not fit in 64 bits).
static int parse_ll(const char *s, long long *out) {
    const char *p = s + (*s == '-');
    if (!*p) return -1;
    for (const char *q = p; *q; q++)
        if (*q < '0' || *q > '9') return -1;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE) return -2;
    if (*end) return -1;
    *out = v;
    return 0;
}

long long arg_int(const char *opt, const char *s, long long lo, long long hi) {
    char b[128];
    long long v = 0;
    const int rc = parse_ll(s, &v);
    if (rc == -1) arg_die("%s: '%s' is not an integer (allowed: %lld..%lld)", opt, shown(s, b, sizeof b), lo, hi);
    if (rc == -2 || v < lo || v > hi)
        arg_die("%s: %s is out of range (allowed: %lld..%lld)", opt, shown(s, b, sizeof b), lo, hi);
    return v;
}

uint64_t arg_u64(const char *opt, const char *s) {
    char b[128];
    int ok = *s != 0;
    for (const char *q = s; *q; q++) ok &= *q >= '0' && *q <= '9';
    if (!ok) arg_die("%s: '%s' is not an unsigned integer (allowed: 0..%llu)", opt, shown(s, b, sizeof b), ULLONG_MAX);
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE) arg_die("%s: %s is out of range (allowed: 0..%llu)", opt, shown(s, b, sizeof b), ULLONG_MAX);
    return (uint64_t)v;
}

double arg_float(const char *opt, const char *s, double lo, double hi, int flags) {
    char b[128], range[96];
    snprintf(range, sizeof range, "%c%g, %g%c", flags & ARG_LO_OPEN ? '(' : '[', lo, hi, flags & ARG_HI_OPEN ? ')' : ']');
    // digits, sign, point and exponent only: strtod alone would also take "nan", "inf", " 1", "0x10"
    int ok = *s != 0 && strspn(s, "0123456789+-.eE") == strlen(s) && strpbrk(s, "0123456789");
    char *end = NULL;
    double v = ok ? strtod(s, &end) : NAN;
    if (!ok || *end || !isfinite(v))
        arg_die("%s: '%s' is not a finite number (allowed: %s)", opt, shown(s, b, sizeof b), range);
    if (v < lo || v > hi || (v == lo && (flags & ARG_LO_OPEN)) || (v == hi && (flags & ARG_HI_OPEN)))
        arg_die("%s: %s is out of range (allowed: %s)", opt, shown(s, b, sizeof b), range);
    return v;
}

int *arg_int_list(const char *opt, const char *s, long long lo, long long hi, int *n_out) {
    char b[128], elem[64];
    int cap = 16, n = 0;
    if (!*s) arg_die("%s: empty list (want comma-separated integers in %lld..%lld)", opt, lo, hi);
    int *v = xmalloc((size_t)cap * sizeof(int));
    for (const char *p = s;; p++) {
        const char *e = strchr(p, ',');
        const size_t len = e ? (size_t)(e - p) : strlen(p);
        // (v is freed before each exit, so the sanitizers see no leak)
        if (len == 0) free(v), arg_die("%s: '%s': element %d is empty", opt, shown(s, b, sizeof b), n + 1);
        if (len >= sizeof elem)
            free(v), arg_die("%s: '%s': element %d is not an integer in %lld..%lld", opt, shown(s, b, sizeof b), n + 1,
                             lo, hi);
        memcpy(elem, p, len);
        elem[len] = 0;
        long long x = 0;
        const int rc = parse_ll(elem, &x);
        if (rc || x < lo || x > hi)
            free(v), arg_die("%s: element %d '%s' is %s (allowed: %lld..%lld)", opt, n + 1, shown(elem, b, sizeof b),
                             rc == -1 ? "not an integer" : "out of range", lo, hi);
        if (n == cap) {
            int *w = realloc(v, (size_t)(cap *= 2) * sizeof(int));
            if (!w) die("out of memory");
            v = w;
        }
        v[n++] = (int)x;
        if (!e) break;
        p = e;
    }
    *n_out = n;
    return v;
}

int *parse_int_list(const char *s, const char *opt, int *n) { return arg_int_list(opt, s, 0, INT_MAX, n); }

void check_ids_in_vocab(const char *what, const int *ids, int n, int vocab) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab)
            arg_die("%s: token id %d at position %d is outside the vocabulary [0, %d)", what, ids[i], i, vocab);
}

int choose_device(const char *device, GpuInfo *gi, int *have_gpu) {
    const int gpu = gpu_info(gi) == 0;
    if (have_gpu) *have_gpu = gpu;
    if (!device) return gpu;
    if (!strcmp(device, "cpu")) return 0;
    if (strcmp(device, "cuda")) arg_die("--device: '%s' is not a device (allowed: cpu, cuda)", device);
    if (!gpu) die("--device cuda: %s", gi->reason);
    return 1;
}
