// ckpt.c — see ckpt.h: write a checkpoint atomically, find the newest complete one, load it with
// every check, prune old ones, and the synchronous / asynchronous periodic writer.
#define _GNU_SOURCE
#include "step08_ddp/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "check.h"
#include "safetensors.h"
#include "timer.h"

static const char *const FILES[2] = {"model.safetensors", "optimizer.safetensors"};
static const char *const OPT_PREFIX[2] = {"exp_avg.", "exp_avg_sq."};

int ckpt_kv_set(CkptKV *kv, int n, const char *key, const char *fmt, ...) {
    int i = 0;
    while (i < n && strcmp(kv[i].key, key)) i++;
    if (i == n) {
        if (n == CKPT_MAX_KV) die("ckpt_kv_set: more than %d run options", CKPT_MAX_KV);
        snprintf(kv[i].key, sizeof kv[i].key, "%s", key);
        n++;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(kv[i].val, sizeof kv[i].val, fmt, ap);
    va_end(ap);
    return n;
}

void ckpt_step_dir_name(long step, char *buf, size_t n) { snprintf(buf, n, "step-%06ld", step); }

// ---------------------------------------------------------------- small file helpers

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}
static int rmtree(const char *dir) { return nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static int fsync_path(const char *path) {
    const int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    const int rc = fsync(fd);
    close(fd);
    return rc;
}

// Size and xxHash64 of a whole file, read in 1 MiB pieces. 0, or -1 + err.
static int file_hash(const char *path, uint64_t *bytes, uint64_t *hash, char *err, int errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) return errf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    XXH64_state_t *h = XXH64_createState();
    if (!h) die("XXH64_createState: out of memory");
    XXH64_reset(h, 0);
    const size_t cap = 1 << 20;
    char *buf = xmalloc(cap);
    uint64_t total = 0;
    size_t got;
    while ((got = fread(buf, 1, cap, f)) > 0) XXH64_update(h, buf, got), total += got;
    const int bad = ferror(f);
    fclose(f);
    free(buf);
    *bytes = total, *hash = XXH64_digest(h);
    XXH64_freeState(h);
    if (bad) return errf(err, errlen, "%s: read error", path);
    return 0;
}

static int is_step_dir(const char *name, long *step) {
    int end = 0;
    long s;
    if (strncmp(name, "step-", 5) || sscanf(name, "step-%ld%n", &s, &end) != 1 || name[end] || s < 0) return 0;
    for (const char *p = name + 5; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    *step = s;
    return 1;
}

static int has_done(const char *dir, const char *name) {
    char p[2048];
    snprintf(p, sizeof p, "%s/%s/DONE", dir, name);
    return access(p, F_OK) == 0;
}

// The complete checkpoints of dir, newest first (malloc'ed, *n of them; NULL + 0 when none).
static long *complete_steps(const char *dir, int *n) {
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    long *v = NULL;
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s;
        if (!is_step_dir(e->d_name, &s) || !has_done(dir, e->d_name)) continue;
        if (*n == cap) cap = cap ? 2 * cap : 16, v = realloc(v, (size_t)cap * sizeof *v);
        if (!v) die("out of memory listing %s", dir);
        v[(*n)++] = s;
    }
    closedir(d);
    for (int i = 1; i < *n; i++)  // insertion sort, descending
        for (int j = i; j > 0 && v[j] > v[j - 1]; j--) {
            const long t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return v;
}

int ckpt_latest(const char *dir, char *path, size_t n) {
    int cnt;
    long *v = complete_steps(dir, &cnt);
    if (!cnt) return free(v), 0;
    char name[64];
    ckpt_step_dir_name(v[0], name, sizeof name);
    snprintf(path, n, "%s/%s", dir, name);
    free(v);
    return 1;
}

int ckpt_incomplete_after(const char *dir, long step, char *names, size_t n) {
    if (n) names[0] = 0;
    DIR *d = opendir(dir);
    if (!d) return 0;
    long found[64];
    int cnt = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long s;
        if (is_step_dir(e->d_name, &s) && s > step && !has_done(dir, e->d_name) && cnt < 64) found[cnt++] = s;
    }
    closedir(d);
    for (int i = 1; i < cnt; i++)  // descending
        for (int j = i; j > 0 && found[j] > found[j - 1]; j--) {
            const long t = found[j];
            found[j] = found[j - 1], found[j - 1] = t;
        }
    size_t k = 0;
    for (int i = 0; i < cnt && n; i++) {
        char nm[64];
        ckpt_step_dir_name(found[i], nm, sizeof nm);
        const int w = snprintf(names + k, n - k, "%s%s", i ? " " : "", nm);
        if (w < 0 || (size_t)w >= n - k) break;
        k += (size_t)w;
    }
    return cnt;
}

