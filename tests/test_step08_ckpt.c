// test_step08_ckpt.c — step08's checkpoints (step08_ddp/ckpt.h) and train's --resume.
//
//   round trip   written, loaded into a fresh model and optimizer: every byte of params, m, v,
//                the step, AdamW t and the data RNG equal; the files hold the HF names; a second
//                write of what was loaded gives the same bytes
//   refusals     no DONE, a truncated file, a flipped byte, a missing file, broken state.json,
//                another config, another run option: each refused with one line naming the
//                file and what is wrong, the model left untouched
//   async        the background write holds the snapshot taken at ckpt_save even though the
//                training buffers change right after; same bytes as the synchronous write
//   keep         only the N newest complete checkpoints remain; latest skips incomplete ones
//   resume       train 1..2K straight vs 1..K, stop, --resume, K+1..2K: the same losses bit for
//                bit and the same checkpoint files at 2K (sync and async)
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs_util.h"
#include "rng.h"
#include "safetensors.h"
#include "step08_ddp/ckpt.h"
#include "step08_ddp/train.h"

// A small odd Llama (GQA 3/1, biases, q/k norm so that every kind of tensor is in the files).
static void small_model(TrainModel *m, int hidden, uint64_t seed) {
    ModelConfig c = {0};
    c.arch = ARCH_QWEN3;
    c.hidden = hidden, c.n_layers = 2, c.n_heads = 3, c.n_kv_heads = 1, c.head_dim = 4, c.intermediate = 20;
    c.vocab = 13, c.max_pos = 32, c.rms_eps = 1e-6f, c.rope_theta = 10000.0, c.bos_token_id = -1;
    c.qkv_bias = 1, c.qk_norm = 1;
    char err[256];
    cr_assert(train_model_new(&c, m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(m, seed);
}

static void random_opt(AdamW *o, size_t n, uint64_t seed, long t) {
    adamw_new(o, n);
    Rng r;
    rng_seed(&r, seed);
    rng_fill_normal(&r, o->m, n, 0, 1e-2f);
    rng_fill_uniform(&r, o->v, n, 0, 1e-4f);
    o->t = t;
}

static const CkptKV RUN[2] = {{"task", "copy"}, {"batch", "16"}};

static CkptSnapshot snap_of(const TrainModel *m, const AdamW *o, long step, const Rng *data) {
    return (CkptSnapshot){.model = m, .params = m->params, .m = o->m, .v = o->v,
                          .st = {.step = step, .adam_t = o->t, .data = *data}, .run = RUN, .n_run = 2};
}

static int same_file(const char *a, const char *b) {
    size_t na = 0, nb = 0;
    char *x = test_slurp(a, &na), *y = test_slurp(b, &nb);
    const int same = x && y && na == nb && !memcmp(x, y, na);
    free(x), free(y);
    return same;
}

static const char *const CK_FILES[] = {"model.safetensors", "optimizer.safetensors", "state.json", "DONE"};

static void expect_same_dirs(const char *a, const char *b) {
    for (int i = 0; i < 4; i++) {
        char pa[1100], pb[1100];
        snprintf(pa, sizeof pa, "%s/%s", a, CK_FILES[i]);
        snprintf(pb, sizeof pb, "%s/%s", b, CK_FILES[i]);
        cr_expect(same_file(pa, pb), "%s and %s differ", pa, pb);
    }
}

Test(step08_ckpt, round_trip_every_byte) {
    char dir[64], err[1024];
    test_mkdtemp(dir, sizeof dir, "ckpt_rt");
    TrainModel a, b;
    small_model(&a, 12, 1);
    small_model(&b, 12, 2);  // other weights: the load must overwrite all of them
    AdamW oa, ob;
    random_opt(&oa, a.n_params, 3, 37);
    random_opt(&ob, b.n_params, 4, 5);
    Rng data;
    rng_seed(&data, 99);
    for (int i = 0; i < 7; i++) rng_u32(&data);  // somewhere inside the stream
    const CkptSnapshot s = snap_of(&a, &oa, 37, &data);
    cr_assert(ckpt_write_dir(dir, &s, err, sizeof err) == 0, "%s", err);
    char path[1100];
    cr_assert(ckpt_latest(dir, path, sizeof path) == 1);
    char want[1100];
    snprintf(want, sizeof want, "%s/step-000037", dir);
    cr_expect_str_eq(path, want);
    CkptState st = {0};
    cr_assert(ckpt_load(path, &b, &ob, &st, RUN, 2, err, sizeof err) == 0, "%s", err);
    cr_expect(!memcmp(a.params, b.params, a.n_params * sizeof(float)), "params differ after the round trip");
    cr_expect(!memcmp(oa.m, ob.m, a.n_params * sizeof(float)), "AdamW m differs after the round trip");
    cr_expect(!memcmp(oa.v, ob.v, a.n_params * sizeof(float)), "AdamW v differs after the round trip");
    cr_expect_eq(st.step, 37);
    cr_expect_eq(st.adam_t, 37);
    cr_expect_eq(ob.t, 37);
    cr_expect(st.data.state == data.state && st.data.inc == data.inc, "the data RNG differs after the round trip");
    // the model file holds every tensor under its HF name with the parameters' bytes
    StSet set;
    snprintf(path, sizeof path, "%s/step-000037/model.safetensors", dir);
    cr_assert(st_open(path, &set, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(set.n_tensors, a.n_tensors);
    for (int i = 0; i < a.n_tensors; i++) {
        const StTensor *t = st_get(&set, a.tensors[i].name);
        cr_assert(t, "%s missing from model.safetensors", a.tensors[i].name);
        cr_expect(t->dtype == ST_F32 && (size_t)t->numel == a.tensors[i].numel &&
                      !memcmp(t->data, a.params + a.tensors[i].off, t->nbytes),
                  "%s differs in model.safetensors", a.tensors[i].name);
    }
    cr_expect(st_get(&set, "model.layers.1.self_attn.q_norm.weight") != NULL, "q_norm missing");
    st_close(&set);
    // what was loaded, written again, is the same bytes
    char dir2[64];
    test_mkdtemp(dir2, sizeof dir2, "ckpt_rt2");
    const CkptSnapshot s2 = snap_of(&b, &ob, st.step, &st.data);
    cr_assert(ckpt_write_dir(dir2, &s2, err, sizeof err) == 0, "%s", err);
    char p1[1100], p2[1100];
    snprintf(p1, sizeof p1, "%s/step-000037", dir);
    snprintf(p2, sizeof p2, "%s/step-000037", dir2);
    expect_same_dirs(p1, p2);
    test_rmtree(dir), test_rmtree(dir2);
    adamw_free(&oa), adamw_free(&ob);
    train_model_free(&a), train_model_free(&b);
}

// ---------------------------------------------------------------- refusals

typedef struct {
    char dir[64], step_dir[1100];
    TrainModel m;
    AdamW o;
} Fixture;

static void fixture_new(Fixture *f) {
    char err[1024];
    test_mkdtemp(f->dir, sizeof f->dir, "ckpt_bad");
    small_model(&f->m, 12, 1);
    random_opt(&f->o, f->m.n_params, 3, 10);
    Rng data;
    rng_seed(&data, 5);
    const CkptSnapshot s = snap_of(&f->m, &f->o, 10, &data);
    cr_assert(ckpt_write_dir(f->dir, &s, err, sizeof err) == 0, "%s", err);
    snprintf(f->step_dir, sizeof f->step_dir, "%s/step-000010", f->dir);
}

static void fixture_free(Fixture *f) {
    test_rmtree(f->dir);
    adamw_free(&f->o);
    train_model_free(&f->m);
}

// Load f's checkpoint into a fresh model of `hidden` with run options run: must fail with a message
// holding both `what` and `name`; the model and optimizer must be left as they were.
static void expect_refused(Fixture *f, int hidden, const CkptKV *run, const char *what, const char *name) {
    TrainModel m;
    small_model(&m, hidden, 7);
    AdamW o;
    random_opt(&o, m.n_params, 8, 3);
    float *p0 = malloc(m.n_params * sizeof(float)), *m0 = malloc(m.n_params * sizeof(float));
    memcpy(p0, m.params, m.n_params * sizeof(float));
    memcpy(m0, o.m, m.n_params * sizeof(float));
    char err[1024] = "";
    CkptState st = {.step = -5};
    const int rc = ckpt_load(f->step_dir, &m, &o, &st, run, 2, err, sizeof err);
    cr_expect_eq(rc, -1, "loaded a checkpoint that should be refused (%s)", what);
    cr_expect(strstr(err, what) && strstr(err, name), "message \"%s\" should name %s and say %s", err, name, what);
    cr_expect(!strchr(err, '\n'), "message is more than one line: %s", err);
    cr_expect(!memcmp(p0, m.params, m.n_params * sizeof(float)) && !memcmp(m0, o.m, m.n_params * sizeof(float)) &&
                  o.t == 3 && st.step == -5,
              "a refused load changed the model, optimizer or state (%s)", what);
    cr_log_info("refused: %s", err);
    free(p0), free(m0);
    adamw_free(&o);
    train_model_free(&m);
}

static void path_in(const Fixture *f, const char *file, char *buf, size_t n) {
    snprintf(buf, n, "%s/%s", f->step_dir, file);
}

Test(step08_ckpt, refuses_without_done) {
    Fixture f;
    fixture_new(&f);
    char p[1200];
    path_in(&f, "DONE", p, sizeof p);
    cr_assert(unlink(p) == 0);
    expect_refused(&f, 12, RUN, "no DONE marker", f.step_dir);
    char latest[1100];
    cr_expect_eq(ckpt_latest(f.dir, latest, sizeof latest), 0, "latest picked an incomplete checkpoint: %s", latest);
    fixture_free(&f);
}

Test(step08_ckpt, refuses_truncated_file) {
    Fixture f;
    fixture_new(&f);
    char p[1200];
    path_in(&f, "model.safetensors", p, sizeof p);
    struct stat sb;
    cr_assert(stat(p, &sb) == 0);
    cr_assert(truncate(p, sb.st_size - 100) == 0);
    expect_refused(&f, 12, RUN, "state.json says", "model.safetensors");
    cr_assert(truncate(p, 0) == 0);
    expect_refused(&f, 12, RUN, "0 bytes", "model.safetensors");
    fixture_free(&f);
}

Test(step08_ckpt, refuses_corrupt_file) {
    Fixture f;
    fixture_new(&f);
    char p[1200];
    path_in(&f, "optimizer.safetensors", p, sizeof p);
    size_t n;
    char *b = test_slurp(p, &n);
    b[n - 3] ^= 0x10;  // one bit of the last v value: same size, parses, only the checksum can tell
    FILE *fp = fopen(p, "wb");
    cr_assert(fp && fwrite(b, 1, n, fp) == n);
    fclose(fp);
    free(b);
    expect_refused(&f, 12, RUN, "xxHash64", "optimizer.safetensors");
    fixture_free(&f);
}

Test(step08_ckpt, refuses_missing_file_and_broken_state) {
    Fixture f;
    fixture_new(&f);
    char p[1200];
    path_in(&f, "model.safetensors", p, sizeof p);
    char q[1300];
    snprintf(q, sizeof q, "%s.moved", p);
    cr_assert(rename(p, q) == 0);
    expect_refused(&f, 12, RUN, "missing", "model.safetensors");
    cr_assert(rename(q, p) == 0);
    path_in(&f, "state.json", p, sizeof p);
    size_t n;
    char *b = test_slurp(p, &n);
    FILE *fp = fopen(p, "wb");
    cr_assert(fp && fwrite(b, 1, n / 2, fp) == n / 2);  // cut in the middle
    fclose(fp);
    expect_refused(&f, 12, RUN, "not valid JSON", "state.json");
    // valid JSON with a field gone
    char *cut = strstr(b, "\"adam_t\"");
    cr_assert(cut);
    memcpy(cut, "\"adam_x\"", 8);
    fp = fopen(p, "wb");
    cr_assert(fp && fwrite(b, 1, n, fp) == n);
    fclose(fp);
    free(b);
    expect_refused(&f, 12, RUN, "\"adam_t\" missing", "state.json");
    fixture_free(&f);
}

Test(step08_ckpt, refuses_other_config_or_options) {
    Fixture f;
    fixture_new(&f);
    expect_refused(&f, 16, RUN, "model hidden is 12 in the checkpoint, 16 in this run", "state.json");
    const CkptKV other[2] = {{"task", "copy"}, {"batch", "8"}};
    expect_refused(&f, 12, other, "option batch was 16, is 8 now", "state.json");
    const CkptKV renamed[2] = {{"task", "copy"}, {"seq", "6"}};
    expect_refused(&f, 12, renamed, "option seq was (absent)", "state.json");
    // a checkpoint directory renamed to another step
    char moved[1100];
    snprintf(moved, sizeof moved, "%s/step-000011", f.dir);
    cr_assert(rename(f.step_dir, moved) == 0);
    snprintf(f.step_dir, sizeof f.step_dir, "%s", moved);
    expect_refused(&f, 12, RUN, "step 10, but the directory is named for step 11", "state.json");
    fixture_free(&f);
}

// ---------------------------------------------------------------- async, keep

Test(step08_ckpt, async_writes_the_snapshot_same_as_sync) {
    char ds[64], da[64], err[1024];
    test_mkdtemp(ds, sizeof ds, "ckpt_sync");
    test_mkdtemp(da, sizeof da, "ckpt_async");
    TrainModel m;
    small_model(&m, 12, 1);
    AdamW o;
    random_opt(&o, m.n_params, 3, 20);
    Rng data;
    rng_seed(&data, 5);
    const CkptState st = {.step = 20, .adam_t = 20, .data = data};
    CkptWriter ws, wa;
    cr_assert(ckpt_writer_init(&ws, ds, 0, 0, RUN, 2, err, sizeof err) == 0, "%s", err);
    cr_assert(ckpt_writer_init(&wa, da, 1, 0, RUN, 2, err, sizeof err) == 0, "%s", err);
    cr_assert(ckpt_save(&ws, &m, &o, &st, err, sizeof err) == 0, "%s", err);
    cr_assert(ckpt_save(&wa, &m, &o, &st, err, sizeof err) == 0, "%s", err);
    // training goes on while the writer thread works: it must not see these
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 1, o.m[i] = -o.m[i], o.v[i] *= 2;
    cr_assert(ckpt_wait(&wa, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(ws.n_written, 1);
    cr_expect_eq(wa.n_written, 1);
    cr_expect(ws.stall_s >= ws.write_total_s, "sync: the whole write is a stall");
    char ps[1100], pa[1100];
    snprintf(ps, sizeof ps, "%s/step-000020", ds);
    snprintf(pa, sizeof pa, "%s/step-000020", da);
    expect_same_dirs(ps, pa);
    ckpt_writer_free(&ws), ckpt_writer_free(&wa);
    test_rmtree(ds), test_rmtree(da);
    adamw_free(&o);
    train_model_free(&m);
}

// counts the caller-supplied allocator's calls (ckpt_writer_set_alloc: pinned memory on a GPU)
static int n_alloc, n_free;
static void *count_alloc(size_t n) { return n_alloc++, malloc(n); }
static void count_free(void *p) { n_free++, free(p); }

// ckpt_snapshot_begin / commit (the GPU trainer's path: it fills the snapshot itself) write the
// same files as ckpt_save, sync and async, with the snapshot from the given allocator
static void snapshot_api_case(int async) {
    char ds[64], dn[64], err[1024];
    test_mkdtemp(ds, sizeof ds, "ckpt_save");
    test_mkdtemp(dn, sizeof dn, "ckpt_snap");
    TrainModel m;
    small_model(&m, 12, 1);
    AdamW o;
    random_opt(&o, m.n_params, 3, 30);
    Rng data;
    rng_seed(&data, 7);
    const CkptState st = {.step = 30, .adam_t = 30, .data = data};
    CkptWriter ws, wn;
    cr_assert(ckpt_writer_init(&ws, ds, async, 0, RUN, 2, err, sizeof err) == 0, "%s", err);
    cr_assert(ckpt_writer_init(&wn, dn, async, 0, RUN, 2, err, sizeof err) == 0, "%s", err);
    n_alloc = n_free = 0;
    ckpt_writer_set_alloc(&wn, count_alloc, count_free);
    cr_assert(ckpt_save(&ws, &m, &o, &st, err, sizeof err) == 0, "%s", err);
    float *snap = ckpt_snapshot_begin(&wn, m.n_params, err, sizeof err);
    cr_assert(snap, "%s", err);
    memcpy(snap, m.params, m.n_params * sizeof(float));
    memcpy(snap + m.n_params, o.m, m.n_params * sizeof(float));
    memcpy(snap + 2 * m.n_params, o.v, m.n_params * sizeof(float));
    cr_assert(ckpt_snapshot_commit(&wn, &m, &st, err, sizeof err) == 0, "%s", err);
    for (size_t i = 0; i < m.n_params; i++) m.params[i] += 1;  // training goes on: not in the files
    cr_assert(ckpt_wait(&ws, err, sizeof err) == 0 && ckpt_wait(&wn, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(wn.n_written, 1);
    cr_expect(wn.stall_s > 0, "the snapshot's time is a stall");
    char ps[1100], pn[1100];
    snprintf(ps, sizeof ps, "%s/step-000030", ds);
    snprintf(pn, sizeof pn, "%s/step-000030", dn);
    expect_same_dirs(ps, pn);
    // a second snapshot of the same size reuses the buffer; free gives it back through count_free
    cr_assert(ckpt_snapshot_begin(&wn, m.n_params, err, sizeof err) == snap, "%s", err);
    ckpt_writer_free(&ws), ckpt_writer_free(&wn);
    cr_expect(n_alloc == 1 && n_free == 1, "allocator: %d allocs, %d frees", n_alloc, n_free);
    test_rmtree(ds), test_rmtree(dn);
    adamw_free(&o);
    train_model_free(&m);
}
Test(step08_ckpt, snapshot_api_writes_what_save_writes_sync) { snapshot_api_case(0); }
Test(step08_ckpt, snapshot_api_writes_what_save_writes_async) { snapshot_api_case(1); }

static int exists_step(const char *dir, int step) {
    char p[1100];
    snprintf(p, sizeof p, "%s/step-%06d", dir, step);
    struct stat sb;
    return stat(p, &sb) == 0;
}

Test(step08_ckpt, keep_prunes_old_complete_checkpoints) {
    char dir[64], err[1024];
    test_mkdtemp(dir, sizeof dir, "ckpt_keep");
    TrainModel m;
    small_model(&m, 12, 1);
    AdamW o;
    random_opt(&o, m.n_params, 3, 0);
    Rng data;
    rng_seed(&data, 5);
    // an incomplete later checkpoint and a leftover temporary directory: neither counts
    char p[1100];
    snprintf(p, sizeof p, "%s/step-000099", dir);
    cr_assert(mkdir(p, 0777) == 0);
    snprintf(p, sizeof p, "%s/.tmp-step-000098-1", dir);
    cr_assert(mkdir(p, 0777) == 0);
    CkptWriter w;
    cr_assert(ckpt_writer_init(&w, dir, 1, 2, RUN, 2, err, sizeof err) == 0, "%s", err);
    for (int s = 1; s <= 5; s++) {
        const CkptState st = {.step = s, .adam_t = s, .data = data};
        cr_assert(ckpt_save(&w, &m, &o, &st, err, sizeof err) == 0, "%s", err);
    }
    cr_assert(ckpt_wait(&w, err, sizeof err) == 0, "%s", err);
    cr_expect_eq(w.n_written, 5);
    for (int s = 1; s <= 3; s++) cr_expect(!exists_step(dir, s), "step %d should have been deleted (--keep 2)", s);
    cr_expect(exists_step(dir, 4) && exists_step(dir, 5), "steps 4 and 5 should remain");
    cr_expect(exists_step(dir, 99), "an incomplete checkpoint is not pruned as if it were complete");
    char latest[1100], want[1100];
    cr_assert(ckpt_latest(dir, latest, sizeof latest) == 1);
    snprintf(want, sizeof want, "%s/step-000005", dir);
    cr_expect_str_eq(latest, want);
    ckpt_writer_free(&w);
    test_rmtree(dir);
    adamw_free(&o);
    train_model_free(&m);
}

// ---------------------------------------------------------------- exact resume through train


#define K 6
// One OpenMP thread: the same reduction order on every run (and no spinning threads in CI).
#define TRAIN "OMP_NUM_THREADS=1 " BUILD_BIN_DIR "/train --preset tiny --steps 12 --warmup 2 --batch 8 --eval 0 --ckpt-every 6"

static void resume_case(const char *async) {
    char dir[64], cmd[2048];
    static char out[1 << 16];
    test_mkdtemp(dir, sizeof dir, "ckpt_resume");
    snprintf(cmd, sizeof cmd, TRAIN " --ckpt-dir %s/a --loss-log %s/a.log 2>&1", dir, dir);
    cr_assert(test_run_cmd(cmd, out, sizeof out) == 0, "%s:\n%s", cmd, out);
    snprintf(cmd, sizeof cmd, TRAIN " %s --ckpt-dir %s/b --loss-log %s/b1.log --stop-at %d 2>&1", async, dir, dir, K);
    cr_assert(test_run_cmd(cmd, out, sizeof out) == 0, "%s:\n%s", cmd, out);
    snprintf(cmd, sizeof cmd, TRAIN " %s --ckpt-dir %s/b --loss-log %s/b2.log --resume 2>&1", async, dir, dir);
    cr_assert(test_run_cmd(cmd, out, sizeof out) == 0, "%s:\n%s", cmd, out);
    cr_expect(strstr(out, "# resume: from ") && strstr(out, "step 6 done, AdamW t 6; training steps 7..12"),
              "no resume line:\n%s", out);
    cr_expect(strstr(out, "# checkpoint: 1 written"), "no checkpoint summary:\n%s", out);
    cr_expect(!strstr(out, "runtime error") && !strstr(out, "Sanitizer"), "sanitizer report:\n%s", out);
    // the losses of steps 7..12: the same bits
    char p[1100];
    size_t na, n1, n2;
    snprintf(p, sizeof p, "%s/a.log", dir);
    char *a = test_slurp(p, &na);
    snprintf(p, sizeof p, "%s/b1.log", dir);
    char *b1 = test_slurp(p, &n1);
    snprintf(p, sizeof p, "%s/b2.log", dir);
    char *b2 = test_slurp(p, &n2);
    cr_assert(a && b1 && b2);
    int lines = 0;
    for (char *q = b2; *q; q++) lines += *q == '\n';
    cr_expect_eq(lines, 12 - K, "the resumed run logged %d steps:\n%s", lines, b2);
    cr_expect(strncmp(b2, "7 ", 2) == 0, "the resumed run starts at step %.8s", b2);
    cr_expect(n1 + n2 == na && !memcmp(a, b1, n1) && !memcmp(a + n1, b2, n2),
              "losses differ:\nstraight:\n%s\nstopped + resumed:\n%s%s", a, b1, b2);
    // and the final checkpoints are the same files
    char pa[1100], pb[1100];
    snprintf(pa, sizeof pa, "%s/a/step-000012", dir);
    snprintf(pb, sizeof pb, "%s/b/step-000012", dir);
    expect_same_dirs(pa, pb);
    // a resume with another option is refused, naming it
    snprintf(cmd, sizeof cmd, TRAIN " --ckpt-dir %s/b --resume --seq 5 2>&1", dir);
    cr_expect_eq(test_run_cmd(cmd, out, sizeof out), 1, "%s:\n%s", cmd, out);
    cr_expect(strstr(out, "error: --resume: ") && strstr(out, "option seq was 6, is 5 now"), "%s", out);
    free(a), free(b1), free(b2);
    test_rmtree(dir);
}

Test(step08_ckpt, resume_is_bit_identical_sync, .timeout = 60) { resume_case(""); }
Test(step08_ckpt, resume_is_bit_identical_async, .timeout = 60) { resume_case("--ckpt-async"); }

Test(step08_ckpt, train_refuses_checkpoint_options_without_dir) {
    static char out[1 << 14];
    const int rc = test_run_cmd(BUILD_BIN_DIR "/train --preset tiny --resume 2>&1", out, sizeof out);
    cr_expect_eq(rc, 2, "%s", out);
    cr_expect(strstr(out, "error: --resume, --ckpt-async and --keep need --ckpt-dir DIR"), "%s", out);
}
