// chat_template.c — see chat_template.h: the small Jinja renderer for chat templates.
//
// Three stages, one section each:
//   lex     template -> tokens. Text between tags comes out with Jinja's whitespace control
//           applied (trim_blocks: the newline right after a block tag goes; lstrip_blocks: spaces
//           and tabs between the start of a line and a block tag go; {%- -%} {{- -}} strip all
//           whitespace on their side); inside a tag: names, literals, operators.
//   parse   tokens -> a list of statements (text, {{ expr }}, if/elif/else, for, set, break,
//           continue, macro) holding expression trees; recursive descent with Jinja's precedence.
//   render  walk the statements with a chain of scopes. As in Jinja, each loop iteration has a
//           scope of its own, so a `set` inside a loop is gone after it (hence namespace()); a
//           macro call renders its body into a buffer of its own, in a scope above the one the
//           macro was defined in, and that text is the call's value.
// Values are what Python values look like from Jinja: undefined, none, bool, int, float, str,
// list, dict, a namespace, a builtin function, a loop object, a macro. Printing one is Python's str():
// lists print as ['a', 1], floats as repr() does; undefined prints as nothing and is false.
//
// Memory: everything (tokens, tree, values, output) lives in one arena freed at the end, and an
// error anywhere longjmps back to chat_template_render with its message. So nothing below checks
// return codes or frees.
#define _GNU_SOURCE  // memmem
#include "chat_template.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <utf8proc.h>

long long chat_template_fixed_time = 0;

enum { MAX_DEPTH = 100, MAX_ARGS = 16, MAX_OUTPUT = 64 << 20, MAX_ITEMS = 1 << 22 };

// ---------------------------------------------------------------- types

typedef struct {
    const char *s;
    size_t n;
} Str;

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_NS, V_FUNC, V_LOOP, V_MACRO } VKind;
typedef enum { FN_RANGE, FN_NAMESPACE, FN_RAISE, FN_STRFTIME, FN_DICT } Builtin;
typedef struct Value Value;
typedef struct {
    Value *v;
    size_t n;
    int tuple;  // prints as (a, b): dict.items() and (a, b) literals
} List;
typedef struct {  // insertion-ordered, as Python's dict
    Str *key;
    Value *val;
    size_t n, cap;
} Dict;
typedef struct {
    long index0, length;
    const List *items;
} Loop;
struct Value {
    VKind k;
    union {
        int b;        // V_BOOL
        long long i;  // V_INT
        double f;     // V_FLOAT
        Str s;        // V_STR; V_UNDEF: the message for when it is used (e.g. "'foo' is undefined")
        List *l;      // V_LIST
        Dict *d;      // V_DICT, V_NS (a namespace: the one mutable value)
        Builtin fn;   // V_FUNC
        Loop *loop;   // V_LOOP
        const struct MacroDef *mac;  // V_MACRO
    };
};

typedef enum { T_TEXT, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF } TKind;
typedef struct {
    TKind k;
    size_t pos;   // offset in the source
    Str s;        // T_TEXT, T_NAME, T_OP: the text; T_STR: the decoded string
    long long i;  // T_INT
    double f;     // T_FLOAT
} Token;

typedef enum { E_LIT, E_NAME, E_LIST, E_DICT, E_ATTR, E_INDEX, E_SLICE, E_CALL, E_FILTER, E_TEST, E_NEG, E_NOT, E_AND, E_OR, E_BIN, E_CMP, E_COND } EKind;
typedef struct Expr Expr;
struct Expr {
    EKind k;
    size_t pos;
    Value lit;     // E_LIT
    Str name;      // E_NAME, E_ATTR: the attribute, E_FILTER / E_TEST: which, E_BIN: the operator
    Expr *a, *b, *c;  // E_ATTR, E_INDEX, E_SLICE, E_CALL (callee), E_FILTER, E_TEST, E_NEG, E_NOT: a;
                      // E_INDEX: a[b]; E_AND, E_OR, E_BIN: a op b; E_COND: a if b else c
    Expr **args;   // E_LIST items, E_DICT key, value, key, ...; E_CALL / E_FILTER / E_TEST arguments;
    Str *kw;       //   their keywords (kw[i].n == 0: positional); E_SLICE start, stop, step (or NULL);
    int nargs;     //   E_CMP: the operands after a, kw the operators
    int negate;    // E_TEST: `is not`; E_NEG: unary + (not -); E_LIST: a tuple
};

typedef enum { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE, S_BLOCK, S_MACRO } SKind;
typedef struct Stmt Stmt;
struct Stmt {
    SKind k;
    size_t pos;
    Str text;          // S_TEXT
    Expr *e;           // S_OUT: what to print; S_IF: the condition; S_FOR: the iterable; S_SET: the value
    Expr *cond;        // S_FOR: `for x in xs if cond`
    Str var[2];        // S_FOR: the loop variable(s); S_SET: the name and, for `set ns.attr`, attr
    int nvars;
    Stmt *body, *orelse;  // S_IF: then / elif or else; S_FOR: body / else; S_BLOCK, S_MACRO: body
    Stmt *next;
    Str *params;          // S_MACRO: the parameters' names (var[0] the macro's), ...
    Expr **defaults;      //   ... their default values (NULL: none), nvars of them
};

typedef struct Scope Scope;
// A macro as {% macro %} defines it when it runs: its statement and the scope it was defined in
// (the names it reads beside its parameters are looked up from there, as Jinja's closures do).
struct MacroDef {
    const Stmt *def;
    Scope *scope;
};

typedef struct {
    char *s;
    size_t n, cap;
} Buf;

struct Scope {
    Dict vars;  // this scope's names and values
    struct Scope *up;
};

typedef struct Chunk {
    struct Chunk *next;
    size_t used, cap;
    max_align_t data[];
} Chunk;

typedef struct {
    jmp_buf jb;
    char msg[512];      // the error
    const char *src;    // the template, newlines normalized (positions index it)
    size_t n;
    Chunk *arena;
    Token *tok;         // lexer output and the parser's position in it
    size_t ntok, captok, ti;
    int depth, loops;   // parser: expression / block nesting; enclosing for loops
    Scope *scope;       // renderer: the innermost scope
    int ctl;            // renderer: 1 a break, 2 a continue on its way to the loop
    int calls;          // renderer: macro calls in progress (recursion is bounded by MAX_DEPTH)
    Buf out;
} Ctx;

// ---------------------------------------------------------------- arena, errors, strings

static void line_col(const Ctx *c, size_t pos, int *line, int *col) {
    *line = 1, *col = 1;
    for (size_t i = 0; i < pos && i < c->n; i++) {
        if (c->src[i] == '\n') ++*line, *col = 1;
        else if (((unsigned char)c->src[i] & 0xC0) != 0x80) ++*col;  // columns count characters
    }
}

