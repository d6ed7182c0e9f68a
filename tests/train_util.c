// train_util.c — see train_util.h.
#include "train_util.h"

#include <criterion/criterion.h>
#include <omp.h>
#include <stdlib.h>

#include "rng.h"
#include "step08_ddp/task.h"

void test_train_copy(TrainModel *m, int steps, double *first, double *last10) {
    const int saved_threads = omp_get_max_threads();
    omp_set_num_threads(1);
    ModelConfig c = {0};
    c.arch = ARCH_LLAMA;
    c.hidden = 48, c.n_layers = 2, c.n_heads = 4, c.n_kv_heads = 2, c.head_dim = 12, c.intermediate = 96;
    c.vocab = TASK_SYM0 + TCOPY_NSYM, c.max_pos = 64, c.rms_eps = 1e-5f, c.rope_theta = 10000.0, c.bos_token_id = -1;
    char err[256];
    cr_assert(train_model_new(&c, m, err, sizeof err) == 0, "%s", err);
    train_model_init_random(m, 1);
    const int L = TCOPY_L, T = task_seq_len(L), B = 16;
    int *ids = malloc((size_t)B * T * sizeof(int)), *tg = malloc((size_t)B * T * sizeof(int));
    TrainActs a;
    train_acts_new(&c, B, T, &a);
    AdamW o;
    adamw_new(&o, m->n_params);
    const AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f};
    Rng r;
    rng_seed(&r, 2);
    double f = 0, l10 = 0;
    for (int s = 0; s < steps; s++) {
        task_make_batch(TASK_COPY, &r, B, L, TCOPY_NSYM, ids, tg);
        train_zero_grad(m);
        const double loss = train_forward(m, &a, ids, tg, B, T);
        train_backward(m, &a);
        grad_global_norm_clip(m->grads, m->n_params, 1.0);
        train_adamw_step(m, &o, &ac, lr_schedule(s, 20, steps, 1e-2f, 1e-3f));
        if (s == 0) f = loss;
        if (s >= steps - 10) l10 += loss / (steps < 10 ? steps : 10);
    }
    if (first) *first = f;
    if (last10) *last10 = l10;
    adamw_free(&o);
    train_acts_free(&a);
    free(ids), free(tg);
    omp_set_num_threads(saved_threads);
}

void test_need_mpi(void) {
    if (!HAVE_MPI) cr_skip_test("this build has no MPI (HAVE_MPI=0)");
    if (system("command -v mpirun >/dev/null 2>&1")) cr_skip_test("no mpirun on PATH");
}