int ckpt_prune(const char *dir, int keep, char *err, int errlen) {
    if (keep <= 0) return 0;
    int cnt;
    long *v = complete_steps(dir, &cnt);
    for (int i = keep; i < cnt; i++) {
        char name[64], p[2048];
        ckpt_step_dir_name(v[i], name, sizeof name);
        snprintf(p, sizeof p, "%s/%s/DONE", dir, name);
        // DONE first: a prune interrupted half way leaves an incomplete directory, never a
        // "complete" one with files missing.
        if (unlink(p)) {
            free(v);
            return errf(err, errlen, "%s: cannot delete: %s", p, strerror(errno));
        }
        snprintf(p, sizeof p, "%s/%s", dir, name);
        if (rmtree(p)) {
            free(v);
            return errf(err, errlen, "%s: cannot delete: %s", p, strerror(errno));
        }
    }
    free(v);
    return 0;
}

// ---------------------------------------------------------------- write

static json_t *model_json(const TrainModel *m) {
    const ModelConfig *c = &m->cfg;
    return json_pack("{s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:I, s:i}", "arch",
                     model_arch_name(c->arch), "hidden", c->hidden, "intermediate", c->intermediate, "n_layers",
                     c->n_layers, "n_heads", c->n_heads, "n_kv_heads", c->n_kv_heads, "head_dim", c->head_dim,
                     "vocab", c->vocab, "tie_embeddings", c->tie_embeddings, "qkv_bias", c->qkv_bias, "o_bias",
                     c->o_bias, "qk_norm", c->qk_norm, "rope_theta", c->rope_theta, "rms_eps", (double)c->rms_eps,
                     "n_params", (json_int_t)m->n_params, "n_tensors", m->n_tensors);
}

static void tensor_shape(const TrainTensor *t, StWriteTensor *w) {
    w->dtype = ST_F32;
    if (t->rows == 1) w->ndim = 1, w->shape[0] = t->cols;
    else w->ndim = 2, w->shape[0] = t->rows, w->shape[1] = t->cols;
}

