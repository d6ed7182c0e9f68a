// args.h — small command-line helpers shared by the programs.
// defines: parse_int_list, choose_device
#pragma once
#include "gpu.h"
#ifdef __cplusplus
extern "C" {
#endif

// "1,2,3" -> a malloc'ed array of non-negative ints (*n set to its length). `flag` names the
// option in error messages ("--ids"); a malformed or empty list exits with a message.
int *parse_int_list(const char *s, const char *flag, int *n);

// --device: NULL means "cuda when a GPU is usable, else cpu". Returns 1 for cuda, 0 for cpu;
// exits with a message for any other name, or for cuda without a usable GPU. have_gpu (may be
// NULL) receives whether a GPU is usable at all, gi its description (or the reason there is none).
int choose_device(const char *device, GpuInfo *gi, int *have_gpu);

#ifdef __cplusplus
}
#endif
