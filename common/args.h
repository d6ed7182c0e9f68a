// args.h — command-line helpers shared by the programs: strict number parsing, id lists, --device.
// defines: ARG_EXIT, ARG_LO_OPEN, ARG_HI_OPEN, arg_die, arg_help_or_unknown, arg_int, arg_u64, arg_float, arg_int_list,
//          parse_int_list, check_ids_in_vocab, choose_device
//
// Every option value is parsed whole and range checked: "8k", "1e3" (for an integer), "abc", "",
// " 5", "0x10", an overflow, "nan" or "inf" are refused. A refusal is ONE line on stderr that
// names the option, the value and what is allowed, e.g.
//   error: --context: '8k' is not an integer (allowed: 1..16777216)
//   error: --top-p: 'nan' is not a finite number (allowed: (0, 1])
// and the program exits with ARG_EXIT (2, a usage error; other failures exit 1).
#pragma once
#include <stdint.h>
#include <stdio.h>

#include "gpu.h"
#ifdef __cplusplus
extern "C" {
#endif

#define ARG_EXIT 2

// Print "error: <message>" on stderr and exit(ARG_EXIT).
__attribute__((noreturn, format(printf, 1, 2))) void arg_die(const char *fmt, ...);
// The last branch of a program's option loop: -h / --help prints usage(stdout) and exits 0;
// anything else prints usage(stderr), then "error: unknown or incomplete argument: A", and exits
// ARG_EXIT.
__attribute__((noreturn)) void arg_help_or_unknown(const char *a, void (*usage)(FILE *));

// A decimal integer (an optional '-', then digits only) in lo..hi.
long long arg_int(const char *opt, const char *s, long long lo, long long hi);
// A decimal unsigned 64-bit integer (digits only: "-1" is refused, not wrapped around).
uint64_t arg_u64(const char *opt, const char *s);

// A finite decimal number ("0.9", "1e-5"; not "nan", "inf" or hex) in [lo, hi]; flags make an
// end open: ARG_LO_OPEN for (lo, ..., ARG_HI_OPEN for ..., hi).
enum { ARG_LO_OPEN = 1, ARG_HI_OPEN = 2 };
double arg_float(const char *opt, const char *s, double lo, double hi, int flags);

// "1,2,3" -> a malloc'ed array of ints, each in lo..hi (*n set to its length). An empty list,
// an empty element ("1,,2", "1,2,"), or an element arg_int would refuse exits with one line.
int *arg_int_list(const char *opt, const char *s, long long lo, long long hi, int *n);
// arg_int_list of non-negative ints (token ids, positions).
int *parse_int_list(const char *s, const char *opt, int *n);

// Exits with one line ("<what>: token id 700 at position 2 is outside the vocabulary [0, 608)")
// unless every id is in [0, vocab).
void check_ids_in_vocab(const char *what, const int *ids, int n, int vocab);

// --device: NULL means "cuda when a GPU is usable, else cpu". Returns 1 for cuda, 0 for cpu;
// exits with a message for any other name, or for cuda without a usable GPU. have_gpu (may be
// NULL) receives whether a GPU is usable at all, gi its description (or the reason there is none).
int choose_device(const char *device, GpuInfo *gi, int *have_gpu);

#ifdef __cplusplus
}
#endif