int ckpt_write_dir(const char *dir, const CkptSnapshot *s, char *err, int errlen) {
    const TrainModel *m = s->model;
    if (mkdir(dir, 0777) && errno != EEXIST) return errf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
    char name[64], tmp[2048], fin[2048], p[2200];
    ckpt_step_dir_name(s->st.step, name, sizeof name);
    snprintf(tmp, sizeof tmp, "%s/.tmp-%s-%ld", dir, name, (long)getpid());
    snprintf(fin, sizeof fin, "%s/%s", dir, name);
    rmtree(tmp);  // a leftover of an earlier failure of this process id; nothing else reads it
    if (mkdir(tmp, 0777)) return errf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));

    // model.safetensors: the parameters; optimizer.safetensors: m under exp_avg.<name>, then v
    // under exp_avg_sq.<name>
    const int nt = m->n_tensors;
    const size_t nlen = TRAIN_NAME_MAX + 16;
    StWriteTensor *wt = xcalloc((size_t)2 * nt, sizeof *wt);
    char *names = xmalloc((size_t)2 * nt * nlen);
    uint64_t bytes[2], hash[2];
    int rc = 0;
    for (int f = 0; f < 2 && !rc; f++) {
        const int copies = f == 0 ? 1 : 2;
        for (int h = 0; h < copies; h++)
            for (int i = 0; i < nt; i++) {
                const TrainTensor *t = &m->tensors[i];
                StWriteTensor *x = &wt[(size_t)h * nt + i];
                tensor_shape(t, x);
                if (f == 0) {
                    x->name = t->name, x->data = s->params + t->off;
                } else {
                    char *nm = names + ((size_t)h * nt + i) * nlen;
                    snprintf(nm, nlen, "%s%s", OPT_PREFIX[h], t->name);
                    x->name = nm, x->data = (h ? s->v : s->m) + t->off;
                }
            }
        snprintf(p, sizeof p, "%s/%s", tmp, FILES[f]);
        rc = st_write(p, wt, copies * nt, err, errlen);
        if (!rc) rc = file_hash(p, &bytes[f], &hash[f], err, errlen);
        if (!rc && fsync_path(p)) rc = errf(err, errlen, "%s: fsync: %s", p, strerror(errno));
    }
    free(wt);
    free(names);
    if (rc) return rmtree(tmp), -1;

    json_t *run = json_object();
    for (int i = 0; i < s->n_run; i++) json_object_set_new(run, s->run[i].key, json_string(s->run[i].val));
    json_t *files = json_object();
    for (int f = 0; f < 2; f++) {
        char hx[32];
        snprintf(hx, sizeof hx, "%016" PRIx64, hash[f]);
        json_object_set_new(files, FILES[f], json_pack("{s:I, s:s}", "bytes", (json_int_t)bytes[f], "xxh64", hx));
    }
    char rs[32], ri[32];
    snprintf(rs, sizeof rs, "%016" PRIx64, s->st.data.state);
    snprintf(ri, sizeof ri, "%016" PRIx64, s->st.data.inc);
    const int ws = s->st.world_size > 0 ? s->st.world_size : 1;
    json_t *j = json_pack("{s:i, s:I, s:I, s:i, s:{s:s, s:s}, s:o, s:o, s:o}", "format", CKPT_FORMAT, "step",
                          (json_int_t)s->st.step, "adam_t", (json_int_t)s->st.adam_t, "world_size", ws, "data_rng",
                          "state", rs, "inc", ri, "model", model_json(m), "run", run, "files", files);
    snprintf(p, sizeof p, "%s/state.json", tmp);
    rc = json_dump_file(j, p, JSON_INDENT(2)) ? errf(err, errlen, "%s: cannot write", p) : 0;
    json_decref(j);
    if (!rc && fsync_path(p)) rc = errf(err, errlen, "%s: fsync: %s", p, strerror(errno));
    if (rc) return rmtree(tmp), -1;

    // Commit: a same-step directory (an incomplete one, or one a resumed run is redoing) is replaced.
    struct stat sb;
    if (stat(fin, &sb) == 0) {
        snprintf(p, sizeof p, "%s/DONE", fin);
        unlink(p);
        rmtree(fin);
    }
    if (rename(tmp, fin)) {
        rc = errf(err, errlen, "rename %s -> %s: %s", tmp, fin, strerror(errno));
        rmtree(tmp);
        return rc;
    }
    fsync_path(dir);
    char done_tmp[2200], done[2200];
    snprintf(done_tmp, sizeof done_tmp, "%s/DONE.tmp", fin);
    snprintf(done, sizeof done, "%s/DONE", fin);
    FILE *f = fopen(done_tmp, "w");
    if (!f) return errf(err, errlen, "%s: cannot create: %s", done_tmp, strerror(errno));
    const int ok = fprintf(f, "{\"step\": %ld, \"world_size\": %d}\n", s->st.step, ws) > 0;
    if (fclose(f) || !ok) return errf(err, errlen, "%s: cannot write", done_tmp);
    if (fsync_path(done_tmp) || rename(done_tmp, done))
        return errf(err, errlen, "%s: cannot commit: %s", done, strerror(errno));
    fsync_path(fin);
    return 0;
}

// ---------------------------------------------------------------- load

static int get_int(json_t *o, const char *key, const char *file, long long *out, char *err, int errlen) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return errf(err, errlen, "%s: \"%s\" missing or not an integer", file, key);
    *out = json_integer_value(v);
    return 0;
}

static int get_hex(json_t *o, const char *key, const char *file, uint64_t *out, char *err, int errlen) {
    json_t *v = json_object_get(o, key);
    const char *s = json_string_value(v);
    char *end = NULL;
    if (s && *s) {
        errno = 0;
        *out = strtoull(s, &end, 16);
    }
    if (!s || !*s || *end || errno || strlen(s) > 16)
        return errf(err, errlen, "%s: \"%s\" missing or not a 64-bit hex number", file, key);
    return 0;
}

