// tokenize.c — the tokenizer from the command line: text -> ids and pieces, ids -> text, MB/s.
//   build/bin/tokenize --tokenizer tests/data/tokenizers/qwen3-tokenizer.json --text "你好, world"
//   build/bin/tokenize --tokenizer T.json --file notes.txt --add-special --json   # {"ids": [...], ...}
//   build/bin/tokenize --tokenizer T.json --decode 9707,11,1879 [--skip-special]
//   build/bin/tokenize --tokenizer T.json --check hf.jsonl   # lines {"text", "ids", "add_special"}:
//                                         # compare with HF (make_tokenizer_goldens.py --random-diff)
//   build/bin/tokenize --tokenizer T.json --file corpus.txt --bench [--seconds 3] [--docs 4096]
// --bench --docs N encodes the file as documents: cut after the first '\n' at or past every
// N bytes (tools/bench_tokenizer.py cuts the same way for HF).
// --file takes the file's bytes exactly as they are (no newline is stripped). Text that is
// not valid UTF-8 is refused with the offset of the first bad byte.
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "check.h"
#include "prompt.h"
#include "table.h"
#include "timer.h"
#include "tokenizer.h"

// --help prints to stdout and exits 0; a usage error prints to stderr and exits 2.
static void usage_to(FILE *f, int code) {
    fprintf(f,
            "usage: tokenize --tokenizer FILE (--text S | --file F) [--add-special] [--json] [--bench [--seconds S] [--docs N]]\n"
            "       tokenize --tokenizer FILE --decode 1,2,3 [--skip-special] [--json]\n"
            "       tokenize --tokenizer FILE --check F.jsonl\n"
            "  --tokenizer    a Hugging Face tokenizer.json (tokenizer_config.json beside it gives BOS/EOS)\n"
            "  --text/--file  what to encode (--file takes the file's bytes exactly as they are)\n"
            "  --add-special  add the post-processor's special tokens (BOS) as transformers does\n"
            "  --json         one object whose \"ids\" are the ids; otherwise ids and pieces\n"
            "  --decode       ids to text (--skip-special drops special tokens)\n"
            "  --bench        encode throughput in MB/s, one thread\n"
            "  --check        compare with ids from Hugging Face tokenizers (one JSON per line)\n");
    exit(code);
}
static void usage(void) { usage_to(stderr, 2); }

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen_check(path, "rb");
    size_t cap = 1 << 16, len = 0;
    char *p = xmalloc(cap);
    size_t r;
    while ((r = fread(p + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            cap *= 2;
            char *q = realloc(p, cap);
            if (!q) die("out of memory reading %s", path);
            p = q;
        }
    }
    if (ferror(f)) die("reading %s: %s", path, strerror(errno));
    fclose(f);
    *n = len;
    return p;
}

// A piece or decoded text made printable for a terminal table: control bytes as \n, \t, \xNN.
static void printable(char *dst, size_t cap, const char *s, size_t n) { text_printable(dst, cap, s, n); }

