// args.c — see args.h.
#include "args.h"

#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu.h"

int *parse_int_list(const char *s, const char *flag, int *n_out) {
    int cap = 16, n = 0;
    int *v = xmalloc((size_t)cap * sizeof(int));
    const char *p = s;
    while (*p) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 0 || x > 0x7fffffff) die("%s: cannot read a non-negative integer at \"%s\"", flag, p);
        if (n == cap) {
            v = realloc(v, (size_t)(cap *= 2) * sizeof(int));
            if (!v) die("out of memory");
        }
        v[n++] = (int)x;
        p = end;
        if (*p == ',') p++;
        else if (*p) die("%s: expected a comma at \"%s\"", flag, p);
    }
    if (n == 0) die("%s: empty list", flag);
    *n_out = n;
    return v;
}

int choose_device(const char *device, GpuInfo *gi, int *have_gpu) {
    const int gpu = gpu_info(gi) == 0;
    if (have_gpu) *have_gpu = gpu;
    if (!device) return gpu;
    if (!strcmp(device, "cpu")) return 0;
    if (strcmp(device, "cuda")) die("--device must be cpu or cuda, not %s", device);
    if (!gpu) die("--device cuda: %s", gi->reason);
    return 1;
}