// The checkpoint's copy of one file, checked against state.json's size and hash, into the three
// staging buffers (slot 0 = params for the model file; 1, 2 = m, v for the optimizer file).
static int load_file(const char *sdir, int f, json_t *files, const TrainModel *m, float **dst, char *err, int errlen) {
    char p[2200], sj[2200];
    snprintf(p, sizeof p, "%s/%s", sdir, FILES[f]);
    snprintf(sj, sizeof sj, "%s/state.json", sdir);
    json_t *e = json_object_get(files, FILES[f]);
    long long want_bytes = 0;
    uint64_t want_hash = 0;
    if (!json_is_object(e)) return errf(err, errlen, "%s: no entry for %s in \"files\"", sj, FILES[f]);
    if (get_int(e, "bytes", sj, &want_bytes, err, errlen) || get_hex(e, "xxh64", sj, &want_hash, err, errlen)) return -1;
    struct stat sb;
    if (stat(p, &sb)) return errf(err, errlen, "%s: missing: %s", p, strerror(errno));
    if ((long long)sb.st_size != want_bytes)
        return errf(err, errlen, "%s: %lld bytes, state.json says %lld (truncated or overwritten)", p,
                    (long long)sb.st_size, want_bytes);
    uint64_t bytes, hash;
    if (file_hash(p, &bytes, &hash, err, errlen)) return -1;
    if (hash != want_hash)
        return errf(err, errlen, "%s: xxHash64 %016" PRIx64 " differs from state.json's %016" PRIx64 " (corrupt)", p, hash,
                    want_hash);
    StSet st;
    if (st_open(p, &st, err, errlen)) return -1;
    const int copies = f == 0 ? 1 : 2;
    int rc = 0;
    if (st.n_tensors != copies * m->n_tensors)
        rc = errf(err, errlen, "%s: %d tensors, expected %d", p, st.n_tensors, copies * m->n_tensors);
    for (int h = 0; h < copies && !rc; h++)
        for (int i = 0; i < m->n_tensors && !rc; i++) {
            const TrainTensor *t = &m->tensors[i];
            char nm[TRAIN_NAME_MAX + 16];
            snprintf(nm, sizeof nm, "%s%s", f == 0 ? "" : OPT_PREFIX[h], t->name);
            const StTensor *x = st_get(&st, nm);
            StWriteTensor want;
            tensor_shape(t, &want);
            if (!x) {
                rc = errf(err, errlen, "%s: tensor %s missing", p, nm);
            } else if (x->dtype != ST_F32 || x->ndim != want.ndim || x->shape[0] != want.shape[0] ||
                       (want.ndim == 2 && x->shape[1] != want.shape[1])) {
                char a[64], b[64];
                rc = errf(err, errlen, "%s: tensor %s is %s %s, expected F32 %s", p, nm, st_dtype_name(x->dtype),
                          st_shape_str(x->shape, x->ndim, a, sizeof a), st_shape_str(want.shape, want.ndim, b, sizeof b));
            } else {
                memcpy(dst[f == 0 ? 0 : 1 + h] + t->off, x->data, t->numel * sizeof(float));
            }
        }
    st_close(&st);
    return rc;
}