// pos: where in the template, or (size_t)-1 for nowhere in particular.
__attribute__((noreturn, format(printf, 3, 4))) static void fail(Ctx *c, size_t pos, const char *fmt, ...) {
    char m[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    int line, col;
    if (pos == (size_t)-1) snprintf(c->msg, sizeof c->msg, "%s", m);
    else line_col(c, pos, &line, &col), snprintf(c->msg, sizeof c->msg, "line %d, column %d: %s", line, col, m);
    longjmp(c->jb, 1);
}

static void *alloc(Ctx *c, size_t n) {
    n = (n + 15) & ~(size_t)15;
    Chunk *k = c->arena;
    if (!k || k->cap - k->used < n) {
        const size_t cap = n > (64 << 10) ? n : (64 << 10);
        if (!(k = malloc(sizeof *k + cap))) fail(c, (size_t)-1, "out of memory");
        k->next = c->arena, k->used = 0, k->cap = cap;
        c->arena = k;
    }
    char *p = (char *)k->data + k->used;
    k->used += n;
    return memset(p, 0, n);
}

static void *grow(Ctx *c, void *p, size_t n_old, size_t n_new) {  // arena "realloc": a copy
    void *q = alloc(c, n_new);
    if (n_old) memcpy(q, p, n_old);
    return q;
}

static void put(Ctx *c, Buf *b, const char *s, size_t n) {
    if (n > MAX_OUTPUT || b->n > MAX_OUTPUT) fail(c, (size_t)-1, "a string is longer than %d MiB", MAX_OUTPUT >> 20);
    if (b->n + n + 1 > b->cap) {
        const size_t cap = 2 * (b->n + n + 1) > 64 ? 2 * (b->n + n + 1) : 64;
        b->s = grow(c, b->s, b->n, cap), b->cap = cap;
    }
    if (n) memcpy(b->s + b->n, s, n);
    b->s[b->n += n] = 0;
}
static void puts_(Ctx *c, Buf *b, const char *s) { put(c, b, s, strlen(s)); }
__attribute__((format(printf, 3, 4))) static void putf(Ctx *c, Buf *b, const char *fmt, ...) {
    char t[64];
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    put(c, b, t, (size_t)k < sizeof t ? (size_t)k : sizeof t - 1);
}
static Str buf_str(const Buf *b) { return (Str){b->s ? b->s : "", b->n}; }

static Str cstr(const char *s) { return (Str){s, strlen(s)}; }
static int str_eq(Str a, const char *b) { return a.n == strlen(b) && !memcmp(a.s, b, a.n); }
static int str_same(Str a, Str b) { return a.n == b.n && (!a.n || !memcmp(a.s, b.s, a.n)); }
static Str str_cat(Ctx *c, Str a, Str b) {
    Buf o = {0};
    put(c, &o, a.s, a.n), put(c, &o, b.s, b.n);
    return buf_str(&o);
}
__attribute__((format(printf, 2, 3))) static Str strf(Ctx *c, const char *fmt, ...) {
    char t[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t, sizeof t, fmt, ap);
    va_end(ap);
    Buf o = {0};
    puts_(c, &o, t);
    return buf_str(&o);
}

// UTF-8: the code point at s[i] and the index after it; a byte that starts no valid sequence
// counts as one character of its own (-1).
static size_t next_cp(Str s, size_t i, int32_t *cp) {
    utf8proc_int32_t u;
    const utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s.s + i, (utf8proc_ssize_t)(s.n - i), &u);
    if (k <= 0) return *cp = -1, i + 1;
    return *cp = u, i + (size_t)k;
}
static void put_cp(Ctx *c, Buf *b, int32_t cp) {
    utf8proc_uint8_t t[4];
    put(c, b, (const char *)t, (size_t)utf8proc_encode_char(cp, t));
}
// Byte offsets of each character of s: off[0..n], off[n] == s.n. Returns n.
static size_t cp_offsets(Ctx *c, Str s, size_t **off) {
    size_t n = 0;
    int32_t cp;
    for (size_t i = 0; i < s.n; i = next_cp(s, i, &cp)) n++;
    *off = alloc(c, (n + 1) * sizeof(size_t));
    n = 0;
    for (size_t i = 0; i < s.n; i = next_cp(s, i, &cp)) (*off)[n++] = i;
    (*off)[n] = s.n;
    return n;
}
static int py_space(int32_t cp) {  // Python's str.isspace()
    return (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---------------------------------------------------------------- values

static Value v_undef(Str why) { return (Value){.k = V_UNDEF, .s = why}; }
static Value v_none(void) { return (Value){.k = V_NONE}; }
static Value v_bool(int b) { return (Value){.k = V_BOOL, .b = !!b}; }
static Value v_int(long long i) { return (Value){.k = V_INT, .i = i}; }
static Value v_float(double f) { return (Value){.k = V_FLOAT, .f = f}; }
static Value v_str(Str s) { return (Value){.k = V_STR, .s = s}; }
static Value v_list(Ctx *c, size_t n) {
    if (n > MAX_ITEMS) fail(c, (size_t)-1, "a list of %zu items is more than this renderer makes", n);
    List *l = alloc(c, sizeof *l);
    l->v = alloc(c, (n ? n : 1) * sizeof(Value)), l->n = n;
    return (Value){.k = V_LIST, .l = l};
}
static Value v_dict(Ctx *c, VKind k) {
    Value v = {.k = k, .d = alloc(c, sizeof(Dict))};
    return v;
}
static Value *dict_get(const Dict *d, Str key) {
    for (size_t i = 0; i < d->n; i++)
        if (str_same(d->key[i], key)) return &d->val[i];
    return NULL;
}
static void dict_set(Ctx *c, Dict *d, Str key, Value v) {
    Value *old = dict_get(d, key);
    if (old) {
        *old = v;
        return;
    }
    if (d->n == d->cap) {
        const size_t cap = d->cap ? 2 * d->cap : 4;
        d->key = grow(c, d->key, d->n * sizeof(Str), cap * sizeof(Str));
        d->val = grow(c, d->val, d->n * sizeof(Value), cap * sizeof(Value));
        d->cap = cap;
    }
    d->key[d->n] = key, d->val[d->n++] = v;
}

static const char *type_name(Value v) {  // Python's names, for messages
    static const char *const names[] = {"Undefined", "NoneType", "bool", "int", "float", "str",
                                        "list", "dict", "Namespace", "function", "LoopContext", "Macro"};
    return v.k == V_LIST && v.l->tuple ? "tuple" : names[v.k];
}
static int is_num(Value v) { return v.k == V_BOOL || v.k == V_INT || v.k == V_FLOAT; }
static double num(Value v) { return v.k == V_FLOAT ? v.f : v.k == V_INT ? (double)v.i : v.b; }
static long long inum(Value v) { return v.k == V_INT ? v.i : v.b; }  // V_INT or V_BOOL

static int truthy(Value v) {
    switch (v.k) {
    case V_UNDEF: case V_NONE: return 0;
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.s.n > 0;
    case V_LIST: return v.l->n > 0;
    case V_DICT: return v.d->n > 0;
    default: return 1;
    }
}

static int equal(Value a, Value b) {  // Python's ==
    if (is_num(a) && is_num(b)) return a.k == V_FLOAT || b.k == V_FLOAT ? num(a) == num(b) : inum(a) == inum(b);
    if (a.k != b.k) return 0;
    switch (a.k) {
    case V_UNDEF: case V_NONE: return 1;
    case V_STR: return str_same(a.s, b.s);
    case V_LIST:
        if (a.l->n != b.l->n) return 0;
        for (size_t i = 0; i < a.l->n; i++)
            if (!equal(a.l->v[i], b.l->v[i])) return 0;
        return 1;
    case V_DICT:
        if (a.d->n != b.d->n) return 0;
        for (size_t i = 0; i < a.d->n; i++) {
            const Value *o = dict_get(b.d, a.d->key[i]);
            if (!o || !equal(a.d->val[i], *o)) return 0;
        }
        return 1;
    case V_NS: return a.d == b.d;
    case V_FUNC: return a.fn == b.fn;
    case V_MACRO: return a.mac == b.mac;
    default: return a.loop == b.loop;
    }
}

// Python's repr() of a float: the shortest digits that read back to the same double, in
// scientific notation when the exponent is below -4 or at least 16.
static void put_float(Ctx *c, Buf *b, double x) {
    if (isnan(x)) return puts_(c, b, "nan");
    if (isinf(x)) return puts_(c, b, x < 0 ? "-inf" : "inf");
    char t[40], dig[24];
    for (int p = 1; p <= 17; p++) {
        snprintf(t, sizeof t, "%.*e", p - 1, x);
        if (strtod(t, NULL) == x) break;
    }
    const char *e = strchr(t, 'e'), *m = t + (t[0] == '-');
    const int exp = atoi(e + 1);
    int nd = 0;
    for (const char *q = m; q < e; q++)
        if (*q != '.') dig[nd++] = *q;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    if (t[0] == '-') puts_(c, b, "-");
    if (exp < -4 || exp >= 16) {
        put(c, b, dig, 1);
        if (nd > 1) puts_(c, b, "."), put(c, b, dig + 1, (size_t)nd - 1);
        putf(c, b, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    } else if (exp >= 0) {
        for (int i = 0; i <= exp; i++) put(c, b, i < nd ? &dig[i] : "0", 1);
        puts_(c, b, ".");
        if (nd > exp + 1) put(c, b, dig + exp + 1, (size_t)(nd - exp - 1));
        else puts_(c, b, "0");
    } else {
        puts_(c, b, "0.");
        for (int i = 0; i < -exp - 1; i++) puts_(c, b, "0");
        put(c, b, dig, (size_t)nd);
    }
}

// Python's repr() of a str: single quotes unless the text has ' and no ", escapes for
// backslash, the quote, control characters and the non-printable ones.
static void put_repr_str(Ctx *c, Buf *b, Str s) {
    const int dq = memchr(s.s, '\'', s.n) && !memchr(s.s, '"', s.n);
    const char q = dq ? '"' : '\'';
    put(c, b, &q, 1);
    int32_t cp;
    for (size_t i = 0, j; i < s.n; i = j) {
        j = next_cp(s, i, &cp);
        if (cp == q || cp == '\\') put(c, b, "\\", 1), put(c, b, (const char *)&s.s[i], 1);
        else if (cp == '\n') puts_(c, b, "\\n");
        else if (cp == '\r') puts_(c, b, "\\r");
        else if (cp == '\t') puts_(c, b, "\\t");
        else if (cp < 0) putf(c, b, "\\x%02x", (unsigned char)s.s[i]);
        else if (cp < 0x20 || cp == 0x7F) putf(c, b, "\\x%02x", cp);
        else if (cp < 0x80) put(c, b, &s.s[i], 1);
        else {
            const utf8proc_category_t k = utf8proc_category(cp);
            const int hidden = k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CS ||
                               k == UTF8PROC_CATEGORY_CO || k == UTF8PROC_CATEGORY_CN || k == UTF8PROC_CATEGORY_ZL ||
                               k == UTF8PROC_CATEGORY_ZP || k == UTF8PROC_CATEGORY_ZS;
            if (!hidden) put(c, b, &s.s[i], j - i);
            else if (cp < 0x100) putf(c, b, "\\x%02x", cp);
            else if (cp < 0x10000) putf(c, b, "\\u%04x", cp);
            else putf(c, b, "\\U%08x", cp);
        }
    }
    put(c, b, &q, 1);
}

static void put_value(Ctx *c, Buf *b, Value v, int repr);
static void put_items(Ctx *c, Buf *b, Value v) {  // a list, dict or namespace as Python's repr()
    if (v.k == V_LIST) {
        puts_(c, b, v.l->tuple ? "(" : "[");
        for (size_t i = 0; i < v.l->n; i++) {
            if (i) puts_(c, b, ", ");
            put_value(c, b, v.l->v[i], 1);
        }
        puts_(c, b, v.l->tuple ? (v.l->n == 1 ? ",)" : ")") : "]");
        return;
    }
    puts_(c, b, "{");
    for (size_t i = 0; i < v.d->n; i++) {
        if (i) puts_(c, b, ", ");
        put_repr_str(c, b, v.d->key[i]);
        puts_(c, b, ": ");
        put_value(c, b, v.d->val[i], 1);
    }
    puts_(c, b, "}");
}

// Python's str() (repr = 0: what {{ }} prints) or repr() (inside a list or dict).
static void put_value(Ctx *c, Buf *b, Value v, int repr) {
    static const char *const fn_names[] = {"range", "namespace", "raise_exception", "strftime_now", "dict"};
    switch (v.k) {
    case V_UNDEF: if (repr) puts_(c, b, "Undefined"); break;
    case V_NONE: puts_(c, b, "None"); break;
    case V_BOOL: puts_(c, b, v.b ? "True" : "False"); break;
    case V_INT: putf(c, b, "%lld", v.i); break;
    case V_FLOAT: put_float(c, b, v.f); break;
    case V_STR: if (repr) put_repr_str(c, b, v.s); else put(c, b, v.s.s, v.s.n); break;
    case V_LIST: case V_DICT: put_items(c, b, v); break;
    case V_NS: puts_(c, b, "<Namespace "), put_items(c, b, (Value){.k = V_DICT, .d = v.d}), puts_(c, b, ">"); break;
    case V_FUNC: putf(c, b, "<function %s>", fn_names[v.fn]); break;
    case V_LOOP: putf(c, b, "<LoopContext %ld/%ld>", v.loop->index0 + 1, v.loop->length); break;
    case V_MACRO: putf(c, b, "<Macro '%.*s'>", (int)v.mac->def->var[0].n, v.mac->def->var[0].s); break;
    }
}

static Str to_str(Ctx *c, Value v) {
    if (v.k == V_STR) return v.s;
    Buf b = {0};
    put_value(c, &b, v, 0);
    return buf_str(&b);
}

// json.dumps's options, as transformers' tojson takes them: ensure_ascii (default False), indent
// (None, a number of spaces or a string), separators (item, key), sort_keys.
typedef struct {
    int ascii, sort;
    Str indent;          // indent.s NULL: None (all on one line)
    Str item_sep, key_sep;
} JsonOpts;

static int key_less(Str a, Str b) {  // Python's str < (code point order, which UTF-8's byte order is)
    const int r = memcmp(a.s, b.s, a.n < b.n ? a.n : b.n);
    return r ? r < 0 : a.n < b.n;
}

static void put_json_str(Ctx *c, Buf *b, Str s, int ascii) {
    puts_(c, b, "\"");
    int32_t cp;
    for (size_t i = 0, j; i < s.n; i = j) {
        const unsigned char ch = (unsigned char)s.s[i];
        j = i + 1;
        if (ch == '"') puts_(c, b, "\\\"");
        else if (ch == '\\') puts_(c, b, "\\\\");
        else if (ch == '\n') puts_(c, b, "\\n");
        else if (ch == '\r') puts_(c, b, "\\r");
        else if (ch == '\t') puts_(c, b, "\\t");
        else if (ch == '\b') puts_(c, b, "\\b");
        else if (ch == '\f') puts_(c, b, "\\f");
        else if (ch < 0x20) putf(c, b, "\\u%04x", ch);
        else if ((ch < 0x7F || !ascii)) put(c, b, (const char *)&s.s[i], 1);
        else {  // ensure_ascii: \uXXXX, a surrogate pair above U+FFFF
            j = next_cp(s, i, &cp);  // (0x7F too: Python escapes all but space to ~)
            if (cp < 0) fail(c, (size_t)-1, "tojson: the string is not valid UTF-8");
            if (cp < 0x10000) putf(c, b, "\\u%04x", cp);
            else putf(c, b, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF));
        }
    }
    puts_(c, b, "\"");
}

static void put_json(Ctx *c, Buf *b, Value v, const JsonOpts *o, int level, size_t pos) {
    switch (v.k) {
    case V_NONE: puts_(c, b, "null"); return;
    case V_BOOL: puts_(c, b, v.b ? "true" : "false"); return;
    case V_INT: putf(c, b, "%lld", v.i); return;
    case V_FLOAT:
        if (isnan(v.f)) puts_(c, b, "NaN");
        else if (isinf(v.f)) puts_(c, b, v.f < 0 ? "-Infinity" : "Infinity");
        else put_float(c, b, v.f);
        return;
    case V_STR: put_json_str(c, b, v.s, o->ascii); return;
    case V_LIST: case V_DICT: {
        const int list = v.k == V_LIST;
        const size_t n = list ? v.l->n : v.d->n;
        size_t *order = alloc(c, (n ? n : 1) * sizeof(size_t));  // the items' order: sort_keys sorts a dict's
        for (size_t i = 0; i < n; i++) {
            size_t k = i;
            if (!list && o->sort)
                for (; k > 0 && key_less(v.d->key[i], v.d->key[order[k - 1]]); k--) order[k] = order[k - 1];
            order[k] = i;
        }
        puts_(c, b, list ? "[" : "{");
        for (size_t i = 0; i < n; i++) {
            if (i) put(c, b, o->item_sep.s, o->item_sep.n);
            if (o->indent.s) {
                puts_(c, b, "\n");
                for (int k = 0; k <= level; k++) put(c, b, o->indent.s, o->indent.n);
            }
            if (!list) put_json_str(c, b, v.d->key[order[i]], o->ascii), put(c, b, o->key_sep.s, o->key_sep.n);
            put_json(c, b, list ? v.l->v[i] : v.d->val[order[i]], o, level + 1, pos);
        }
        if (o->indent.s && n) {
            puts_(c, b, "\n");
            for (int k = 0; k < level; k++) put(c, b, o->indent.s, o->indent.n);
        }
        puts_(c, b, list ? "]" : "}");
        return;
    }
    default: fail(c, pos, "tojson: Object of type %s is not JSON serializable", type_name(v));
    }
}

// ---------------------------------------------------------------- lex

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f'; }
static int is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

static Token *emit(Ctx *c, TKind k, size_t pos) {
    if (c->ntok == c->captok) {
        const size_t cap = c->captok ? 2 * c->captok : 256;
        c->tok = grow(c, c->tok, c->ntok * sizeof(Token), cap * sizeof(Token));
        c->captok = cap;
    }
    Token *t = &c->tok[c->ntok++];
    t->k = k, t->pos = pos;
    return t;
}

// The text src[p, q) before a tag, whitespace control applied. trim_nl: the previous tag was a
// block tag or comment (trim_blocks drops one newline after it); strip_left: it ended with
// -%}, -}} or -#}; strip_right: this tag starts with {%-, {{- or {#-; lstrip: this tag is a block
// tag or comment (lstrip_blocks: the spaces and tabs before it go when only they stand between it
// and the start of its line).
static void lex_text(Ctx *c, size_t p, size_t q, int trim_nl, int strip_left, int strip_right, int lstrip) {
    const char *s = c->src;
    size_t a = p, b = q;
    if (strip_left) while (a < q && is_ws(s[a])) a++;
    else if (trim_nl && a < q && s[a] == '\n') a++;
    if (strip_right) {
        while (b > p && is_ws(s[b - 1])) b--;
    } else if (lstrip) {
        size_t k = q;
        while (k > p && (s[k - 1] == ' ' || s[k - 1] == '\t')) k--;
        if (k == 0 || (k > p && s[k - 1] == '\n')) b = k;
    }
    if (b > a) emit(c, T_TEXT, a)->s = (Str){s + a, b - a};
}

static int hex_val(char ch) {
    return is_digit(ch) ? ch - '0' : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10 : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10 : -1;
}

// A string literal at src[p] (' or "), with Python's escapes; returns the index after it.
static size_t lex_string(Ctx *c, size_t p, Str *out) {
    const char *s = c->src, q = s[p];
    Buf b = {0};
    put(c, &b, "", 0);
    size_t i = p + 1;
    for (;;) {
        if (i >= c->n) fail(c, p, "string literal is not closed (no %c)", q);
        if (s[i] == q) break;
        if (s[i] != '\\') {
            put(c, &b, &s[i++], 1);
            continue;
        }
        const char e = i + 1 < c->n ? s[i + 1] : 0;
        i += 2;
        static const char from[] = "ntr\\'\"abfv", to[] = "\n\t\r\\'\"\a\b\f\v";
        const char *m = e ? strchr(from, e) : NULL;
        if (m) {
            put(c, &b, &to[m - from], 1);
        } else if (e == '\n') {  // a backslash at the end of a line continues it
        } else if (e == 'x' || e == 'u' || e == 'U') {  // \xNN \uNNNN \UNNNNNNNN: a code point
            const int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            long cp = 0;
            for (int k = 0; k < digits; k++, i++) {
                if (i >= c->n || hex_val(s[i]) < 0) fail(c, i, "bad \\%c escape in a string literal", e);
                cp = cp * 16 + hex_val(s[i]);
            }
            if (!utf8proc_codepoint_valid((utf8proc_int32_t)cp)) fail(c, i, "\\%c escape: %lx is not a character", e, cp);
            put_cp(c, &b, (int32_t)cp);
        } else {  // not an escape: kept as written
            put(c, &b, &s[i - 2], e ? 2 : 1);
        }
    }
    *out = buf_str(&b);
    return i + 1;
}

// The tokens of a tag from src[p] to its end (}} or %}, with - or + before it); sets the
// whitespace control the end asks of the text after it. open: where the tag starts.
static size_t lex_tag(Ctx *c, size_t p, char kind, size_t open, int *strip_left, int *trim_nl) {
    static const char *const ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                      ">", "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "=", NULL};
    const char *s = c->src, end = kind == '{' ? '}' : '%';
    const size_t n = c->n;
    char brackets[MAX_DEPTH];  // the ones open: a }} inside {...} does not end the tag
    int depth = 0;
    for (;;) {
        while (p < n && is_ws(s[p])) p++;
        if (p >= n) fail(c, open, "'%s' is not closed (no '%s')", kind == '{' ? "{{" : "{%", kind == '{' ? "}}" : "%}");
        if (depth == 0) {
            const char fl = (s[p] == '-' || (s[p] == '+' && kind == '%')) ? s[p] : 0;
            const size_t k = p + (fl != 0);
            if (k + 1 < n && s[k] == end && s[k + 1] == '}') {
                emit(c, kind == '{' ? T_VAR_END : T_BLOCK_END, p);
                *strip_left = fl == '-';
                *trim_nl = kind == '%' && fl != '+';
                return k + 2;
            }
        }
        const size_t t0 = p;
        if (is_name_start(s[p])) {
            while (p < n && (is_name_start(s[p]) || is_digit(s[p]))) p++;
            emit(c, T_NAME, t0)->s = (Str){s + t0, p - t0};
        } else if (is_digit(s[p])) {
            int fl = 0;
            while (p < n && is_digit(s[p])) p++;
            if (p + 1 < n && s[p] == '.' && is_digit(s[p + 1])) {
                fl = 1, p++;
                while (p < n && is_digit(s[p])) p++;
            }
            if (p < n && (s[p] == 'e' || s[p] == 'E')) {
                size_t k = p + 1 + (p + 1 < n && (s[p + 1] == '+' || s[p + 1] == '-'));
                if (k < n && is_digit(s[k])) {
                    fl = 1, p = k;
                    while (p < n && is_digit(s[p])) p++;
                }
            }
            char num[64];
            snprintf(num, sizeof num, "%.*s", (int)(p - t0), s + t0);
            Token *t = emit(c, fl ? T_FLOAT : T_INT, t0);
            errno = 0;
            if (fl) t->f = strtod(num, NULL);
            else t->i = strtoll(num, NULL, 10);
            if (errno == ERANGE || p - t0 >= sizeof num) fail(c, t0, "number %s is too large for this renderer", num);
        } else if (s[p] == '\'' || s[p] == '"') {
            Str v;
            p = lex_string(c, p, &v);
            emit(c, T_STR, t0)->s = v;
        } else {
            int i = 0;
            while (ops[i] && strncmp(s + p, ops[i], strlen(ops[i]))) i++;
            if (!ops[i]) {
                int32_t cp;
                const size_t j = next_cp((Str){s, n}, p, &cp);
                fail(c, p, "unexpected character '%.*s' in a tag", (int)(j - p), s + p);
            }
            const char ch = ops[i][0];
            if (ch == '(' || ch == '[' || ch == '{') {
                if (depth == MAX_DEPTH) fail(c, p, "brackets nested more than %d deep", MAX_DEPTH);
                brackets[depth++] = ch;
            } else if (ch == ')' || ch == ']' || ch == '}') {
                const char o = depth ? brackets[depth - 1] : 0, want = o == '(' ? ')' : o == '[' ? ']' : o == '{' ? '}' : 0;
                if (!want) fail(c, p, "unexpected '%c'", ch);
                if (ch != want) fail(c, p, "unexpected '%c' (expected '%c')", ch, want);
                depth--;
            }
            p += strlen(ops[i]);
            emit(c, T_OP, t0)->s = cstr(ops[i]);
        }
    }
}

static void lex(Ctx *c) {
    const char *s = c->src;
    const size_t n = c->n;
    size_t p = 0;
    int trim_nl = 0, strip_left = 0;
    for (;;) {
        size_t q = p;
        while (q + 1 < n && !(s[q] == '{' && (s[q + 1] == '{' || s[q + 1] == '%' || s[q + 1] == '#'))) q++;
        if (q + 1 >= n) {
            lex_text(c, p, n, trim_nl, strip_left, 0, 0);
            break;
        }
        const char kind = s[q + 1], fl = q + 2 < n ? s[q + 2] : 0;  // {{ {% {#, then - or +
        const int minus = fl == '-', plus = fl == '+' && kind == '%';
        lex_text(c, p, q, trim_nl, strip_left, minus, kind != '{' && !plus);
        const size_t r = q + 2 + (minus || plus);
        if (kind == '#') {
            const char *e = r <= n ? memmem(s + r, n - r, "#}", 2) : NULL;
            if (!e) fail(c, q, "comment '{#' is not closed (no '#}')");
            strip_left = (size_t)(e - s) > r && e[-1] == '-';
            trim_nl = 1;
            p = (size_t)(e - s) + 2;
            continue;
        }
        emit(c, kind == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, q);
        p = lex_tag(c, r, kind, q, &strip_left, &trim_nl);
    }
    emit(c, T_EOF, n);
}

// ---------------------------------------------------------------- parse

static Token *peek(Ctx *c) { return &c->tok[c->ti]; }
static Token *take(Ctx *c) {
    Token *t = &c->tok[c->ti];
    if (t->k != T_EOF) c->ti++;
    return t;
}
static int is_op(const Token *t, const char *op) { return t->k == T_OP && str_eq(t->s, op); }
static int is_name(const Token *t, const char *kw) { return t->k == T_NAME && str_eq(t->s, kw); }
static int accept_op(Ctx *c, const char *op) { return is_op(peek(c), op) ? (c->ti++, 1) : 0; }
static int accept_name(Ctx *c, const char *kw) { return is_name(peek(c), kw) ? (c->ti++, 1) : 0; }

__attribute__((noreturn)) static void unexpected(Ctx *c, const char *wanted) {
    const Token *t = peek(c);
    static const char *const what[] = {"template text", "'{{'", "'}}'", "'{%'", "'%}'", "", "a string", "a number", "a number", "", "the end of the template"};
    if (t->k == T_NAME || t->k == T_OP) fail(c, t->pos, "expected %s, found '%.*s'", wanted, (int)t->s.n, t->s.s);
    fail(c, t->pos, "expected %s, found %s", wanted, what[t->k]);
}
static void expect_op(Ctx *c, const char *op) {
    if (accept_op(c, op)) return;
    char w[16];
    snprintf(w, sizeof w, "'%s'", op);
    unexpected(c, w);
}
static Str expect_name(Ctx *c, const char *what) {
    if (peek(c)->k != T_NAME) unexpected(c, what);
    return take(c)->s;
}
static int is_keyword(Str s) {
    static const char *const kw[] = {"and", "or", "not", "in", "is", "if", "else", "true", "false", "none",
                                     "True", "False", "None", NULL};
    for (int i = 0; kw[i]; i++)
        if (str_eq(s, kw[i])) return 1;
    return 0;
}
static Str expect_var(Ctx *c, const char *what) {  // a name to assign to
    if (peek(c)->k != T_NAME || is_keyword(peek(c)->s)) unexpected(c, what);
    return take(c)->s;
}
static void expect_end(Ctx *c, TKind k) {
    if (peek(c)->k != k) unexpected(c, k == T_VAR_END ? "'}}'" : "'%}'");
    take(c);
}

static Expr *node(Ctx *c, EKind k, size_t pos) {
    Expr *e = alloc(c, sizeof *e);
    e->k = k, e->pos = pos;
    return e;
}

static Expr *parse_expr(Ctx *c);
static Expr *parse_or(Ctx *c);

// Arguments up to ')' (already past '('): positional, then name=value.
static void parse_args(Ctx *c, Expr *e, const Expr *first) {
    Expr *a[MAX_ARGS];
    Str kw[MAX_ARGS] = {{0}};
    int n = 0;
    if (first) a[n++] = (Expr *)first;  // a filter's or test's operand
    while (!accept_op(c, ")")) {
        if (n > (first != NULL)) {
            expect_op(c, ",");
            if (accept_op(c, ")")) break;
        }
        if (n == MAX_ARGS) fail(c, peek(c)->pos, "more than %d arguments", MAX_ARGS - 1);
        if (peek(c)->k == T_NAME && is_op(&c->tok[c->ti + 1], "=")) kw[n] = take(c)->s, take(c);
        a[n++] = parse_expr(c);
    }
    e->nargs = n;
    e->args = alloc(c, (size_t)(n ? n : 1) * sizeof(Expr *));
    e->kw = alloc(c, (size_t)(n ? n : 1) * sizeof(Str));
    memcpy(e->args, a, (size_t)n * sizeof(Expr *));
    memcpy(e->kw, kw, (size_t)n * sizeof(Str));
}

// Items up to the closing bracket (already past the opening one): a list or tuple's, or a
// dict's key: value pairs.
static Expr *parse_items(Ctx *c, EKind k, size_t pos, const char *close, Expr *first) {
    Expr *e = node(c, k, pos), *tmp[MAX_ARGS * 4];
    Expr **a = tmp;
    int n = 0, cap = MAX_ARGS * 4;
    if (first) a[n++] = first;
    while (!accept_op(c, close)) {
        if (n) {
            expect_op(c, ",");
            if (accept_op(c, close)) break;
        }
        if (n + 2 > cap) {
            Expr **b = alloc(c, (size_t)cap * 2 * sizeof(Expr *));
            memcpy(b, a, (size_t)n * sizeof(Expr *));
            a = b, cap *= 2;
        }
        a[n++] = parse_expr(c);
        if (k == E_DICT) expect_op(c, ":"), a[n++] = parse_expr(c);
    }
    e->nargs = n;
    e->args = alloc(c, (size_t)(n ? n : 1) * sizeof(Expr *));
    memcpy(e->args, a, (size_t)n * sizeof(Expr *));
    return e;
}

static Expr *parse_primary(Ctx *c) {
    Token *t = peek(c);
    Expr *e = node(c, E_LIT, t->pos);
    switch (t->k) {
    case T_STR: {
        Str s = take(c)->s;
        while (peek(c)->k == T_STR) s = str_cat(c, s, take(c)->s);  // 'a' 'b' is 'ab'
        e->lit = v_str(s);
        return e;
    }
    case T_INT: e->lit = v_int(take(c)->i); return e;
    case T_FLOAT: e->lit = v_float(take(c)->f); return e;
    case T_NAME:
        if (is_name(t, "true") || is_name(t, "True")) e->lit = v_bool(1);
        else if (is_name(t, "false") || is_name(t, "False")) e->lit = v_bool(0);
        else if (is_name(t, "none") || is_name(t, "None")) e->lit = v_none();
        else if (is_keyword(t->s)) unexpected(c, "an expression");
        else e->k = E_NAME, e->name = t->s;
        take(c);
        return e;
    case T_OP:
        if (accept_op(c, "(")) {  // (x), or a tuple: (), (x,), (x, y)
            Expr *l;
            if (accept_op(c, ")")) {
                l = node(c, E_LIST, t->pos);
            } else {
                Expr *x = parse_expr(c);
                if (accept_op(c, ")")) return x;
                l = parse_items(c, E_LIST, t->pos, ")", x);
            }
            l->negate = 1;
            return l;
        }
        if (accept_op(c, "[")) return parse_items(c, E_LIST, t->pos, "]", NULL);
        if (accept_op(c, "{")) return parse_items(c, E_DICT, t->pos, "}", NULL);
        break;
    default: break;
    }
    unexpected(c, "an expression");
}

static Expr *parse_postfix(Ctx *c, Expr *e) {
    for (;;) {
        const size_t pos = e->pos;  // messages point at the start of messages[0].content, not at the . or [
        if (accept_op(c, ".")) {
            Expr *x = node(c, E_ATTR, pos);
            x->a = e, x->name = expect_name(c, "an attribute name");
            e = x;
        } else if (accept_op(c, "[")) {
            Expr *part[3] = {NULL, NULL, NULL};
            int colons = 0;
            if (!is_op(peek(c), ":")) part[0] = parse_expr(c);
            while (colons < 2 && accept_op(c, ":")) {
                colons++;
                if (!is_op(peek(c), "]") && !is_op(peek(c), ":")) part[colons] = parse_expr(c);
            }
            expect_op(c, "]");
            Expr *x = node(c, colons ? E_SLICE : E_INDEX, pos);
            x->a = e, x->b = part[0];
            if (colons) {
                x->args = alloc(c, 3 * sizeof(Expr *)), x->nargs = 3;
                memcpy(x->args, part, sizeof part);
            }
            e = x;
        } else if (accept_op(c, "(")) {
            Expr *x = node(c, E_CALL, pos);
            x->a = e;
            parse_args(c, x, NULL);
            e = x;
        } else {
            return e;
        }
    }
}

static Expr *parse_unary(Ctx *c, int with_filters) {
    if (++c->depth > MAX_DEPTH) fail(c, peek(c)->pos, "expression nested more than %d deep", MAX_DEPTH);
    const size_t pos = peek(c)->pos;
    Expr *e;
    if (is_op(peek(c), "-") || is_op(peek(c), "+")) {  // -x|f is (-x)|f, as in Jinja
        e = node(c, E_NEG, pos);
        e->negate = take(c)->s.s[0] == '+';
        e->a = parse_unary(c, 0);
    } else {
        e = parse_postfix(c, parse_primary(c));
    }
    while (with_filters) {
        const size_t fpos = peek(c)->pos;
        // A filter or test this renderer does not have is an error when it runs (Jinja's is when
        // the template is compiled): a template that has one in a branch never taken still works.
        if (accept_op(c, "|")) {  // x|f or x|f(args): f(x, args)
            Expr *f = node(c, E_FILTER, fpos);
            f->name = expect_name(c, "a filter name");
            if (accept_op(c, "(")) parse_args(c, f, e);
            else f->args = alloc(c, sizeof(Expr *)), f->args[0] = e, f->nargs = 1, f->kw = alloc(c, sizeof(Str));
            e = f;
        } else if (accept_name(c, "is")) {  // x is [not] t, x is t(args), x is t arg
            Expr *t = node(c, E_TEST, fpos);
            t->negate = accept_name(c, "not");
            t->name = expect_name(c, "a test name");
            t->a = e;
            const Token *n = peek(c);
            if (accept_op(c, "(")) {
                parse_args(c, t, NULL);
            } else if ((n->k == T_NAME && !is_name(n, "else") && !is_name(n, "or") && !is_name(n, "and")) || n->k == T_STR ||
                       n->k == T_INT || n->k == T_FLOAT || is_op(n, "[") || is_op(n, "{")) {  // Jinja's rule for `is t arg`
                t->args = alloc(c, sizeof(Expr *)), t->kw = alloc(c, sizeof(Str)), t->nargs = 1;
                t->args[0] = parse_postfix(c, parse_primary(c));
            }
            e = t;
        } else {
            break;
        }
    }
    c->depth--;
    return e;
}

static Expr *binary(Ctx *c, EKind k, const char *op, Expr *a, Expr *b, size_t pos) {
    Expr *e = node(c, k, pos);
    e->name = cstr(op), e->a = a, e->b = b;
    return e;
}

// Jinja's precedence, loosest first: x if c else y; or; and; not; comparisons and in;
// + -; ~; * / // %; **; unary - and + (then filters and tests); . [] () on a primary.
static Expr *parse_pow(Ctx *c) {
    Expr *e = parse_unary(c, 1);
    for (size_t pos; pos = peek(c)->pos, accept_op(c, "**");) e = binary(c, E_BIN, "**", e, parse_unary(c, 1), pos);
    return e;
}
static Expr *parse_mul(Ctx *c) {
    static const char *const ops[] = {"*", "/", "//", "%", NULL};
    Expr *e = parse_pow(c);
    for (;;) {
        int i = 0;
        while (ops[i] && !is_op(peek(c), ops[i])) i++;
        if (!ops[i]) return e;
        const size_t pos = take(c)->pos;
        e = binary(c, E_BIN, ops[i], e, parse_pow(c), pos);
    }
}
static Expr *parse_concat(Ctx *c) {
    Expr *e = parse_mul(c);
    for (size_t pos; pos = peek(c)->pos, accept_op(c, "~");) e = binary(c, E_BIN, "~", e, parse_mul(c), pos);
    return e;
}
static Expr *parse_add(Ctx *c) {
    Expr *e = parse_concat(c);
    for (;;) {
        const size_t pos = peek(c)->pos;
        if (accept_op(c, "+")) e = binary(c, E_BIN, "+", e, parse_concat(c), pos);
        else if (accept_op(c, "-")) e = binary(c, E_BIN, "-", e, parse_concat(c), pos);
        else return e;
    }
}
static Expr *parse_cmp(Ctx *c) {
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">=", NULL};
    Expr *first = parse_add(c), *opnd[MAX_ARGS];
    Str opname[MAX_ARGS];
    int n = 0;
    const size_t pos = peek(c)->pos;
    for (;;) {
        int i = 0;
        while (ops[i] && !is_op(peek(c), ops[i])) i++;
        const char *op = ops[i];
        if (op) take(c);
        else if (accept_name(c, "in")) op = "in";
        else if (is_name(peek(c), "not") && is_name(&c->tok[c->ti + 1], "in")) c->ti += 2, op = "not in";
        else break;
        if (n == MAX_ARGS) fail(c, peek(c)->pos, "more than %d comparisons in a chain", MAX_ARGS);
        opname[n] = cstr(op), opnd[n++] = parse_add(c);
    }
    if (!n) return first;
    Expr *e = node(c, E_CMP, pos);
    e->a = first, e->nargs = n;
    e->args = alloc(c, (size_t)n * sizeof(Expr *)), e->kw = alloc(c, (size_t)n * sizeof(Str));
    memcpy(e->args, opnd, (size_t)n * sizeof(Expr *)), memcpy(e->kw, opname, (size_t)n * sizeof(Str));
    return e;
}
static Expr *parse_not(Ctx *c) {
    const size_t pos = peek(c)->pos;
    if (!accept_name(c, "not")) return parse_cmp(c);
    if (++c->depth > MAX_DEPTH) fail(c, pos, "expression nested more than %d deep", MAX_DEPTH);
    Expr *e = node(c, E_NOT, pos);
    e->a = parse_not(c);
    c->depth--;
    return e;
}
static Expr *parse_and(Ctx *c) {
    Expr *e = parse_not(c);
    for (size_t pos; pos = peek(c)->pos, accept_name(c, "and");) e = binary(c, E_AND, "and", e, parse_not(c), pos);
    return e;
}
static Expr *parse_or(Ctx *c) {
    Expr *e = parse_and(c);
    for (size_t pos; pos = peek(c)->pos, accept_name(c, "or");) e = binary(c, E_OR, "or", e, parse_and(c), pos);
    return e;
}
static Expr *parse_expr(Ctx *c) {
    Expr *e = parse_or(c);
    for (size_t pos; pos = peek(c)->pos, accept_name(c, "if");) {
        Expr *x = node(c, E_COND, pos);
        x->a = e, x->b = parse_or(c);
        if (accept_name(c, "else")) x->c = parse_expr(c);
        e = x;
    }
    return e;
}

static Stmt *stmt(Ctx *c, SKind k, size_t pos) {
    Stmt *s = alloc(c, sizeof *s);
    s->k = k, s->pos = pos;
    return s;
}

// Statements up to a tag whose keyword is one of ends (NULL-terminated; NULL: up to the end
// of the template). Returns them; *which gets the index of the keyword that ended them, the
// parser standing after it. opener / open_pos name the block, for "not closed" messages.
static Stmt *parse_body(Ctx *c, const char *const *ends, int *which, const char *opener, size_t open_pos) {
    Stmt head = {0}, *tail = &head;
    if (++c->depth > MAX_DEPTH) fail(c, open_pos, "blocks nested more than %d deep", MAX_DEPTH);
    for (;;) {
        Token *t = take(c);
        Stmt *s = NULL;
        if (t->k == T_EOF) {
            if (ends) {
                int last = 0;
                while (ends[last + 1]) last++;
                fail(c, open_pos, "'%s' is not closed (no '%s' before the end of the template)", opener, ends[last]);
            }
            c->depth--;
            return head.next;
        } else if (t->k == T_TEXT) {
            (s = stmt(c, S_TEXT, t->pos))->text = t->s;
        } else if (t->k == T_VAR_BEGIN) {
            (s = stmt(c, S_OUT, t->pos))->e = parse_expr(c);
            expect_end(c, T_VAR_END);
        } else if (t->k == T_BLOCK_BEGIN) {
            const Token *kw = peek(c);
            const Str name = expect_name(c, "a tag name (if, for, set, ...)");
            for (int i = 0; ends && ends[i]; i++)
                if (str_eq(name, ends[i])) {
                    *which = i;
                    c->depth--;
                    return head.next;
                }
            if (str_eq(name, "if") || str_eq(name, "elif")) {
                if (str_eq(name, "elif")) fail(c, kw->pos, "'elif' outside of an if block");
                static const char *const if_ends[] = {"elif", "else", "endif", NULL};
                s = stmt(c, S_IF, t->pos);
                Stmt *cur = s;
                for (;;) {  // if / elif ... : each elif is an if in the else of the one before
                    int w = 0;
                    cur->e = parse_expr(c);
                    expect_end(c, T_BLOCK_END);
                    cur->body = parse_body(c, if_ends, &w, "if", t->pos);
                    if (w == 0) {
                        cur = cur->orelse = stmt(c, S_IF, t->pos);
                        continue;
                    }
                    expect_end(c, T_BLOCK_END);
                    if (w == 1) {
                        static const char *const else_ends[] = {"endif", NULL};
                        cur->orelse = parse_body(c, else_ends, &w, "if", t->pos);
                        expect_end(c, T_BLOCK_END);
                    }
                    break;
                }
            } else if (str_eq(name, "for")) {
                static const char *const for_ends[] = {"else", "endfor", NULL};
                s = stmt(c, S_FOR, t->pos);
                s->var[s->nvars++] = expect_var(c, "a loop variable");
                if (accept_op(c, ",")) s->var[s->nvars++] = expect_var(c, "a second loop variable");
                if (!accept_name(c, "in")) unexpected(c, "'in'");
                s->e = parse_or(c);
                if (accept_name(c, "if")) s->cond = parse_expr(c);
                if (is_name(peek(c), "recursive")) fail(c, peek(c)->pos, "recursive loops are not supported by this renderer");
                expect_end(c, T_BLOCK_END);
                int w = 0;
                c->loops++;
                s->body = parse_body(c, for_ends, &w, "for", t->pos);
                c->loops--;
                expect_end(c, T_BLOCK_END);
                if (w == 0) {
                    static const char *const else_ends[] = {"endfor", NULL};
                    s->orelse = parse_body(c, else_ends, &w, "for", t->pos);
                    expect_end(c, T_BLOCK_END);
                }
            } else if (str_eq(name, "set")) {
                s = stmt(c, S_SET, t->pos);
                s->var[s->nvars++] = expect_var(c, "a variable name");
                if (accept_op(c, ".")) s->var[s->nvars++] = expect_name(c, "an attribute name");
                if (peek(c)->k == T_BLOCK_END) {  // {% set x %}...{% endset %}: x is the text the body renders
                    static const char *const set_ends[] = {"endset", NULL};
                    int w = 0;
                    take(c);
                    s->body = parse_body(c, set_ends, &w, "set", t->pos);
                    expect_end(c, T_BLOCK_END);
                } else {
                    if (!is_op(peek(c), "=")) unexpected(c, "'='");
                    take(c);
                    s->e = parse_expr(c);
                    expect_end(c, T_BLOCK_END);
                }
            } else if (str_eq(name, "break") || str_eq(name, "continue")) {
                if (!c->loops) fail(c, kw->pos, "'%.*s' outside of a for loop", (int)name.n, name.s);
                s = stmt(c, str_eq(name, "break") ? S_BREAK : S_CONTINUE, t->pos);
                expect_end(c, T_BLOCK_END);
            } else if (str_eq(name, "macro")) {  // {% macro name(a, b=default) %} ... {% endmacro %}
                static const char *const macro_ends[] = {"endmacro", NULL};
                s = stmt(c, S_MACRO, t->pos);
                s->var[0] = expect_var(c, "a macro name");
                s->params = alloc(c, MAX_ARGS * sizeof *s->params);
                s->defaults = alloc(c, MAX_ARGS * sizeof *s->defaults);
                expect_op(c, "(");
                while (!accept_op(c, ")")) {
                    if (s->nvars && !accept_op(c, ",")) unexpected(c, "',' or ')'");  // (no trailing comma, as in Jinja)
                    if (s->nvars == MAX_ARGS) fail(c, peek(c)->pos, "a macro with more than %d parameters", MAX_ARGS);
                    const Token *pt = peek(c);
                    const Str pn = expect_var(c, "a parameter name");
                    for (int i = 0; i < s->nvars; i++)
                        if (str_same(s->params[i], pn)) fail(c, pt->pos, "duplicate parameter '%.*s'", (int)pn.n, pn.s);
                    s->params[s->nvars] = pn;
                    s->defaults[s->nvars] = accept_op(c, "=") ? parse_expr(c) : NULL;
                    if (!s->defaults[s->nvars] && s->nvars && s->defaults[s->nvars - 1])
                        fail(c, pt->pos, "a parameter without a default follows one with a default");
                    s->nvars++;
                }
                expect_end(c, T_BLOCK_END);
                int w = 0, loops = c->loops;
                c->loops = 0;  // a break in the macro's body cannot reach a loop around the definition
                s->body = parse_body(c, macro_ends, &w, "macro", t->pos);
                c->loops = loops;
                expect_end(c, T_BLOCK_END);
            } else if (str_eq(name, "generation")) {  // transformers' tag marking the assistant's text
                static const char *const gen_ends[] = {"endgeneration", NULL};
                int w = 0;
                expect_end(c, T_BLOCK_END);
                (s = stmt(c, S_BLOCK, t->pos))->body = parse_body(c, gen_ends, &w, "generation", t->pos);
                expect_end(c, T_BLOCK_END);
            } else {
                static const char *const known[] = {"call", "filter", "raw", "include", "import", "from",
                                                    "extends", "block", "with", "autoescape", "do", NULL};
                for (int i = 0; known[i]; i++)
                    if (str_eq(name, known[i])) fail(c, kw->pos, "'%s' tags are not supported by this renderer", known[i]);
                static const char *const closers[] = {"elif", "else", "endif", "endfor", "endgeneration", "endmacro", "endset", NULL};
                for (int i = 0; closers[i]; i++) {
                    if (!str_eq(name, closers[i])) continue;
                    if (!ends) fail(c, kw->pos, "unexpected '%s' (no block is open)", closers[i]);
                    int last = 0;
                    while (ends[last + 1]) last++;
                    fail(c, kw->pos, "unexpected '%s' inside '%s' (which '%s' closes)", closers[i], opener, ends[last]);
                }
                fail(c, kw->pos, "unknown tag '%.*s'", (int)name.n, name.s);
            }
        } else {
            fail(c, t->pos, "unexpected %s", t->k == T_VAR_END ? "'}}'" : t->k == T_BLOCK_END ? "'%}'" : "token");
        }
        tail = tail->next = s;
    }
}

// ---------------------------------------------------------------- render: names, attributes, items

static Value *lookup(Scope *s, Str name) {
    for (; s; s = s->up) {
        Value *v = dict_get(&s->vars, name);
        if (v) return v;
    }
    return NULL;
}
static void assign(Ctx *c, Scope *s, Str name, Value v) { dict_set(c, &s->vars, name, v); }

static void need_defined(Ctx *c, Value v, size_t pos) {
    if (v.k == V_UNDEF) fail(c, pos, "%.*s", (int)v.s.n, v.s.s);
}

static Value get_attr(Ctx *c, Value o, Str name, size_t pos) {
    need_defined(c, o, pos);
    if (o.k == V_DICT || o.k == V_NS) {
        const Value *v = dict_get(o.d, name);
        return v ? *v : v_undef(strf(c, "'%s object' has no attribute '%.*s'", o.k == V_NS ? "Namespace" : "dict", (int)name.n, name.s));
    }
    if (o.k == V_LOOP) {
        const Loop *l = o.loop;
        const long i = l->index0, n = l->length;
        if (str_eq(name, "index0")) return v_int(i);
        if (str_eq(name, "index")) return v_int(i + 1);
        if (str_eq(name, "revindex0")) return v_int(n - i - 1);
        if (str_eq(name, "revindex")) return v_int(n - i);
        if (str_eq(name, "first")) return v_bool(i == 0);
        if (str_eq(name, "last")) return v_bool(i == n - 1);
        if (str_eq(name, "length")) return v_int(n);
        if (str_eq(name, "depth")) return v_int(1);
        if (str_eq(name, "depth0")) return v_int(0);
        if (str_eq(name, "previtem") && i > 0) return l->items->v[i - 1];
        if (str_eq(name, "nextitem") && i + 1 < n) return l->items->v[i + 1];
    }
    return v_undef(strf(c, "'%s object' has no attribute '%.*s'", type_name(o), (int)name.n, name.s));
}

static Value str_char(Ctx *c, Str s, const size_t *off, size_t i) {
    Buf b = {0};
    put(c, &b, s.s + off[i], off[i + 1] - off[i]);
    return v_str(buf_str(&b));
}

static Value get_item(Ctx *c, Value o, Value key, size_t pos) {
    need_defined(c, o, pos);
    if (key.k == V_STR && (o.k == V_DICT || o.k == V_NS || o.k == V_LOOP)) return get_attr(c, o, key.s, pos);
    if ((key.k == V_INT || key.k == V_BOOL) && (o.k == V_LIST || o.k == V_STR)) {
        size_t *off = NULL;
        const long long n = o.k == V_LIST ? (long long)o.l->n : (long long)cp_offsets(c, o.s, &off);
        long long i = inum(key);
        if (i < 0) i += n;
        if (i >= 0 && i < n) return o.k == V_LIST ? o.l->v[i] : str_char(c, o.s, off, (size_t)i);
        return v_undef(strf(c, "%s object has no element %lld", type_name(o), inum(key)));  // jinja2's words
    }
    Buf b = {0};
    put_value(c, &b, key, 1);
    return v_undef(strf(c, "'%s object' has no item %.100s", type_name(o), b.s));
}

static long long slice_part(Ctx *c, Value v, long long dflt, size_t pos) {
    if (v.k == V_NONE || v.k == V_UNDEF) return dflt;
    if (v.k != V_INT && v.k != V_BOOL) fail(c, pos, "slice indices must be integers or none, not %s", type_name(v));
    return inum(v);
}

// Python's o[start:stop:step] for a list or a string.
static Value get_slice(Ctx *c, Value o, Value start, Value stop, Value step, size_t pos) {
    need_defined(c, o, pos);
    if (o.k != V_LIST && o.k != V_STR) return v_undef(strf(c, "'%s' object cannot be sliced", type_name(o)));
    size_t *off = NULL;
    const long long n = o.k == V_LIST ? (long long)o.l->n : (long long)cp_offsets(c, o.s, &off);
    const long long st = slice_part(c, step, 1, pos);
    if (st == 0) fail(c, pos, "slice step cannot be zero");
    long long lo = slice_part(c, start, st > 0 ? 0 : n - 1, pos), hi = slice_part(c, stop, st > 0 ? n : -n - 1, pos);
    if (lo < 0) lo = lo + n < 0 ? (st < 0 ? -1 : 0) : lo + n;  // Python's PySlice_AdjustIndices
    else if (lo >= n) lo = st < 0 ? n - 1 : n;
    if (hi < 0) hi = hi + n < 0 ? (st < 0 ? -1 : 0) : hi + n;
    else if (hi >= n) hi = st < 0 ? n - 1 : n;
    const long long cnt = st > 0 ? (hi > lo ? (hi - lo - 1) / st + 1 : 0) : (lo > hi ? (lo - hi - 1) / -st + 1 : 0);
    if (o.k == V_LIST) {
        Value r = v_list(c, (size_t)cnt);
        for (long long i = 0; i < cnt; i++) r.l->v[i] = o.l->v[lo + i * st];
        return r;
    }
    Buf b = {0};
    put(c, &b, "", 0);
    for (long long i = 0; i < cnt; i++) put(c, &b, o.s.s + off[lo + i * st], off[lo + i * st + 1] - off[lo + i * st]);
    return v_str(buf_str(&b));
}

// What a for loop (or list()) goes over: a list's items, a dict's keys, a string's characters;
// undefined is empty.
static List *iterate(Ctx *c, Value v, size_t pos) {
    if (v.k == V_LIST) return v.l;
    if (v.k == V_UNDEF) return v_list(c, 0).l;
    if (v.k == V_DICT || v.k == V_NS) {
        List *l = v_list(c, v.d->n).l;
        for (size_t i = 0; i < v.d->n; i++) l->v[i] = v_str(v.d->key[i]);
        return l;
    }
    if (v.k == V_STR) {
        size_t *off;
        const size_t n = cp_offsets(c, v.s, &off);
        List *l = v_list(c, n).l;
        for (size_t i = 0; i < n; i++) l->v[i] = str_char(c, v.s, off, i);
        return l;
    }
    fail(c, pos, "'%s' object is not iterable", type_name(v));
}

static long long length(Ctx *c, Value v, size_t pos) {
    size_t *off;
    switch (v.k) {
    case V_UNDEF: return 0;
    case V_STR: return (long long)cp_offsets(c, v.s, &off);
    case V_LIST: return (long long)v.l->n;
    case V_DICT: case V_NS: return (long long)v.d->n;
    default: fail(c, pos, "object of type '%s' has no len()", type_name(v));
    }
}

// ---------------------------------------------------------------- render: operators

static int contains(Ctx *c, Value hay, Value x, size_t pos) {  // Python's `x in hay`
    if (hay.k == V_STR) {
        if (x.k != V_STR) fail(c, pos, "'in <string>' requires string as left operand, not %s", type_name(x));
        return x.s.n == 0 || memmem(hay.s.s, hay.s.n, x.s.s, x.s.n) != NULL;
    }
    if (hay.k == V_DICT || hay.k == V_NS) return x.k == V_STR && dict_get(hay.d, x.s) != NULL;
    const List *l = iterate(c, hay, pos);
    for (size_t i = 0; i < l->n; i++)
        if (equal(l->v[i], x)) return 1;
    return 0;
}

static int compare(Ctx *c, Str op, Value a, Value b, size_t pos) {  // a < b etc.: -1, 0, 1
    need_defined(c, a, pos), need_defined(c, b, pos);
    if (is_num(a) && is_num(b)) return num(a) < num(b) ? -1 : num(a) > num(b);
    if (a.k == V_LIST && b.k == V_LIST) {  // the first items that differ decide, else the shorter is less
        for (size_t i = 0; i < a.l->n && i < b.l->n; i++)
            if (!equal(a.l->v[i], b.l->v[i])) return compare(c, op, a.l->v[i], b.l->v[i], pos);
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    if (a.k == V_STR && b.k == V_STR) {
        const int r = memcmp(a.s.s, b.s.s, a.s.n < b.s.n ? a.s.n : b.s.n);  // UTF-8 byte order is code point order
        return r ? (r < 0 ? -1 : 1) : (a.s.n > b.s.n) - (a.s.n < b.s.n);
    }
    fail(c, pos, "'%.*s' not supported between instances of '%s' and '%s'", (int)op.n, op.s, type_name(a), type_name(b));
}

static Value repeat(Ctx *c, Value seq, long long times, size_t pos) {  // 'ab' * 3, [x] * 2
    if (times < 0) times = 0;
    const size_t unit = seq.k == V_STR ? seq.s.n : seq.l->n;
    if (unit && (size_t)times > MAX_ITEMS / unit) fail(c, pos, "the repetition makes more than this renderer does");
    if (seq.k == V_STR) {
        Buf b = {0};
        put(c, &b, "", 0);
        for (long long i = 0; i < times; i++) put(c, &b, seq.s.s, seq.s.n);
        return v_str(buf_str(&b));
    }
    Value r = v_list(c, unit * (size_t)times);
    for (size_t i = 0; i < r.l->n; i++) r.l->v[i] = seq.l->v[i % unit];
    return r;
}

static Value arith(Ctx *c, Str op, Value a, Value b, size_t pos) {
    if (str_eq(op, "~")) return v_str(str_cat(c, to_str(c, a), to_str(c, b)));
    need_defined(c, a, pos), need_defined(c, b, pos);
    const char o = op.s[0];
    if (o == '+' && a.k == V_STR && b.k == V_STR) return v_str(str_cat(c, a.s, b.s));
    if (o == '+' && a.k == V_LIST && b.k == V_LIST) {
        Value r = v_list(c, a.l->n + b.l->n);
        if (a.l->n) memcpy(r.l->v, a.l->v, a.l->n * sizeof(Value));
        if (b.l->n) memcpy(r.l->v + a.l->n, b.l->v, b.l->n * sizeof(Value));
        return r;
    }
    if (op.n == 1 && o == '*' && (a.k == V_STR || a.k == V_LIST) && (b.k == V_INT || b.k == V_BOOL)) return repeat(c, a, inum(b), pos);
    if (op.n == 1 && o == '*' && (b.k == V_STR || b.k == V_LIST) && (a.k == V_INT || a.k == V_BOOL)) return repeat(c, b, inum(a), pos);
    if (!is_num(a) || !is_num(b))
        fail(c, pos, "unsupported operand type(s) for %.*s: '%s' and '%s'", (int)op.n, op.s, type_name(a), type_name(b));
    const int ints = a.k != V_FLOAT && b.k != V_FLOAT;
    const long long x = inum(a), y = inum(b);
    const double p = num(a), q = num(b);
    long long r;
    if (str_eq(op, "/")) {
        if (q == 0) fail(c, pos, "division by zero");
        return v_float(p / q);
    }
    if (str_eq(op, "//") || o == '%') {
        if (q == 0) fail(c, pos, "integer division or modulo by zero");
        if (ints) {  // Python rounds the quotient down and gives the remainder the divisor's sign
            if (x == LLONG_MIN && y == -1) fail(c, pos, "integer overflow");
            long long d = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) d--, m += y;
            return v_int(o == '%' ? m : d);
        }
        double m = fmod(p, q), d;  // Python's float % and // (floatobject.c's divmod)
        if (m) m += (q < 0) != (m < 0) ? q : 0;
        else m = copysign(0.0, q);
        if (o == '%') return v_float(m);
        if ((d = (p - m) / q)) d = d - floor(d) > 0.5 ? floor(d) + 1 : floor(d);
        else d = copysign(0.0, p / q);
        return v_float(d);
    }
    if (str_eq(op, "**")) {
        if (p == 0 && q < 0) fail(c, pos, "0.0 cannot be raised to a negative power");
        if (!ints || y < 0) {
            const double r = pow(p, q);
            if (!isfinite(r)) fail(c, pos, "the power is out of range or not a real number");
            return v_float(r);
        }
        r = 1;
        for (long long i = 0; i < y; i++)
            if (__builtin_mul_overflow(r, x, &r)) fail(c, pos, "integer overflow");
        return v_int(r);
    }
    if (!ints) return v_float(o == '+' ? p + q : o == '-' ? p - q : p * q);
    if (o == '+' ? __builtin_add_overflow(x, y, &r) : o == '-' ? __builtin_sub_overflow(x, y, &r) : __builtin_mul_overflow(x, y, &r))
        fail(c, pos, "integer overflow");
    return v_int(r);
}

// ---------------------------------------------------------------- render: strings (filters and methods)

static int in_chars(int32_t cp, const Value *chars) {  // strip()'s set: whitespace, or the characters given
    if (!chars || chars->k == V_NONE || chars->k == V_UNDEF) return py_space(cp);
    int32_t d;
    for (size_t i = 0; i < chars->s.n;) {
        i = next_cp(chars->s, i, &d);
        if (d == cp) return 1;
    }
    return 0;
}
static Str strip(Ctx *c, Str s, const Value *chars, int left, int right, size_t pos) {
    if (chars && chars->k != V_STR && chars->k != V_NONE && chars->k != V_UNDEF)
        fail(c, pos, "strip arg must be None or str, not %s", type_name(*chars));
    size_t *off;
    const size_t n = cp_offsets(c, s, &off);
    size_t a = 0, b = n;
    int32_t cp;
    while (left && a < b && (next_cp(s, off[a], &cp), in_chars(cp, chars))) a++;
    while (right && b > a && (next_cp(s, off[b - 1], &cp), in_chars(cp, chars))) b--;
    return (Str){s.s + off[a], off[b] - off[a]};
}

static Str change_case(Ctx *c, Str s, int mode) {  // 0 lower, 1 upper, 2 capitalize
    Buf b = {0};
    put(c, &b, "", 0);
    int32_t cp;
    for (size_t i = 0, j, k = 0; i < s.n; i = j, k++) {
        j = next_cp(s, i, &cp);
        if (cp < 0) put(c, &b, s.s + i, 1);
        else put_cp(c, &b, mode == 1 || (mode == 2 && k == 0) ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
    }
    return buf_str(&b);
}

static Value split(Ctx *c, Str s, const Value *sep, long long maxsplit, size_t pos) {
    Value parts[64], *p = parts;
    size_t n = 0, cap = 64;
    for (size_t i = 0;;) {
        if (sep && sep->k == V_STR) {  // split(sep): every occurrence, empty pieces kept
            if (!sep->s.n) fail(c, pos, "split: empty separator");
            const char *m = maxsplit >= 0 && (long long)n >= maxsplit ? NULL : memmem(s.s + i, s.n - i, sep->s.s, sep->s.n);
            const size_t e = m ? (size_t)(m - s.s) : s.n;
            if (n == cap) p = grow(c, p, n * sizeof(Value), 2 * cap * sizeof(Value)), cap *= 2;
            p[n++] = v_str((Str){s.s + i, e - i});
            i = e + sep->s.n;
            if (!m) break;
        } else {  // split(): runs of whitespace, no empty pieces
            int32_t cp;
            size_t j;
            while (i < s.n && (j = next_cp(s, i, &cp), py_space(cp))) i = j;
            if (i >= s.n) break;
            size_t e = i;
            if (maxsplit >= 0 && (long long)n >= maxsplit) e = s.n;  // the rest, as it is
            else
                while (e < s.n && (j = next_cp(s, e, &cp), !py_space(cp))) e = j;
            if (n == cap) p = grow(c, p, n * sizeof(Value), 2 * cap * sizeof(Value)), cap *= 2;
            p[n++] = v_str((Str){s.s + i, e - i});
            i = e;
        }
    }
    Value r = v_list(c, n);
    memcpy(r.l->v, p, n * sizeof(Value));
    return r;
}

static Str replace(Ctx *c, Str s, Str old, Str new_, long long count) {
    Buf b = {0};
    put(c, &b, "", 0);
    size_t i = 0;
    if (!old.n) {  // Python puts new before every character and at the end
        int32_t cp;
        for (size_t j; i < s.n && count--; i = j) put(c, &b, new_.s, new_.n), j = next_cp(s, i, &cp), put(c, &b, s.s + i, j - i);
        if (i >= s.n && count) put(c, &b, new_.s, new_.n);
        put(c, &b, s.s + i, s.n - i);
        return buf_str(&b);
    }
    for (const char *m; count && (m = memmem(s.s + i, s.n - i, old.s, old.n)); count--) {
        put(c, &b, s.s + i, (size_t)(m - s.s) - i), put(c, &b, new_.s, new_.n);
        i = (size_t)(m - s.s) + old.n;
    }
    put(c, &b, s.s + i, s.n - i);
    return buf_str(&b);
}

// ---------------------------------------------------------------- render: calls, filters, tests

static Value eval(Ctx *c, const Expr *e);

typedef struct {
    int n;
    Value v[MAX_ARGS];
    Str kw[MAX_ARGS];
    size_t pos[MAX_ARGS];
} Args;

static void eval_args(Ctx *c, const Expr *e, Args *a) {
    a->n = e->nargs;
    for (int i = 0; i < e->nargs; i++) a->v[i] = eval(c, e->args[i]), a->kw[i] = e->kw[i], a->pos[i] = e->args[i]->pos;
}

// Argument `name` at position i (or given as name=...), or NULL. A keyword nobody asks for is
// an error (check_args).
static const Value *arg(const Args *a, int i, const char *name) {
    for (int k = 0; k < a->n; k++)
        if (a->kw[k].n && str_eq(a->kw[k], name)) return &a->v[k];
    return i < a->n && !a->kw[i].n ? &a->v[i] : NULL;
}
static void check_args(Ctx *c, const Args *a, int max_pos, const char *const *kws, const char *what, size_t pos) {
    for (int k = 0; k < a->n; k++) {
        if (!a->kw[k].n) {
            if (k >= max_pos) fail(c, pos, "%s takes at most %d argument(s)", what, max_pos);
            continue;
        }
        int ok = 0;
        for (int i = 0; kws && kws[i]; i++) ok |= str_eq(a->kw[k], kws[i]);
        if (!ok) fail(c, pos, "%s got an unexpected keyword argument '%.*s'", what, (int)a->kw[k].n, a->kw[k].s);
    }
}
static Str arg_str(Ctx *c, const Args *a, int i, const char *name, const char *what, size_t pos) {
    const Value *v = arg(a, i, name);
    if (!v || v->k != V_STR) fail(c, pos, "%s: argument '%s' must be a string, not %s", what, name, v ? type_name(*v) : "missing");
    return v->s;
}
static long long arg_int(Ctx *c, const Args *a, int i, const char *name, long long dflt, const char *what, size_t pos) {
    const Value *v = arg(a, i, name);
    if (!v || v->k == V_NONE) return dflt;
    if (v->k != V_INT && v->k != V_BOOL) fail(c, pos, "%s: argument '%s' must be an integer, not %s", what, name, type_name(*v));
    return inum(*v);
}

// transformers' namespace refuses names that start with an underscore (CPython internals).
static void ns_name_ok(Ctx *c, Str name, size_t pos) {
    if (name.n && name.s[0] == '_')
        fail(c, pos, "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '%.*s'. Please rename the attribute.",
             (int)name.n, name.s);
}

static Value call_builtin(Ctx *c, Builtin fn, const Args *a, size_t pos) {
    if (fn == FN_RAISE) {
        check_args(c, a, 1, NULL, "raise_exception", pos);
        const Str m = a->n ? to_str(c, a->v[0]) : cstr("");
        fail(c, pos, "the template raised an error: %.*s", (int)m.n, m.s);
    }
    if (fn == FN_STRFTIME) {
        check_args(c, a, 1, NULL, "strftime_now", pos);
        const Str fs = arg_str(c, a, 0, "format", "strftime_now", pos);
        char f[256];
        if (fs.n >= sizeof f) fail(c, pos, "strftime_now: the format is longer than %zu bytes", sizeof f - 1);
        memcpy(f, fs.s, fs.n), f[fs.n] = 0;
        const time_t t = chat_template_fixed_time ? (time_t)chat_template_fixed_time : time(NULL);
        struct tm tm;
        if (chat_template_fixed_time) gmtime_r(&t, &tm);
        else localtime_r(&t, &tm);
        char out[512];
        const size_t k = fs.n ? strftime(out, sizeof out, f, &tm) : 0;
        if (fs.n && !k) fail(c, pos, "strftime_now: the date does not fit in %zu bytes", sizeof out);
        Buf b = {0};
        put(c, &b, out, k);
        return v_str(buf_str(&b));
    }
    if (fn == FN_NAMESPACE || fn == FN_DICT) {  // namespace(d, k=v), dict(d or pairs, k=v): Python's dict(...)
        const char *what = fn == FN_DICT ? "dict()" : "namespace()";
        Value r = v_dict(c, fn == FN_DICT ? V_DICT : V_NS);
        for (int i = 0; i < a->n; i++) {
            if (a->kw[i].n) {
                dict_set(c, r.d, a->kw[i], a->v[i]);
            } else if (i > 0) {
                fail(c, a->pos[i], "%s takes at most 1 positional argument", what);
            } else if (a->v[i].k == V_DICT || a->v[i].k == V_NS) {
                for (size_t k = 0; k < a->v[i].d->n; k++) dict_set(c, r.d, a->v[i].d->key[k], a->v[i].d->val[k]);
            } else {  // a list of (key, value) pairs
                const List *l = iterate(c, a->v[i], a->pos[i]);
                for (size_t k = 0; k < l->n; k++) {
                    const Value p = l->v[k];
                    if (p.k != V_LIST || p.l->n != 2) fail(c, a->pos[i], "%s: item %zu is not a (key, value) pair", what, k);
                    if (p.l->v[0].k != V_STR) fail(c, a->pos[i], "%s: keys must be strings in this renderer, not %s", what, type_name(p.l->v[0]));
                    dict_set(c, r.d, p.l->v[0].s, p.l->v[1]);
                }
            }
        }
        if (fn == FN_NAMESPACE)
            for (size_t k = 0; k < r.d->n; k++) ns_name_ok(c, r.d->key[k], pos);
        return r;
    }
    // range(stop) or range(start, stop[, step])
    check_args(c, a, 3, NULL, "range", pos);
    if (a->n == 0) fail(c, pos, "range expected at least 1 argument, got 0");
    const long long lo = a->n > 1 ? arg_int(c, a, 0, "start", 0, "range", pos) : 0;
    const long long hi = a->n > 1 ? arg_int(c, a, 1, "stop", 0, "range", pos) : arg_int(c, a, 0, "stop", 0, "range", pos);
    const long long st = arg_int(c, a, 2, "step", 1, "range", pos);
    if (st == 0) fail(c, pos, "range() arg 3 must not be zero");
    const long long cnt = st > 0 ? (hi > lo ? (hi - lo - 1) / st + 1 : 0) : (lo > hi ? (lo - hi - 1) / -st + 1 : 0);
    if (cnt > MAX_ITEMS) fail(c, pos, "range of %lld numbers is more than this renderer makes", cnt);
    Value r = v_list(c, (size_t)cnt);
    for (long long i = 0; i < cnt; i++) r.l->v[i] = v_int(lo + i * st);
    return r;
}

static Value call_method(Ctx *c, Value o, Str m, const Args *a, size_t pos) {
    char what[64];
    snprintf(what, sizeof what, "%s.%.*s()", type_name(o), (int)m.n, m.s);
    need_defined(c, o, pos);
    if (o.k == V_STR) {
        const Str s = o.s;
        if (str_eq(m, "startswith") || str_eq(m, "endswith")) {
            check_args(c, a, 1, NULL, what, pos);
            const Value *p = arg(a, 0, "prefix");
            if (!p || (p->k != V_STR && p->k != V_LIST)) fail(c, pos, "%s takes a string or a tuple of strings", what);
            const List one = {(Value *)p, 1, 0}, *l = p->k == V_LIST ? p->l : &one;
            const int ends = m.s[0] == 'e';
            for (size_t i = 0; i < l->n; i++) {
                if (l->v[i].k != V_STR) fail(c, pos, "%s takes a string or a tuple of strings", what);
                const Str x = l->v[i].s;
                if (x.n <= s.n && !memcmp(s.s + (ends ? s.n - x.n : 0), x.s, x.n)) return v_bool(1);
            }
            return v_bool(0);
        }
        if (str_eq(m, "strip") || str_eq(m, "lstrip") || str_eq(m, "rstrip")) {
            check_args(c, a, 1, NULL, what, pos);
            return v_str(strip(c, s, arg(a, 0, "chars"), m.s[0] != 'r', m.s[0] != 'l', pos));
        }
        if (str_eq(m, "split")) {
            static const char *const kws[] = {"sep", "maxsplit", NULL};
            check_args(c, a, 2, kws, what, pos);
            const Value *sep = arg(a, 0, "sep");
            if (sep && sep->k != V_STR && sep->k != V_NONE) fail(c, pos, "%s: sep must be a string or none", what);
            return split(c, s, sep, arg_int(c, a, 1, "maxsplit", -1, what, pos), pos);
        }
        if (str_eq(m, "replace")) {
            check_args(c, a, 3, NULL, what, pos);
            return v_str(replace(c, s, arg_str(c, a, 0, "old", what, pos), arg_str(c, a, 1, "new", what, pos),
                                 arg_int(c, a, 2, "count", -1, what, pos)));
        }
        if (str_eq(m, "upper") || str_eq(m, "lower") || str_eq(m, "capitalize")) {
            check_args(c, a, 0, NULL, what, pos);
            return v_str(change_case(c, s, m.s[0] == 'u' ? 1 : m.s[0] == 'l' ? 0 : 2));
        }
        if (str_eq(m, "join")) {
            check_args(c, a, 1, NULL, what, pos);
            if (!a->n) fail(c, pos, "%s takes one argument", what);
            const List *l = iterate(c, a->v[0], pos);
            Buf b = {0};
            put(c, &b, "", 0);
            for (size_t i = 0; i < l->n; i++) {
                if (l->v[i].k != V_STR) fail(c, pos, "%s: item %zu is %s, not a string", what, i, type_name(l->v[i]));
                if (i) put(c, &b, s.s, s.n);
                put(c, &b, l->v[i].s.s, l->v[i].s.n);
            }
            return v_str(buf_str(&b));
        }
    } else if (o.k == V_DICT || o.k == V_NS) {
        const Dict *d = o.d;
        if (str_eq(m, "get")) {
            check_args(c, a, 2, NULL, what, pos);
            const Value *k = arg(a, 0, "key"), *dflt = arg(a, 1, "default");
            const Value *v = k && k->k == V_STR ? dict_get(d, k->s) : NULL;
            return v ? *v : dflt ? *dflt : v_none();
        }
        if (str_eq(m, "items") || str_eq(m, "keys") || str_eq(m, "values")) {
            check_args(c, a, 0, NULL, what, pos);
            Value r = v_list(c, d->n);
            for (size_t i = 0; i < d->n; i++) {
                if (m.s[0] == 'k') r.l->v[i] = v_str(d->key[i]);
                else if (m.s[0] == 'v') r.l->v[i] = d->val[i];
                else {
                    Value pair = v_list(c, 2);
                    pair.l->tuple = 1, pair.l->v[0] = v_str(d->key[i]), pair.l->v[1] = d->val[i];
                    r.l->v[i] = pair;
                }
            }
            return r;
        }
    } else if (o.k == V_FUNC && o.fn == FN_DICT && str_eq(m, "fromkeys")) {  // dict.fromkeys(keys[, value])
        snprintf(what, sizeof what, "dict.fromkeys()");
        check_args(c, a, 2, NULL, what, pos);
        if (!a->n) fail(c, pos, "%s takes 1 or 2 arguments", what);
        const List *l = iterate(c, a->v[0], pos);
        Value r = v_dict(c, V_DICT);
        for (size_t i = 0; i < l->n; i++) {
            if (l->v[i].k != V_STR) fail(c, pos, "%s: keys must be strings in this renderer, not %s", what, type_name(l->v[i]));
            dict_set(c, r.d, l->v[i].s, a->n > 1 ? a->v[1] : v_none());
        }
        return r;
    }
    fail(c, pos, "%s is not a method this renderer has", what);
}

static Value call_macro(Ctx *c, const struct MacroDef *m, const Args *a, size_t pos);

static Value call(Ctx *c, const Expr *e) {
    Args a = {0};
    if (e->a->k == E_ATTR) {  // obj.method(...), or a macro or function kept in a namespace or dict
        const Value o = eval(c, e->a->a);
        const Value *f = o.k == V_NS || o.k == V_DICT ? dict_get(o.d, e->a->name) : NULL;
        eval_args(c, e, &a);
        if (f && f->k == V_MACRO) return call_macro(c, f->mac, &a, e->pos);
        if (f && f->k == V_FUNC) return call_builtin(c, f->fn, &a, e->pos);
        return call_method(c, o, e->a->name, &a, e->pos);
    }
    const Value f = eval(c, e->a);
    need_defined(c, f, e->a->pos);
    if (f.k != V_FUNC && f.k != V_MACRO) fail(c, e->pos, "'%s' object is not callable", type_name(f));
    eval_args(c, e, &a);
    return f.k == V_MACRO ? call_macro(c, f.mac, &a, e->pos) : call_builtin(c, f.fn, &a, e->pos);
}

static int apply_test(Ctx *c, Str t, Value v, const Args *a, size_t pos);
static Value apply_filter(Ctx *c, Str f, const Args *a, size_t pos);

// select / reject (items passing a test, or true), selectattr / rejectattr (items whose attribute
// passes it): Jinja's generators, as lists.
static Value select_items(Ctx *c, Str f, const Args *a, size_t pos, const char *what) {
    if (!truthy(a->v[0])) return v_list(c, 0);  // Jinja selects nothing from a false value (none, '', [])
    const int attr = f.n > 4 && !memcmp(f.s + f.n - 4, "attr", 4), keep = f.s[0] == 's', first = attr ? 2 : 1;
    const Value *name = attr ? arg(a, 1, "attribute") : NULL, *t = arg(a, first, "test");
    if (attr && (!name || name->k != V_STR)) fail(c, pos, "%s: the attribute must be a string", what);
    if (t && t->k != V_STR) fail(c, pos, "%s: the test must be named by a string", what);
    Args targs = {0};  // the test's own arguments
    for (int i = first + 1; i < a->n; i++) targs.v[targs.n] = a->v[i], targs.kw[targs.n++] = a->kw[i];
    const List *l = iterate(c, a->v[0], pos);
    Value r = v_list(c, l->n);
    r.l->n = 0;
    for (size_t i = 0; i < l->n; i++) {
        const Value x = attr ? get_attr(c, l->v[i], name->s, pos) : l->v[i];
        if ((t ? apply_test(c, t->s, x, &targs, pos) : truthy(x)) == keep) r.l->v[r.l->n++] = l->v[i];
    }
    return r;
}

// map(attribute='name'), or map('filter', args...): each item through it.
static Value map_items(Ctx *c, const Args *a, size_t pos, const char *what) {
    if (!truthy(a->v[0])) return v_list(c, 0);  // Jinja maps nothing over a false value (none, '', [])
    const Value *attr = arg(a, 99, "attribute"), *dflt = arg(a, 99, "default");
    const List *l = iterate(c, a->v[0], pos);
    Value r = v_list(c, l->n);
    if (!attr && (a->n < 2 || a->v[1].k != V_STR)) fail(c, pos, "%s: needs attribute='name' or the name of a filter", what);
    for (size_t i = 0; i < l->n; i++) {
        if (attr) {
            if (attr->k != V_STR) fail(c, pos, "%s: the attribute must be a string", what);
            r.l->v[i] = get_attr(c, l->v[i], attr->s, pos);
            if (r.l->v[i].k == V_UNDEF && dflt) r.l->v[i] = *dflt;
            continue;
        }
        Args fa = {0};  // the item, then the filter's arguments
        fa.v[fa.n++] = l->v[i];
        for (int k = 2; k < a->n; k++) fa.v[fa.n] = a->v[k], fa.kw[fa.n++] = a->kw[k];
        r.l->v[i] = apply_filter(c, a->v[1].s, &fa, pos);
    }
    return r;
}

static Value filter(Ctx *c, const Expr *e) {
    Args a = {0};
    eval_args(c, e, &a);  // a.v[0] is the value filtered
    return apply_filter(c, e->name, &a, e->pos);
}

// The filter f on a->v[0], with the arguments after it.
static Value apply_filter(Ctx *c, Str f, const Args *args, size_t pos) {
    const Args a = *args;
    const Value v = a.v[0];
    char what[40];
    snprintf(what, sizeof what, "filter '%.*s'", (int)f.n, f.s);
    if (str_eq(f, "default") || str_eq(f, "d")) {
        static const char *const kws[] = {"default_value", "boolean", NULL};
        check_args(c, &a, 3, kws, what, pos);
        const Value *dflt = arg(&a, 1, "default_value"), *boolean = arg(&a, 2, "boolean");
        const int use = v.k == V_UNDEF || (boolean && truthy(*boolean) && !truthy(v));
        return use ? (dflt ? *dflt : v_str(cstr(""))) : v;
    }
    if (str_eq(f, "tojson")) {
        static const char *const kws[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
        check_args(c, &a, 5, kws, what, pos);
        const Value *ascii = arg(&a, 1, "ensure_ascii"), *ind = arg(&a, 2, "indent"), *seps = arg(&a, 3, "separators"),
                    *sort = arg(&a, 4, "sort_keys");
        JsonOpts o = {.ascii = ascii && truthy(*ascii), .sort = sort && truthy(*sort)};
        if (ind && (ind->k == V_INT || ind->k == V_BOOL)) {  // a number of spaces (json.dumps: none when < 1)
            const long long k = inum(*ind) < 0 ? 0 : inum(*ind) > 1000 ? 1000 : inum(*ind);
            Buf sp = {0};
            put(c, &sp, "", 0);
            for (long long i = 0; i < k; i++) put(c, &sp, " ", 1);
            o.indent = buf_str(&sp);
        } else if (ind && ind->k == V_STR) {
            o.indent = ind->s;
        } else if (ind && ind->k != V_NONE) {
            fail(c, pos, "%s: indent must be an integer, a string or none, not %s", what, type_name(*ind));
        }
        o.item_sep = cstr(o.indent.s ? "," : ", "), o.key_sep = cstr(": ");
        if (seps && seps->k != V_NONE) {
            if (seps->k != V_LIST || seps->l->n != 2 || seps->l->v[0].k != V_STR || seps->l->v[1].k != V_STR)
                fail(c, pos, "%s: separators must be a pair of strings", what);
            o.item_sep = seps->l->v[0].s, o.key_sep = seps->l->v[1].s;
        }
        Buf b = {0};
        put(c, &b, "", 0);
        put_json(c, &b, v, &o, 0, pos);
        return v_str(buf_str(&b));
    }
    if (str_eq(f, "safe")) return check_args(c, &a, 1, NULL, what, pos), v;
    if (str_eq(f, "select") || str_eq(f, "reject") || str_eq(f, "selectattr") || str_eq(f, "rejectattr")) return select_items(c, f, &a, pos, what);
    if (str_eq(f, "map")) return map_items(c, &a, pos, what);
    if (str_eq(f, "length") || str_eq(f, "count")) return check_args(c, &a, 1, NULL, what, pos), v_int(length(c, v, pos));
    if (str_eq(f, "first") || str_eq(f, "last")) {
        check_args(c, &a, 1, NULL, what, pos);
        const List *l = iterate(c, v, pos);
        if (!l->n) return v_undef(strf(c, "no %.*s item, sequence was empty", (int)f.n, f.s));
        return l->v[f.s[0] == 'f' ? 0 : l->n - 1];
    }
    if (str_eq(f, "list") || str_eq(f, "reverse")) {
        check_args(c, &a, 1, NULL, what, pos);
        const List *l = iterate(c, v, pos);
        Value r = v_list(c, l->n);
        for (size_t i = 0; i < l->n; i++) r.l->v[i] = l->v[f.s[0] == 'l' ? i : l->n - 1 - i];
        if (v.k != V_STR || f.s[0] == 'l') return r;
        Buf b = {0};  // a reversed string is a string
        put(c, &b, "", 0);
        for (size_t i = 0; i < r.l->n; i++) put(c, &b, r.l->v[i].s.s, r.l->v[i].s.n);
        return v_str(buf_str(&b));
    }
    if (str_eq(f, "items")) {
        check_args(c, &a, 1, NULL, what, pos);
        if (v.k == V_UNDEF) return v_list(c, 0);
        if (v.k != V_DICT && v.k != V_NS) fail(c, pos, "%s: can only get item pairs from a mapping, not %s", what, type_name(v));
        const Args none = {0};
        return call_method(c, (Value){.k = V_DICT, .d = v.d}, cstr("items"), &none, pos);
    }
    if (str_eq(f, "join")) {
        check_args(c, &a, 2, NULL, what, pos);
        const Value *sep = arg(&a, 1, "d");
        const Str d = sep ? to_str(c, *sep) : cstr("");
        const List *l = iterate(c, v, pos);
        Buf b = {0};
        put(c, &b, "", 0);
        for (size_t i = 0; i < l->n; i++) {
            if (i) put(c, &b, d.s, d.n);
            const Str s = to_str(c, l->v[i]);
            put(c, &b, s.s, s.n);
        }
        return v_str(buf_str(&b));
    }
    if (str_eq(f, "int") || str_eq(f, "float")) {
        check_args(c, &a, 2, NULL, what, pos);
        const Value *dflt = arg(&a, 1, "default");
        need_defined(c, v, pos);
        double x = 0;
        int ok = is_num(v);
        if (ok) x = num(v);
        else if (v.k == V_STR) {
            char t[64], *end;
            snprintf(t, sizeof t, "%.*s", (int)(v.s.n < 63 ? v.s.n : 63), v.s.s);
            x = strtod(t, &end);
            ok = end != t && strip(c, cstr(end), NULL, 1, 1, pos).n == 0;
        }
        if (f.s[0] == 'f') return ok ? v_float(x) : dflt ? *dflt : v_float(0);
        if (v.k == V_INT) return v;
        return ok && fabs(x) < 9e18 ? v_int((long long)x) : dflt ? *dflt : v_int(0);
    }
    // the rest work on the value as a string
    const Str s = to_str(c, v);
    if (str_eq(f, "trim")) return check_args(c, &a, 2, NULL, what, pos), v_str(strip(c, s, arg(&a, 1, "chars"), 1, 1, pos));
    if (str_eq(f, "upper") || str_eq(f, "lower") || str_eq(f, "capitalize"))
        return check_args(c, &a, 1, NULL, what, pos), v_str(change_case(c, s, f.s[0] == 'u' ? 1 : f.s[0] == 'l' ? 0 : 2));
    if (str_eq(f, "string")) return check_args(c, &a, 1, NULL, what, pos), v_str(s);
    if (str_eq(f, "replace")) {  // replace(old, new[, count])
        check_args(c, &a, 4, NULL, what, pos);
        return v_str(replace(c, s, to_str(c, a.n > 1 ? a.v[1] : v_str(cstr(""))), to_str(c, a.n > 2 ? a.v[2] : v_str(cstr(""))),
                             arg_int(c, &a, 3, "count", -1, what, pos)));
    }
    fail(c, pos, "no filter named '%.*s' in this renderer", (int)f.n, f.s);
}

// The test t on v with its arguments a (at most one: x is divisibleby 3, x is eq(y)).
static int apply_test(Ctx *c, Str t, Value v, const Args *a, size_t pos) {
    static const char *const one_arg[] = {"divisibleby", "eq", "equalto", "==", "ne", "!=", "sameas", "in", NULL};
    int nargs = 0;
    for (int i = 0; one_arg[i]; i++) nargs |= str_eq(t, one_arg[i]);
    if (a->n != nargs) fail(c, pos, "test '%.*s' takes %d argument(s), not %d", (int)t.n, t.s, nargs, a->n);
    const Value x = nargs ? a->v[0] : v_none();
    if (str_eq(t, "defined")) return v.k != V_UNDEF;
    if (str_eq(t, "undefined")) return v.k == V_UNDEF;
    if (str_eq(t, "none")) return v.k == V_NONE;
    if (str_eq(t, "string")) return v.k == V_STR;
    if (str_eq(t, "mapping")) return v.k == V_DICT;
    if (str_eq(t, "iterable")) return v.k == V_STR || v.k == V_LIST || v.k == V_DICT || v.k == V_UNDEF;
    if (str_eq(t, "sequence")) return v.k == V_STR || v.k == V_LIST || v.k == V_DICT || v.k == V_UNDEF;
    if (str_eq(t, "number")) return is_num(v);
    if (str_eq(t, "integer")) return v.k == V_INT;
    if (str_eq(t, "float")) return v.k == V_FLOAT;
    if (str_eq(t, "boolean")) return v.k == V_BOOL;
    if (str_eq(t, "true")) return v.k == V_BOOL && v.b;
    if (str_eq(t, "false")) return v.k == V_BOOL && !v.b;
    if (str_eq(t, "eq") || str_eq(t, "equalto") || str_eq(t, "==")) return equal(v, x);
    if (str_eq(t, "ne") || str_eq(t, "!=")) return !equal(v, x);
    if (str_eq(t, "sameas")) return v.k == x.k && (v.k == V_NONE || (v.k == V_BOOL && v.b == x.b));  // `is` for none, true, false
    if (str_eq(t, "in")) return contains(c, x, v, pos);
    if (!str_eq(t, "odd") && !str_eq(t, "even") && !str_eq(t, "divisibleby"))
        fail(c, pos, "no test named '%.*s' in this renderer", (int)t.n, t.s);
    // odd, even, divisibleby: Python's value % n
    const Value n = str_eq(t, "divisibleby") ? x : v_int(2);
    if (!is_num(v) || !is_num(n)) fail(c, pos, "test '%.*s' needs numbers, not %s", (int)t.n, t.s, type_name(is_num(v) ? n : v));
    const Value r = arith(c, cstr("%"), v, n, pos);
    return str_eq(t, "odd") ? num(r) == 1 : num(r) == 0;
}

static int test(Ctx *c, const Expr *e) {
    const Value v = eval(c, e->a);
    Args a = {0};
    eval_args(c, e, &a);
    return apply_test(c, e->name, v, &a, e->pos);
}

// ---------------------------------------------------------------- render: expressions and statements

static Value eval(Ctx *c, const Expr *e) {
    switch (e->k) {
    case E_LIT: return e->lit;
    case E_NAME: {
        const Value *v = lookup(c->scope, e->name);
        return v ? *v : v_undef(strf(c, "'%.*s' is undefined", (int)e->name.n, e->name.s));
    }
    case E_LIST: {
        Value r = v_list(c, (size_t)e->nargs);
        r.l->tuple = e->negate;
        for (int i = 0; i < e->nargs; i++) r.l->v[i] = eval(c, e->args[i]);
        return r;
    }
    case E_DICT: {
        Value r = v_dict(c, V_DICT);
        for (int i = 0; i < e->nargs; i += 2) {
            const Value k = eval(c, e->args[i]);
            if (k.k != V_STR) fail(c, e->args[i]->pos, "dict keys must be strings in this renderer, not %s", type_name(k));
            dict_set(c, r.d, k.s, eval(c, e->args[i + 1]));
        }
        return r;
    }
    case E_ATTR: return get_attr(c, eval(c, e->a), e->name, e->pos);
    case E_INDEX: return get_item(c, eval(c, e->a), eval(c, e->b), e->pos);
    case E_SLICE: {
        const Value o = eval(c, e->a);
        Value part[3];
        for (int i = 0; i < 3; i++) part[i] = e->args[i] ? eval(c, e->args[i]) : v_none();
        return get_slice(c, o, part[0], part[1], part[2], e->pos);
    }
    case E_CALL: return call(c, e);
    case E_FILTER: return filter(c, e);
    case E_TEST: return v_bool(test(c, e) != e->negate);
    case E_NEG: {
        const Value v = eval(c, e->a);
        if (!is_num(v)) fail(c, e->pos, "bad operand type for unary %c: '%s'", e->negate ? '+' : '-', type_name(v));
        if (e->negate) return v.k == V_BOOL ? v_int(v.b) : v;
        if (v.k == V_FLOAT) return v_float(-v.f);
        if (inum(v) == LLONG_MIN) fail(c, e->pos, "integer overflow");
        return v_int(-inum(v));
    }
    case E_NOT: return v_bool(!truthy(eval(c, e->a)));
    case E_AND: {
        const Value a = eval(c, e->a);
        return truthy(a) ? eval(c, e->b) : a;
    }
    case E_OR: {
        const Value a = eval(c, e->a);
        return truthy(a) ? a : eval(c, e->b);
    }
    case E_BIN: return arith(c, e->name, eval(c, e->a), eval(c, e->b), e->pos);
    case E_CMP: {  // a < b < c is a < b and b < c
        Value a = eval(c, e->a);
        for (int i = 0; i < e->nargs; i++) {
            const Value b = eval(c, e->args[i]);
            const Str op = e->kw[i];
            int r;
            if (str_eq(op, "==")) r = equal(a, b);
            else if (str_eq(op, "!=")) r = !equal(a, b);
            else if (str_eq(op, "in")) r = contains(c, b, a, e->args[i]->pos);
            else if (str_eq(op, "not in")) r = !contains(c, b, a, e->args[i]->pos);
            else {
                const int k = compare(c, op, a, b, e->args[i]->pos);
                r = op.s[0] == '<' ? (op.n == 2 ? k <= 0 : k < 0) : (op.n == 2 ? k >= 0 : k > 0);
            }
            if (!r) return v_bool(0);
            a = b;
        }
        return v_bool(1);
    }
    case E_COND:
        if (truthy(eval(c, e->b))) return eval(c, e->a);
        return e->c ? eval(c, e->c) : v_undef(cstr("the if expression had no else"));
    }
    fail(c, e->pos, "unknown expression");
}

static void output(Ctx *c, Str s) {
    put(c, &c->out, s.s, s.n);
    if (c->out.n > MAX_OUTPUT) fail(c, (size_t)-1, "the output is larger than %d MiB", MAX_OUTPUT >> 20);
}

static void exec(Ctx *c, const Stmt *s);

static void bind_loop_vars(Ctx *c, Scope *sc, const Stmt *s, Value item) {
    if (s->nvars == 1) return assign(c, sc, s->var[0], item);
    if (item.k != V_LIST || item.l->n != 2) fail(c, s->pos, "cannot unpack %s into 2 loop variables", type_name(item));
    assign(c, sc, s->var[0], item.l->v[0]), assign(c, sc, s->var[1], item.l->v[1]);
}

static void exec_for(Ctx *c, const Stmt *s) {
    const List *items = iterate(c, eval(c, s->e), s->e->pos);
    Scope *sc = alloc(c, sizeof *sc);  // in the arena: a macro defined in the loop may outlive it (in a namespace)
    sc->up = c->scope;
    c->scope = sc;
    if (s->cond) {  // `for x in xs if cond`: the items that pass, before loop.length is known
        List *kept = v_list(c, items->n).l;
        kept->n = 0;
        for (size_t i = 0; i < items->n; i++) {
            sc->vars.n = 0;
            bind_loop_vars(c, sc, s, items->v[i]);
            if (truthy(eval(c, s->cond))) kept->v[kept->n++] = items->v[i];
        }
        items = kept;
    }
    Loop *loop = alloc(c, sizeof *loop);  // not on the stack: a namespace may keep `loop`
    loop->length = (long)items->n, loop->items = items;
    for (size_t i = 0; i < items->n; i++) {
        sc->vars.n = 0;  // a fresh scope for each iteration
        loop->index0 = (long)i;
        bind_loop_vars(c, sc, s, items->v[i]);
        assign(c, sc, cstr("loop"), (Value){.k = V_LOOP, .loop = loop});
        exec(c, s->body);
        const int ctl = c->ctl;
        c->ctl = 0;
        if (ctl == 1) break;
    }
    c->scope = sc->up;
    if (!items->n && s->orelse) exec(c, s->orelse);
}

// The text statements render, into a buffer of their own (a block set's value; a macro call's).
static Str capture(Ctx *c, const Stmt *body) {
    const Buf saved = c->out;
    c->out = (Buf){0};
    exec(c, body);
    const Str r = buf_str(&c->out);
    c->out = saved;
    return r;
}

static void exec(Ctx *c, const Stmt *s) {
    for (; s && !c->ctl; s = s->next) {
        switch (s->k) {
        case S_TEXT: output(c, s->text); break;
        case S_OUT: output(c, to_str(c, eval(c, s->e))); break;
        case S_IF: exec(c, truthy(eval(c, s->e)) ? s->body : s->orelse); break;
        case S_FOR: exec_for(c, s); break;
        case S_SET: {
            const Value v = s->body ? v_str(capture(c, s->body)) : eval(c, s->e);
            if (s->nvars == 1) {
                assign(c, c->scope, s->var[0], v);
                break;
            }
            const Value *ns = lookup(c->scope, s->var[0]);
            if (!ns || ns->k != V_NS) fail(c, s->pos, "cannot assign attribute on non-namespace object");
            ns_name_ok(c, s->var[1], s->pos);
            dict_set(c, ns->d, s->var[1], v);
            break;
        }
        case S_BREAK: c->ctl = 1; break;
        case S_CONTINUE: c->ctl = 2; break;
        case S_BLOCK: exec(c, s->body); break;
        case S_MACRO: {
            struct MacroDef *m = alloc(c, sizeof *m);
            m->def = s, m->scope = c->scope;
            assign(c, c->scope, s->var[0], (Value){.k = V_MACRO, .mac = m});
            break;
        }
        }
    }
}

// A macro call: its parameters bound (positional, then by name, then the defaults, evaluated in
// the call's scope in order so that a default may use the parameters before it; one missing with
// no default is undefined, as in Jinja) in a scope above the one the macro was defined in; the
// body rendered into a buffer of its own, which is the call's value.
static Value call_macro(Ctx *c, const struct MacroDef *m, const Args *a, size_t pos) {
    const Stmt *d = m->def;
    const Str name = d->var[0];
    Value bound[MAX_ARGS];
    int have[MAX_ARGS] = {0};
    for (int k = 0, npos = 0; k < a->n; k++) {
        int i = -1;
        if (!a->kw[k].n) {
            if ((i = npos++) >= d->nvars)
                fail(c, pos, "macro '%.*s' takes not more than %d argument(s)", (int)name.n, name.s, d->nvars);
        } else {
            for (int j = 0; j < d->nvars; j++)
                if (str_same(d->params[j], a->kw[k])) i = j;
            if (i < 0) fail(c, pos, "macro '%.*s' takes no keyword argument '%.*s'", (int)name.n, name.s, (int)a->kw[k].n, a->kw[k].s);
            if (have[i]) fail(c, pos, "macro '%.*s' got multiple values for argument '%.*s'", (int)name.n, name.s, (int)a->kw[k].n, a->kw[k].s);
        }
        bound[i] = a->v[k], have[i] = 1;
    }
    if (++c->calls > MAX_DEPTH) fail(c, pos, "macro calls nested more than %d deep", MAX_DEPTH);
    Scope *sc = alloc(c, sizeof *sc), *const saved_scope = c->scope;  // in the arena, as a loop's
    sc->up = m->scope;
    const int saved_ctl = c->ctl;
    c->scope = sc, c->ctl = 0;
    for (int i = 0; i < d->nvars; i++) {
        if (!have[i] && d->defaults[i]) bound[i] = eval(c, d->defaults[i]);
        else if (!have[i]) bound[i] = v_undef(strf(c, "'%.*s' is undefined", (int)d->params[i].n, d->params[i].s));
        assign(c, sc, d->params[i], bound[i]);
    }
    const Str r = capture(c, d->body);
    c->scope = saved_scope, c->ctl = saved_ctl;
    c->calls--;
    return v_str(r);
}

// ---------------------------------------------------------------- the API

static void free_arena(Ctx *c) {
    for (Chunk *k = c->arena, *next; k; k = next) next = k->next, free(k);
    c->arena = NULL;
}

typedef struct {
    const char *tmpl;
    const ChatMessage *msgs;
    int n, add_generation_prompt;
    const char *bos_token, *eos_token;
} Input;

// Lex, parse and run the template: the text in c->out. An error longjmps out of it.
static void render(Ctx *c, const Input *in) {
    if (!in->tmpl) fail(c, (size_t)-1, "no template");
    if (in->n < 0 || (in->n > 0 && !in->msgs)) fail(c, (size_t)-1, "no messages");
    // Newlines as Jinja reads them: \r\n and \r become \n, and one newline at the very end goes.
    const char *t = in->tmpl;
    const size_t len = strlen(t);
    char *src = alloc(c, len + 1);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (t[i] == '\r' && t[i + 1] == '\n') i++;
        src[k++] = t[i] == '\r' ? '\n' : t[i];
    }
    if (k && src[k - 1] == '\n') k--;
    src[k] = 0;
    c->src = src, c->n = k;
    lex(c);
    int which;
    const Stmt *prog = parse_body(c, NULL, &which, NULL, 0);

    // The variables transformers passes: messages, tools and documents (None without any),
    // add_generation_prompt, the special tokens; and the globals: Jinja's range and namespace,
    // transformers' raise_exception and strftime_now.
    Scope root = {0};
    c->scope = &root;
    Value ms = v_list(c, (size_t)in->n);
    for (int i = 0; i < in->n; i++) {
        const ChatMessage *m = &in->msgs[i];
        Value d = v_dict(c, V_DICT);
        // transformers (5.x) drops a message's keys whose value is None: NULL is an absent key
        if (m->role) dict_set(c, d.d, cstr("role"), v_str(cstr(m->role)));
        if (m->content) dict_set(c, d.d, cstr("content"), v_str(cstr(m->content)));
        ms.l->v[i] = d;
    }
    assign(c, &root, cstr("messages"), ms);
    assign(c, &root, cstr("tools"), v_none());
    assign(c, &root, cstr("documents"), v_none());
    assign(c, &root, cstr("add_generation_prompt"), v_bool(in->add_generation_prompt));
    if (in->bos_token) assign(c, &root, cstr("bos_token"), v_str(cstr(in->bos_token)));
    if (in->eos_token) assign(c, &root, cstr("eos_token"), v_str(cstr(in->eos_token)));
    assign(c, &root, cstr("range"), (Value){.k = V_FUNC, .fn = FN_RANGE});
    assign(c, &root, cstr("namespace"), (Value){.k = V_FUNC, .fn = FN_NAMESPACE});
    assign(c, &root, cstr("raise_exception"), (Value){.k = V_FUNC, .fn = FN_RAISE});
    assign(c, &root, cstr("strftime_now"), (Value){.k = V_FUNC, .fn = FN_STRFTIME});
    assign(c, &root, cstr("dict"), (Value){.k = V_FUNC, .fn = FN_DICT});
    put(c, &c->out, "", 0);
    exec(c, prog);
    c->scope = NULL;
}

// render() with its errors caught: 0, or -1 with the message in c->msg. The setjmp has a function
// of its own so that nothing of the caller's lives across the longjmp.
static int render_caught(Ctx *c, const Input *in) {
    if (setjmp(c->jb)) return -1;
    render(c, in);
    return 0;
}

char *chat_template_render(const char *tmpl, const ChatMessage *msgs, int n, int add_generation_prompt,
                           const char *bos_token, const char *eos_token, char *err, size_t errlen) {
    const Input in = {tmpl, msgs, n, add_generation_prompt, bos_token, eos_token};
    Ctx *c = calloc(1, sizeof *c);
    char *text = NULL;
    const char *msg = !c ? "out of memory" : render_caught(c, &in) ? c->msg : !(text = malloc(c->out.n + 1)) ? "out of memory" : NULL;
    if (text) memcpy(text, c->out.s, c->out.n + 1);
    else if (err && errlen) snprintf(err, errlen, "%s", msg);
    if (c) free_arena(c);
    free(c);
    return text;
}

// ---------------------------------------------------------------- loading tokenizer_config.json

static char *read_file(const char *path) {  // NULL with errno set when it cannot be read
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, k;
    do {
        if (n + 4096 + 1 > cap) {
            cap = 2 * (n + 4096 + 1);
            char *b = realloc(buf, cap);
            if (!b) {
                free(buf), fclose(f);
                return errno = ENOMEM, NULL;
            }
            buf = b;
        }
        k = fread(buf + n, 1, 4096, f);
        n += k;
    } while (k == 4096);
    const int bad = ferror(f);
    fclose(f);
    if (bad) return free(buf), errno = EIO, NULL;
    buf[n] = 0;
    if (strlen(buf) != n) return free(buf), errno = EILSEQ, NULL;  // a NUL byte: not a text file
    return buf;
}

static char *dup_str(const char *s) {
    char *d = malloc(strlen(s) + 1);
    return d ? strcpy(d, s) : NULL;
}

// "bos_token": "<s>" or {"content": "<s>", ...} (an AddedToken as transformers saves it), or absent.
static int config_token(json_t *root, const char *key, char **out, const char *src, char *err, size_t errlen) {
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) {
        snprintf(err, errlen, "%s: \"%s\" is neither a string nor an object with a string \"content\"", src, key);
        return -1;
    }
    return (*out = dup_str(json_string_value(v))) ? 0 : -1;
}

// require: the file must have a template (there is no chat_template.jinja beside it).
static int parse_config(const char *json_text, const char *src, ChatTemplate *ct, int require, char *err, size_t errlen) {
    memset(ct, 0, sizeof *ct);
    snprintf(ct->source, sizeof ct->source, "%s", src);
    json_error_t je;
    json_t *root = json_loads(json_text, 0, &je);
    if (!root) return snprintf(err, errlen, "%s: invalid JSON at line %d: %s", src, je.line, je.text), -1;
    int rc = -1;
    const char *text = NULL;
    json_t *t = json_object_get(root, "chat_template");
    if (!json_is_object(root)) {
        snprintf(err, errlen, "%s: the top level is not a JSON object", src);
        goto done;
    }
    if (json_is_string(t)) {
        text = json_string_value(t);
    } else if (json_is_array(t)) {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        char names[256] = "";
        for (size_t i = 0; i < json_array_size(t); i++) {
            json_t *e = json_array_get(t, i), *name = json_object_get(e, "name"), *tt = json_object_get(e, "template");
            if (!json_is_string(name) || !json_is_string(tt)) {
                snprintf(err, errlen, "%s: \"chat_template\" item %zu is not {\"name\": ..., \"template\": ...}", src, i);
                goto done;
            }
            if (!strcmp(json_string_value(name), "default")) text = json_string_value(tt);
            const size_t k = strlen(names);
            snprintf(names + k, sizeof names - k, "%s%s", k ? ", " : "", json_string_value(name));
        }
        if (!text) {
            snprintf(err, errlen, "%s: \"chat_template\" lists templates named %s but none named \"default\"", src, names[0] ? names : "(none)");
            goto done;
        }
    } else if (t && !json_is_null(t)) {
        snprintf(err, errlen, "%s: \"chat_template\" is neither a string nor a list of named templates", src);
        goto done;
    } else if (require) {
        snprintf(err, errlen, "%s has no \"chat_template\" (and there is no chat_template.jinja beside it): the model has no chat template", src);
        goto done;
    }
    if (text && !(ct->text = dup_str(text))) goto done;
    if (config_token(root, "bos_token", &ct->bos_token, src, err, errlen) || config_token(root, "eos_token", &ct->eos_token, src, err, errlen))
        goto done;
    rc = 0;
done:
    json_decref(root);
    if (rc) chat_template_free(ct);
    return rc;
}

int chat_template_parse_config(const char *json_text, const char *src, ChatTemplate *ct, char *err, size_t errlen) {
    return parse_config(json_text, src, ct, 1, err, errlen);
}

int chat_template_load(const char *path, ChatTemplate *ct, char *err, size_t errlen) {
    memset(ct, 0, sizeof *ct);
    struct stat st;
    const int dir = stat(path, &st) == 0 && S_ISDIR(st.st_mode);
    char cfg[1100], jinja[1100] = "";
    if (dir) {
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", path);
        snprintf(jinja, sizeof jinja, "%s/chat_template.jinja", path);
    } else {
        snprintf(cfg, sizeof cfg, "%s", path);
    }
    char *jtext = dir ? read_file(jinja) : NULL;
    if (!jtext && dir && errno != ENOENT) return snprintf(err, errlen, "%s: cannot read (%s)", jinja, strerror(errno)), -1;
    char *ctext = read_file(cfg);
    if (!ctext && (errno != ENOENT || !jtext)) {
        snprintf(err, errlen, "%s: cannot read (%s)%s", cfg, strerror(errno),
                 dir && errno == ENOENT ? ", and there is no chat_template.jinja beside it: the model has no chat template" : "");
        free(jtext);
        return -1;
    }
    int rc = 0;
    if (ctext) rc = parse_config(ctext, cfg, ct, jtext == NULL, err, errlen);
    free(ctext);
    if (rc == 0 && jtext) {
        free(ct->text);
        ct->text = jtext, jtext = NULL;
        snprintf(ct->source, sizeof ct->source, "%s", jinja);
    }
    free(jtext);
    return rc;
}

void chat_template_free(ChatTemplate *ct) {
    free(ct->text), free(ct->bos_token), free(ct->eos_token);
    ct->text = ct->bos_token = ct->eos_token = NULL;
}
