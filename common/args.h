// args.h — small command-line helpers shared by the programs.
// defines: parse_int_list
#pragma once
#ifdef __cplusplus
extern "C" {
#endif

// "1,2,3" -> a malloc'ed array of non-negative ints (*n set to its length). `flag` names the
// option in error messages ("--ids"); a malformed or empty list exits with a message.
int *parse_int_list(const char *s, const char *flag, int *n);

#ifdef __cplusplus
}
#endif