int ckpt_load(const char *sdir, TrainModel *m, AdamW *o, CkptState *out, const CkptKV *run, int n_run, char *err,
              int errlen) {
    char p[2200];
    snprintf(p, sizeof p, "%s/DONE", sdir);
    if (access(p, F_OK))
        return errf(err, errlen, "%s: no DONE marker: the checkpoint is incomplete (its write was interrupted)", sdir);
    snprintf(p, sizeof p, "%s/state.json", sdir);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j) return errf(err, errlen, "%s: not valid JSON: %s (line %d)", p, je.text, je.line);
    int rc = -1;
    float *stage[3] = {0};
    long long fmt = 0, step = 0, adam_t = 0, ws = 0;
    CkptState st = {0};
    if (!json_is_object(j)) {
        errf(err, errlen, "%s: not a JSON object", p);
        goto done;
    }
    if (get_int(j, "format", p, &fmt, err, errlen) || get_int(j, "step", p, &step, err, errlen) ||
        get_int(j, "adam_t", p, &adam_t, err, errlen) || get_int(j, "world_size", p, &ws, err, errlen))
        goto done;
    if (fmt != CKPT_FORMAT) {
        errf(err, errlen, "%s: format %lld, this program reads format %d", p, fmt, CKPT_FORMAT);
        goto done;
    }
    if (ws < 1 || ws > 1 << 20) {
        errf(err, errlen, "%s: world_size %lld is not a number of ranks", p, ws);
        goto done;
    }
    if (step < 0 || adam_t < 0) {
        errf(err, errlen, "%s: negative step %lld or adam_t %lld", p, step, adam_t);
        goto done;
    }
    const char *base = strrchr(sdir, '/');
    long dir_step;
    if (is_step_dir(base ? base + 1 : sdir, &dir_step) && dir_step != step) {
        errf(err, errlen, "%s: step %lld, but the directory is named for step %ld", p, step, dir_step);
        goto done;
    }
    json_t *rng = json_object_get(j, "data_rng");
    if (get_hex(rng, "state", p, &st.data.state, err, errlen) || get_hex(rng, "inc", p, &st.data.inc, err, errlen))
        goto done;
    st.step = step, st.adam_t = adam_t, st.world_size = (int)ws;
    // the model config, field by field
    json_t *want = model_json(m), *have = json_object_get(j, "model");
    const char *key;
    json_t *wv;
    json_object_foreach(want, key, wv) {
        json_t *hv = json_object_get(have, key);
        if (!hv || !json_equal(hv, wv)) {
            char *a = hv ? json_dumps(hv, JSON_ENCODE_ANY) : NULL, *b = json_dumps(wv, JSON_ENCODE_ANY);
            errf(err, errlen, "%s: model %s is %s in the checkpoint, %s in this run", p, key, a ? a : "(missing)", b);
            free(a), free(b);
            json_decref(want);
            goto done;
        }
    }
    json_decref(want);
    // the run's options
    json_t *r = json_object_get(j, "run");
    if (!json_is_object(r)) {
        errf(err, errlen, "%s: \"run\" missing", p);
        goto done;
    }
    for (int i = 0; i < n_run; i++) {
        const char *v = json_string_value(json_object_get(r, run[i].key));
        if (!v || strcmp(v, run[i].val)) {
            errf(err, errlen, "%s: option %s was %s%s%s, is %s now (a resume needs the same options)", p, run[i].key,
                 v ? "" : "(", v ? v : "absent", v ? "" : ")", run[i].val);
            goto done;
        }
    }
    if ((int)json_object_size(r) != n_run) {
        errf(err, errlen, "%s: %d run options, this program has %d", p, (int)json_object_size(r), n_run);
        goto done;
    }
    if (o->n != m->n_params) {
        errf(err, errlen, "ckpt_load: optimizer of %zu values for %zu parameters", o->n, m->n_params);
        goto done;
    }
    for (int i = 0; i < 3; i++) stage[i] = xmalloc(m->n_params * sizeof(float));
    json_t *files = json_object_get(j, "files");
    if (load_file(sdir, 0, files, m, stage, err, errlen) || load_file(sdir, 1, files, m, stage, err, errlen)) goto done;
    memcpy(m->params, stage[0], m->n_params * sizeof(float));
    memcpy(o->m, stage[1], m->n_params * sizeof(float));
    memcpy(o->v, stage[2], m->n_params * sizeof(float));
    o->t = st.adam_t;
    *out = st;
    rc = 0;
done:
    for (int i = 0; i < 3; i++) free(stage[i]);
    json_decref(j);
    return rc;
}

// ---------------------------------------------------------------- the periodic writer

int ckpt_writer_init(CkptWriter *w, const char *dir, int async, int keep, const CkptKV *run, int n_run, char *err,
                     int errlen) {
    memset(w, 0, sizeof *w);
    if (strlen(dir) >= sizeof w->dir - 64) return errf(err, errlen, "%s: checkpoint directory name too long", dir);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    w->async = async, w->keep = keep, w->n_run = n_run;
    memcpy(w->run, run, (size_t)n_run * sizeof *run);
    if (mkdir(dir, 0777) && errno != EEXIST) return errf(err, errlen, "%s: cannot create: %s", dir, strerror(errno));
    return 0;
}

// Write w->job (and prune); sets failed / err, the write time and the totals.
static void write_job(CkptWriter *w) {
    const double t0 = now_sec();
    if (ckpt_write_dir(w->dir, &w->job, w->err, sizeof w->err) || ckpt_prune(w->dir, w->keep, w->err, sizeof w->err))
        w->failed = 1;
    else w->n_written++;
    w->write_s = now_sec() - t0;
    w->write_total_s += w->write_s;
}

