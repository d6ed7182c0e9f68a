// table.h — every program's output: one table, as aligned text, CSV or JSON.
// defines: OutFmt, Table, table_new, table_meta, table_col, table_row, table_num, table_str,
//          table_print, table_free, outfmt_from_args, table_std_meta, fmt_flops
//
// Usage:
//   Table *t = table_new("matmul ladder");
//   table_std_meta(t);                       // date (UTC), commit, host
//   table_meta(t, "device", "%s", name);
//   table_col(t, "version", NULL);           // string column
//   table_col(t, "ms", "%.3f");              // numeric column with its text format
//   table_row(t); table_str(t, "version", "naive"); table_num(t, "ms", 1.5);
//   table_print(t, outfmt_from_args(argc, argv), stdout);
// Text: "# key: value" lines, then aligned columns. CSV: the same "# key: value" lines
// (read with pandas.read_csv(comment='#')), a header, one line per row. JSON: one object
// {"title":..., "meta":{...}, "rows":[{col: value, ...}, ...]}; NaN numbers become null.
#pragma once
#include <stdio.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef enum { FMT_TEXT = 0, FMT_CSV = 1, FMT_JSON = 2 } OutFmt;
typedef struct Table Table;

Table *table_new(const char *title);
void table_meta(Table *t, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void table_col(Table *t, const char *name, const char *numfmt);  // numfmt NULL: string column
void table_row(Table *t);                                        // start a new row
void table_num(Table *t, const char *col, double v);
void table_str(Table *t, const char *col, const char *s);
void table_print(const Table *t, OutFmt fmt, FILE *f);
void table_free(Table *t);
// Number of rows so far, and a cell's value (NaN / NULL when unset) for programs and tests.
int table_nrows(const Table *t);
double table_get_num(const Table *t, int row, const char *col);
const char *table_get_str(const Table *t, int row, const char *col);

// Scans argv for --csv or --json (text otherwise).
OutFmt outfmt_from_args(int argc, char **argv);
// Adds date (UTC, ISO 8601), commit (git, "-dirty" if built from a modified tree), host.
void table_std_meta(Table *t);
// The commit this binary was built from.
const char *build_commit(void);
// A FLOP/s rate in the unit that fits it, 3-4 significant digits: "786 TFLOP/s", "152 GFLOP/s",
// "32.1 GFLOP/s" (so a CPU's 0.15 TFLOP/s never prints as "0 TFLOP/s"). Returns buf.
const char *fmt_flops(double flops_per_s, char *buf, size_t n);

#ifdef __cplusplus
}
#endif