int main(int argc, char **argv) {
    const char *tok_path = NULL, *text = NULL, *file = NULL, *decode = NULL, *check = NULL;
    int add_special = 0, json = 0, bench = 0, skip_special = 0;
    double seconds = 2.0;
    long docs = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--tokenizer") && i + 1 < argc) tok_path = argv[++i];
        else if (!strcmp(a, "--text") && i + 1 < argc) text = argv[++i];
        else if (!strcmp(a, "--file") && i + 1 < argc) file = argv[++i];
        else if (!strcmp(a, "--decode") && i + 1 < argc) decode = argv[++i];
        else if (!strcmp(a, "--check") && i + 1 < argc) check = argv[++i];
        else if (!strcmp(a, "--seconds") && i + 1 < argc) seconds = arg_float(a, argv[++i], 0, 3600, ARG_LO_OPEN);
        else if (!strcmp(a, "--docs") && i + 1 < argc) docs = (long)arg_int(a, argv[++i], 0, 1L << 30);
        else if (!strcmp(a, "--add-special")) add_special = 1;
        else if (!strcmp(a, "--skip-special")) skip_special = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--bench")) bench = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) usage_to(stdout, 0);
        else usage();
    }
    if (!tok_path || (!!text + !!file + !!decode + !!check) != 1) usage();

    char err[512];
    double t0 = now_sec();
    Tokenizer *t = tokenizer_load(tok_path, err, sizeof err);
    if (!t) die("%s", err);
    double load_s = now_sec() - t0;

    if (check) {  // one JSON object per line: {"text": s, "ids": [...], "add_special": 0|1}
        FILE *f = fopen_check(check, "r");
        char *line = NULL;
        size_t cap = 0, n = 0, bad = 0;
        while (getline(&line, &cap, f) > 0) {
            json_error_t e;
            json_t *o = json_loads(line, JSON_ALLOW_NUL, &e);
            if (!o) die("%s line %zu: %s", check, n + 1, e.text);
            json_t *txt = json_object_get(o, "text"), *want = json_object_get(o, "ids");
            if (!json_is_string(txt) || !json_is_array(want))
                die("%s line %zu: want {\"text\": string, \"ids\": [...]}", check, n + 1);
            TokIds r = {0};
            int rc = tokenizer_encode(t, json_string_value(txt), json_string_length(txt),
                                      json_is_true(json_object_get(o, "add_special")), &r);
            int ok = rc == 0 && r.n == json_array_size(want);
            for (size_t i = 0; ok && i < r.n; i++) ok = r.ids[i] == json_integer_value(json_array_get(want, i));
            if (!ok && bad++ < 5) fprintf(stderr, "differs from HF: %s", line);
            n++;
            tokids_free(&r);
            json_decref(o);
        }
        free(line);
        fclose(f);
        printf("%s: %zu/%zu texts give HF's ids\n", check, n - bad, n);
        tokenizer_free(t);
        return bad ? 1 : 0;
    }
    if (decode) {
        TokIds ids = {0};
        int n_ids;
        int *v = parse_int_list(decode, "--decode", &n_ids);
        check_ids_in_vocab("--decode", v, n_ids, tokenizer_vocab_size(t));
        ids.n = (size_t)n_ids;
        ids.ids = xmalloc(ids.n * sizeof(int32_t));
        for (size_t i = 0; i < ids.n; i++) ids.ids[i] = v[i];
        free(v);
        size_t n;
        char *s = tokenizer_decode(t, ids.ids, ids.n, skip_special, &n);
        if (json) {
            json_t *o = json_pack("{s:s%}", "text", s, n);
            char *d = json_dumps(o, JSON_ENSURE_ASCII);
            printf("%s\n", d);
            free(d);
            json_decref(o);
        } else {
            fwrite(s, 1, n, stdout);
            printf("\n");
        }
        free(s);
        tokids_free(&ids);
        tokenizer_free(t);
        return 0;
    }

    size_t len;
    char *buf = NULL;
    if (file) {
        buf = read_file(file, &len);
        text = buf;
    } else {
        len = strlen(text);
    }
    TokIds ids = {0};
    if (tokenizer_encode(t, text, len, add_special, &ids) != 0) die("%s: %s", file ? file : "--text", tokenizer_error(t));

    if (bench) {
        // Single thread; the first encode above warmed the word cache, as a long-running
        // server's would be. Repeat until `seconds` have passed; report the median.
        double times[1000];
        int reps = 0;
        double start = now_sec();
        size_t ndocs = 0;
        struct timespec c0, c1;  // CPU time of this process: cpu/wall = 1.0 means one busy thread
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c0);
        while (reps < 1000 && (reps < 3 || now_sec() - start < seconds)) {
            TokIds r = {0};
            double a = now_sec();
            if (docs <= 0) {
                tokenizer_encode(t, text, len, add_special, &r);
                ndocs = 1;
            } else {
                ndocs = 0;
                for (size_t d = 0; d < len;) {
                    size_t e = d + (size_t)docs < len ? d + (size_t)docs : len;
                    const char *nl = memchr(text + e, '\n', len - e);
                    e = nl ? (size_t)(nl - text) + 1 : len;
                    r.n = 0;  // one document's ids at a time, as a server would
                    if (tokenizer_encode(t, text + d, e - d, add_special, &r) != 0) die("%s", tokenizer_error(t));
                    ndocs++;
                    d = e;
                }
            }
            times[reps++] = now_sec() - a;
            tokids_free(&r);
        }
        double wall = now_sec() - start;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &c1);
        double cpu = (double)(c1.tv_sec - c0.tv_sec) + 1e-9 * (double)(c1.tv_nsec - c0.tv_nsec);
        double med = median_d(times, reps);
        Table *tb = table_new("tokenizer encode throughput (single thread)");
        table_std_meta(tb);
        table_meta(tb, "tokenizer", "%s", tok_path);
        table_meta(tb, "input", "%s", file ? file : "--text");
        table_col(tb, "bytes", "%.0f");
        table_col(tb, "docs", "%.0f");
        table_col(tb, "tokens", "%.0f");
        table_col(tb, "reps", "%.0f");
        table_col(tb, "median_ms", "%.3f");
        table_col(tb, "MB_per_s", "%.2f");
        table_col(tb, "cpu_per_wall", "%.2f");
        table_col(tb, "load_ms", "%.1f");
        table_row(tb);
        table_num(tb, "bytes", (double)len);
        table_num(tb, "docs", (double)ndocs);
        table_num(tb, "tokens", (double)ids.n);
        table_num(tb, "reps", reps);
        table_num(tb, "median_ms", med * 1e3);
        table_num(tb, "MB_per_s", (double)len / med / 1e6);
        table_num(tb, "cpu_per_wall", cpu / wall);
        table_num(tb, "load_ms", load_s * 1e3);
        table_print(tb, outfmt_from_args(argc, argv), stdout);
        table_free(tb);
    } else if (json) {
        json_t *arr = json_array();
        for (size_t i = 0; i < ids.n; i++) json_array_append_new(arr, json_integer(ids.ids[i]));
        json_t *o = json_pack("{s:o,s:i,s:i}", "ids", arr, "n_tokens", (json_int_t)ids.n, "n_bytes", (json_int_t)len);
        char *d = json_dumps(o, JSON_COMPACT);
        printf("%s\n", d);
        free(d);
        json_decref(o);
    } else {
        printf("# tokenizer: %s (%d ids, loaded in %.0f ms); %zu bytes -> %zu tokens%s\n", tok_path,
               tokenizer_vocab_size(t), load_s * 1e3, len, ids.n, add_special ? " (with special tokens)" : "");
        printf("%6s %8s  %-24s %s\n", "i", "id", "piece", "text");
        for (size_t i = 0; i < ids.n; i++) {
            const char *piece = tokenizer_piece(t, ids.ids[i]);
            size_t dn;
            char *d = tokenizer_decode(t, &ids.ids[i], 1, 0, &dn);
            char p1[256], p2[256];
            printable(p1, sizeof p1, piece ? piece : "?", piece ? strlen(piece) : 1);
            printable(p2, sizeof p2, d, dn);
            printf("%6zu %8d  %-24s %s\n", i, ids.ids[i], p1, p2);
            free(d);
        }
    }
    tokids_free(&ids);
    free(buf);
    tokenizer_free(t);
    return 0;
}