static void *writer_main(void *arg) {
    write_job((CkptWriter *)arg);
    return NULL;
}

int ckpt_wait(CkptWriter *w, char *err, int errlen) {
    if (w->in_flight) {
        const double t0 = now_sec();
        pthread_join(w->th, NULL);
        w->in_flight = 0;
        w->stall_s += now_sec() - t0;
    }
    if (w->failed) return errf(err, errlen, "checkpoint write failed: %s", w->err);
    return 0;
}

int ckpt_save(CkptWriter *w, const TrainModel *m, const AdamW *o, const CkptState *st, char *err, int errlen) {
    const size_t n = m->n_params;
    if (w->async) {  // the snapshot (a memcpy of params, m and v), then its write on the writer thread
        float *snap = ckpt_snapshot_begin(w, n, err, errlen);
        if (!snap) return -1;
        memcpy(snap, m->params, n * sizeof(float));
        memcpy(snap + n, o->m, n * sizeof(float));
        memcpy(snap + 2 * n, o->v, n * sizeof(float));
        return ckpt_snapshot_commit(w, m, st, err, errlen);
    }
    if (ckpt_wait(w, err, errlen)) return -1;
    const double t0 = now_sec();
    w->job = (CkptSnapshot){.model = m, .params = m->params, .m = o->m, .v = o->v, .st = *st, .run = w->run,
                            .n_run = w->n_run};
    write_job(w);
    w->stall_s += now_sec() - t0;
    return w->failed ? errf(err, errlen, "checkpoint write failed: %s", w->err) : 0;
}

void ckpt_writer_set_alloc(CkptWriter *w, void *(*alloc)(size_t), void (*free_fn)(void *)) {
    w->snap_alloc = alloc, w->snap_free = free_fn;
}

float *ckpt_snapshot_begin(CkptWriter *w, size_t n, char *err, int errlen) {
    const double t0 = now_sec();
    if (ckpt_wait(w, err, errlen)) return NULL;  // at most one write in flight
    if (w->n_snap != n) {
        if (w->snap) w->snap_free ? w->snap_free(w->snap) : free(w->snap);
        w->snap = w->snap_alloc ? (float *)w->snap_alloc(3 * n * sizeof(float)) : xmalloc(3 * n * sizeof(float));
        if (!w->snap) {  // (xmalloc dies instead; a caller's allocator may answer NULL)
            w->n_snap = 0;
            errf(err, errlen, "checkpoint: cannot allocate a snapshot of %zu bytes", 3 * n * sizeof(float));
            return NULL;
        }
        w->n_snap = n;
    }
    w->t_fill = now_sec();
    w->stall_s -= w->t_fill - t0;  // ckpt_wait counted the wait; commit counts begin..commit
    w->t_begin = t0;
    return w->snap;
}

int ckpt_snapshot_commit(CkptWriter *w, const TrainModel *m, const CkptState *st, char *err, int errlen) {
    const size_t n = w->n_snap;
    if (!w->snap || n != m->n_params) return errf(err, errlen, "ckpt_snapshot_commit: no snapshot of %zu values begun", m->n_params);
    w->job = (CkptSnapshot){.model = m, .params = w->snap, .m = w->snap + n, .v = w->snap + 2 * n, .st = *st,
                            .run = w->run, .n_run = w->n_run};
    if (!w->async) {
        write_job(w);
        w->stall_s += now_sec() - w->t_begin;
        return w->failed ? errf(err, errlen, "checkpoint write failed: %s", w->err) : 0;
    }
    const double filled = now_sec();
    const int e = pthread_create(&w->th, NULL, writer_main, w);
    if (e) return errf(err, errlen, "checkpoint: cannot start the writer thread: %s", strerror(e));
    w->in_flight = 1;
    w->snapshot_s += filled - w->t_fill;
    w->stall_s += now_sec() - w->t_begin;
    return 0;
}

void ckpt_writer_free(CkptWriter *w) {
    if (w->in_flight) pthread_join(w->th, NULL), w->in_flight = 0;
    if (w->snap && w->snap_free) w->snap_free(w->snap);
    else free(w->snap);
    w->snap = NULL, w->n_snap = 0;
}
