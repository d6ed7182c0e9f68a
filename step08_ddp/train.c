// train.c — train a small Llama-family model on the CPU (fp32) on a synthetic task, then ask the
// engine's forward (step03's KV-cached forward_cached_cpu) to do the task with the trained weights.
//
//   build/bin/train --preset tiny --task copy --steps 300
//   build/bin/train --preset tiny --task reverse --steps 1500 --seq 5 --log-every 100
//   build/bin/train --model tests/data/models/llama_mha_f32 --task copy --steps 200 --lr 3e-3
//
// What it teaches: one training step is forward (keeping activations), loss, backward (the
// forward's ops in reverse, each turning dL/d(output) into dL/d(input) and dL/d(weights)),
// global-norm clipping and an AdamW step at the schedule's learning rate (train.h). The table
// shows the loss falling from ln(symbols) (guessing) towards 0, the gradient norm before clipping,
// the learning rate (warmup, then cosine) and tokens/s (B * T tokens through forward + backward +
// update, wall clock). At the end: held-out examples answered by greedy decoding.
// With --ckpt-dir it writes checkpoints (ckpt.h: sync, or async on a writer thread) and prints what
// they cost the training thread; --resume continues a stopped run with bit-identical losses.
// With --grad-dump DIR it trains nothing: it writes the starting model, step 1's batch, its loss and
// its gradients (before clipping) for an autograd framework to check (export.h,
// tools/make_grad_goldens.py).
//
// Data parallelism (ddp.h): started by mpirun, each of N ranks trains on its B / N rows of the
// global batch and the gradients are all-reduced in buckets while the backward runs; rank 0 logs
// and writes the checkpoints, the weights' hashes are compared every --check-every steps, and every
// collective has a deadline (--collective-timeout). step08_ddp/launch.sh restarts the job from the
// last complete checkpoint when a rank dies:
//   mpirun -np 2 build/bin/train --preset tiny --steps 300 --batch 16
//   step08_ddp/launch.sh --np 2 --max-restarts 2 -- build/bin/train --preset tiny --ckpt-dir /tmp/ck
//
// On one GPU (train_gpu.h): --device cuda runs the same loop with the forward, backward, clipping and
// AdamW on the device (one process; the data, schedule and logging stay on the host; --save and
// --ckpt-dir download the state and use the CPU code):
//   build/bin/train --preset small --device cuda --steps 200 --batch 64 --seq 31 --lr 1e-3
// On several GPUs (ddp_nccl.h): --device cuda under mpirun runs one rank per GPU; the gradients are
// all-reduced GPU to GPU by NCCL in buckets on a comm stream while the backward runs:
//   mpirun -np 2 build/bin/train --preset small --device cuda --steps 200 --batch 64 --seq 31 --lr 1e-3
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "args.h"
#include "check.h"
#include "cpu_env.h"
#include "hf_config.h"
#include "model.h"
#include "rng.h"
#include "step08_ddp/ckpt.h"
#include "step01_matmul/roofline_gpu.h"
#include "step08_ddp/ddp.h"
#include "step08_ddp/ddp_nccl.h"
#include "step08_ddp/export.h"
#include "step08_ddp/task.h"
#include "step08_ddp/train.h"
#include "step08_ddp/train_gpu.h"
#include "table.h"
#include "timer.h"

// The built-in model: Llama, GQA 4/2, untied; its vocabulary is set to the task's (BOS, SEP and
// the symbols).
static const char *TINY_JSON =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":12,"
    "\"max_position_embeddings\":256,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":false}";
// A model that gives a GPU work (--preset small): Llama, d 1024, 8 layers, GQA 16/4, head_dim 64,
// ff 2816, untied; the vocabulary again the task's. 90219520 parameters (the model line says so).
static const char *SMALL_JSON =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":1024,\"intermediate_size\":2816,"
    "\"num_hidden_layers\":8,\"num_attention_heads\":16,\"num_key_value_heads\":4,\"vocab_size\":12,"
    "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":false}";

static void usage(FILE *f) {
    fprintf(f,
            "usage: train (--preset tiny|small | --model DIR) [--device cpu|cuda [--matmul bf16|fp32]] [--task copy|reverse]\n"
            "             [--steps N] [--batch B] [--seq L]\n"
            "             [--symbols K] [--lr X] [--min-lr X] [--warmup N] [--wd X] [--clip X] [--seed S]\n"
            "             [--log-every N] [--eval N] [--save DIR [--save-dtype fp32|bf16]] [--grad-dump DIR] [--csv | --json]\n"
            "             [--ckpt-dir DIR [--ckpt-every K] [--ckpt-async] [--keep N] [--resume]] [--stop-at S]\n"
            "             [--loss-log FILE] [--event-log FILE] [--pid-dir DIR] [--bucket-kb K] [--check-every K]\n"
            "             [--collective-timeout S] [--hang-rank R --hang-at-step S] [--flip-rank R --flip-at-step S]\n"
            "  --preset tiny  built-in Llama (d 64, 2 layers, 4 query / 2 kv heads, head_dim 16, ff 128), random init\n"
            "                 (train.h says how); its vocabulary is BOS, SEP and the K symbols (default)\n"
            "  --preset small a bigger Llama for a GPU (d 1024, 8 layers, 16 query / 4 kv heads, head_dim 64, ff 2816)\n"
            "  --device       cpu (default: fp32, OpenMP + OpenBLAS) or cuda (one GPU, train_gpu.h; under mpirun one rank\n"
            "                 per GPU, the gradients all-reduced by NCCL (ddp_nccl.h); q/k/v or o biases and q/k norm\n"
            "                 are refused there)\n"
            "  --matmul       with --device cuda: bf16 (default: tensor-core GEMMs, fp32 master weights and optimizer state)\n"
            "                 or fp32 (plain fp32 GEMMs, as the CPU)\n"
            "  --model DIR    start from a Hugging Face checkpoint (converted to fp32); its vocabulary must hold K + 2 ids\n"
            "  --task         copy (default) or reverse: BOS s1..sL SEP, then the answer; only the answer is scored\n"
            "  --steps N      optimizer steps (default 300)\n"
            "  --batch B      sequences per step (default 16)\n"
            "  --seq L        symbols per example (default 6): each sequence is 2L + 2 tokens\n"
            "  --symbols K    distinct symbols (default 10): guessing scores ln(K) per answer token\n"
            "  --lr X         peak learning rate (default 1e-2), reached after --warmup steps (default 20)\n"
            "  --min-lr X     where the cosine decay ends at the last step (default lr / 10)\n"
            "  --wd X         AdamW decoupled weight decay on the matrices (default 0.01; norms and biases: none)\n"
            "  --clip X       clip the global gradient norm to X (default 1; 0 = off)\n"
            "  --seed S       init and training data (default 1); held-out examples use another stream\n"
            "  --log-every N  a table row every N steps (default 10; the first and last step always)\n"
            "  --eval N       held-out examples decoded at the end (default 100)\n"
            "  --ckpt-dir DIR checkpoints (model, AdamW moments, step, data RNG) into DIR/step-NNNNNN, written atomically\n"
            "  --ckpt-every K a checkpoint every K steps (default 100) and at the last step\n"
            "  --ckpt-async   snapshot to memory on the training thread, write on a background thread (default: sync)\n"
            "  --keep N       keep only the N newest complete checkpoints (default 0 = all)\n"
            "  --resume       continue from DIR's newest complete checkpoint (same options; from step 0 if none)\n"
            "  --stop-at S    stop after step S as if the job were killed there (to try --resume)\n"
            "  --loss-log F   write each step's loss and gradient norm to F, exactly (C99 hex floats)\n"
            "under mpirun (data parallelism: --batch is the global batch, each rank trains batch / ranks rows):\n"
            "  --bucket-kb K  all-reduce the gradients in buckets of >= K KiB, each started as soon as the backward of\n"
            "                 its layers is done (default 64; 0 = one all-reduce after the whole backward)\n"
            "  --check-every K compare the ranks' weight hashes every K steps (default 50) and at the end (with\n"
            "                 --device cuda each rank downloads its weights from the GPU for it at those steps)\n"
            "  --collective-timeout S  the watchdog: a collective not complete after S s (default 30) ends the job\n"
            "                 (longer than a synchronous checkpoint write: the other ranks wait for rank 0's)\n"
            "  --event-log F  rank 0 appends timestamped events (start, step, checkpoint, end) to F for the launcher\n"
            "  --pid-dir DIR  each rank writes its process id to DIR/rank-<r>.pid\n"
            "  --hang-rank R --hang-at-step S  fault injection: rank R stops answering at step S (the watchdog test)\n"
            "  --flip-rank R --flip-at-step S  fault injection: rank R flips one bit of one weight after step S (the\n"
            "                 replicas diverge: the next hash comparison must end the job)\n"
            "  --save DIR     after training, write a Hugging Face directory (config.json, model.safetensors,\n"
            "                 tokenizer.json of the task's symbols) that generate --model DIR runs; DIR must not exist\n"
            "                 or be empty\n"
            "  --save-dtype   fp32 (default: the trained values exactly) or bf16 (rounded to nearest)\n"
            "  --grad-dump DIR  train nothing: write the starting model (fp32, as --save), the first step's batch\n"
            "                 (batch.json), loss (c_loss.json) and gradients before clipping (c_grads.safetensors) to DIR,\n"
            "                 for tools/make_grad_goldens.py to redo with PyTorch autograd (one process, no mpirun)\n");
}

// One line of the event log: wall-clock time (unix seconds), then the event. Flushed at once: the
// launcher reads the file while the job runs, and a SIGKILL must not lose what was written.
__attribute__((format(printf, 2, 3))) static void event(FILE *f, const char *fmt, ...) {
    if (!f) return;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    fprintf(f, "%.6f ", (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fflush(f);
}

int main(int argc, char **argv) {
    cpu_env_init(argv);  // may re-execute the program: before MPI_Init
    const char *model_dir = NULL, *preset = NULL, *task_s = "copy", *device_s = "cpu", *matmul_s = NULL;
    int steps = 300, B = 16, L = 6, n_sym = 10, warmup = 20, log_every = 10, n_eval = 100;
    double lr = 1e-2, min_lr = -1, wd = 0.01, clip = 1.0;
    uint64_t seed = 1;
    const char *ckpt_dir = NULL, *loss_log = NULL;  // checkpoints (ckpt.h)
    int ckpt_every = 100, ckpt_async = 0, ckpt_keep = 0, resume = 0, stop_at = 0;
    const char *save_dir = NULL, *save_dtype_s = "fp32", *grad_dump = NULL;
    const char *event_log = NULL, *pid_dir = NULL;  // data parallelism (ddp.h)
    int bucket_kb = 64, check_every = 50, hang_rank = -1, hang_at = 0, flip_rank = -1, flip_at = 0;
    double coll_timeout = 30;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--model") && more) model_dir = argv[++i];
        else if (!strcmp(a, "--preset") && more) preset = argv[++i];
        else if (!strcmp(a, "--task") && more) task_s = argv[++i];
        else if (!strcmp(a, "--device") && more) device_s = argv[++i];
        else if (!strcmp(a, "--matmul") && more) matmul_s = argv[++i];
        else if (!strcmp(a, "--steps") && more) steps = (int)arg_int(a, argv[++i], 1, 10000000);
        else if (!strcmp(a, "--batch") && more) B = (int)arg_int(a, argv[++i], 1, 4096);
        else if (!strcmp(a, "--seq") && more) L = (int)arg_int(a, argv[++i], 1, 1000);
        else if (!strcmp(a, "--symbols") && more) n_sym = (int)arg_int(a, argv[++i], 2, 1 << 20);
        else if (!strcmp(a, "--lr") && more) lr = arg_float(a, argv[++i], 0, 10, ARG_LO_OPEN);
        else if (!strcmp(a, "--min-lr") && more) min_lr = arg_float(a, argv[++i], 0, 10, 0);
        else if (!strcmp(a, "--warmup") && more) warmup = (int)arg_int(a, argv[++i], 0, 10000000);
        else if (!strcmp(a, "--wd") && more) wd = arg_float(a, argv[++i], 0, 10, 0);
        else if (!strcmp(a, "--clip") && more) clip = arg_float(a, argv[++i], 0, 1e9, 0);
        else if (!strcmp(a, "--seed") && more) seed = arg_u64(a, argv[++i]);
        else if (!strcmp(a, "--log-every") && more) log_every = (int)arg_int(a, argv[++i], 1, 10000000);
        else if (!strcmp(a, "--eval") && more) n_eval = (int)arg_int(a, argv[++i], 0, 1000000);
        else if (!strcmp(a, "--ckpt-dir") && more) ckpt_dir = argv[++i];
        else if (!strcmp(a, "--ckpt-every") && more) ckpt_every = (int)arg_int(a, argv[++i], 1, 10000000);
        else if (!strcmp(a, "--ckpt-async")) ckpt_async = 1;
        else if (!strcmp(a, "--keep") && more) ckpt_keep = (int)arg_int(a, argv[++i], 0, 1000000);
        else if (!strcmp(a, "--resume")) resume = 1;
        else if (!strcmp(a, "--stop-at") && more) stop_at = (int)arg_int(a, argv[++i], 1, 10000000);
        else if (!strcmp(a, "--loss-log") && more) loss_log = argv[++i];
        else if (!strcmp(a, "--event-log") && more) event_log = argv[++i];
        else if (!strcmp(a, "--pid-dir") && more) pid_dir = argv[++i];
        else if (!strcmp(a, "--bucket-kb") && more) bucket_kb = (int)arg_int(a, argv[++i], 0, 1 << 20);
        else if (!strcmp(a, "--check-every") && more) check_every = (int)arg_int(a, argv[++i], 1, 10000000);
        else if (!strcmp(a, "--collective-timeout") && more) coll_timeout = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--hang-rank") && more) hang_rank = (int)arg_int(a, argv[++i], 0, 1 << 20);
        else if (!strcmp(a, "--hang-at-step") && more) hang_at = (int)arg_int(a, argv[++i], 1, 10000000);
        else if (!strcmp(a, "--flip-rank") && more) flip_rank = (int)arg_int(a, argv[++i], 0, 1 << 20);
        else if (!strcmp(a, "--flip-at-step") && more) flip_at = (int)arg_int(a, argv[++i], 1, 10000000);
        else if (!strcmp(a, "--save") && more) save_dir = argv[++i];
        else if (!strcmp(a, "--save-dtype") && more) save_dtype_s = argv[++i];
        else if (!strcmp(a, "--grad-dump") && more) grad_dump = argv[++i];
        else if (!strcmp(a, "--json") || !strcmp(a, "--csv")) continue;
        else arg_help_or_unknown(a, usage);
    }
    if (!!model_dir + !!preset != 1) {
        usage(stderr);
        arg_die("need exactly one of --preset tiny / --model DIR (or --preset small)");
    }
    if (preset && strcmp(preset, "tiny") && strcmp(preset, "small"))
        arg_die("--preset: '%s' is not a preset (allowed: tiny, small)", preset);
    if (strcmp(device_s, "cpu") && strcmp(device_s, "cuda"))
        arg_die("--device: '%s' is not a device (allowed: cpu, cuda)", device_s);
    const int on_gpu = !strcmp(device_s, "cuda");
    TrainGpuMath gmath = TRAIN_GPU_BF16;
    if (matmul_s && !on_gpu) arg_die("--matmul: only with --device cuda (the CPU computes in fp32)");
    if (matmul_s && !strcmp(matmul_s, "fp32")) gmath = TRAIN_GPU_FP32;
    else if (matmul_s && strcmp(matmul_s, "bf16")) arg_die("--matmul: '%s' is not a mode (allowed: bf16, fp32)", matmul_s);
    if (on_gpu && grad_dump) arg_die("--grad-dump: runs on the CPU (without --device cuda)");
    if (on_gpu && flip_rank >= 0)
        arg_die("--flip-rank: flips a bit of the host's weights, and with --device cuda they live on the GPU");
    TaskKind task;
    if (task_parse(task_s, &task)) arg_die("--task: '%s' is not a task (allowed: copy, reverse)", task_s);
    StDtype save_dtype = ST_F32;
    if (!strcmp(save_dtype_s, "bf16")) save_dtype = ST_BF16;
    else if (strcmp(save_dtype_s, "fp32")) arg_die("--save-dtype: '%s' is not a dtype (allowed: fp32, bf16)", save_dtype_s);
    if (min_lr < 0) min_lr = lr / 10;
    if (min_lr > lr) arg_die("--min-lr: %g is above --lr %g", min_lr, lr);
    if (warmup >= steps) arg_die("--warmup: %d is not below --steps %d", warmup, steps);
    const int T = task_seq_len(L);
    if (!ckpt_dir && (resume || ckpt_async || ckpt_keep))
        arg_die("--resume, --ckpt-async and --keep need --ckpt-dir DIR");
    if ((hang_rank >= 0) != (hang_at > 0)) arg_die("--hang-rank and --hang-at-step go together");
    if ((flip_rank >= 0) != (flip_at > 0)) arg_die("--flip-rank and --flip-at-step go together");
    if (grad_dump && (save_dir || ckpt_dir)) arg_die("--grad-dump trains nothing: it does not go with --save or --ckpt-dir");

    Ddp dp;
    ddp_init(&dp, &argc, &argv, coll_timeout, (size_t)bucket_kb * 1024 / sizeof(float));
    const int rank = dp.rank, world = dp.world, lead = rank == 0;
    int row0 = 0, Br = B;  // this rank's rows of the global batch
    if (ddp_shard(B, world, rank, &row0, &Br))
        arg_die("--batch %d: the global batch must split evenly over the %d ranks", B, world);
    // --device cuda under mpirun: one rank per GPU, NCCL for the gradients (ddp_nccl.h); with one
    // rank too (mpirun -np 1 takes the same path) when the build has NCCL
    const int nccl_on = on_gpu && dp.mpi && (world > 1 || ddp_nccl_available());
    if (hang_rank >= world) arg_die("--hang-rank %d: there are %d ranks", hang_rank, world);
    if (flip_rank >= world) arg_die("--flip-rank %d: there are %d ranks", flip_rank, world);
    if (pid_dir) {
        char pf[1024];
        snprintf(pf, sizeof pf, "%s/rank-%d.pid", pid_dir, rank);
        FILE *f = fopen_check(pf, "w");
        fprintf(f, "%ld\n", (long)getpid());
        if (fclose(f)) die("%s: write failed", pf);
    }

    char err[512];
    if (save_dir && train_export_check_dir(save_dir, err, sizeof err)) arg_die("--save: %s", err);  // before training
    if (grad_dump && world > 1) arg_die("--grad-dump: one process (not under mpirun with %d ranks)", world);
    if (grad_dump && train_export_check_dir(grad_dump, err, sizeof err)) arg_die("--grad-dump: %s", err);
    if (grad_dump && n_sym > EXPORT_MAX_SYMBOLS)
        arg_die("--grad-dump: the exported tokenizer has text for at most %d symbols (--symbols %d)", EXPORT_MAX_SYMBOLS, n_sym);
    if (save_dir && n_sym > EXPORT_MAX_SYMBOLS)
        arg_die("--save: the exported tokenizer has text for at most %d symbols (--symbols %d)", EXPORT_MAX_SYMBOLS, n_sym);
    ModelWeights w;
    TrainModel m;
    if (model_dir) {
        if (model_load(model_dir, &w, err, sizeof err)) die("%s", err);
        if (train_model_from_weights(&w, &m, err, sizeof err)) die("%s", err);
        model_free(&w);
        if (m.cfg.vocab < TASK_SYM0 + n_sym)
            arg_die("--symbols %d: %s has a vocabulary of %d, smaller than the task's %d ids (symbols + BOS + SEP)", n_sym,
                    model_dir, m.cfg.vocab, TASK_SYM0 + n_sym);
    } else {
        ModelConfig c;
        const int small = !strcmp(preset, "small");
        if (hf_config_parse(small ? SMALL_JSON : TINY_JSON, small ? "preset small" : "preset tiny", &c, err, sizeof err))
            die("%s", err);
        c.vocab = TASK_SYM0 + n_sym;
        if (train_model_new(&c, &m, err, sizeof err)) die("%s", err);
        train_model_init_random(&m, seed);
    }
    const ModelConfig *c = &m.cfg;
    char preset_name[64];
    snprintf(preset_name, sizeof preset_name, "preset %s", preset ? preset : "");
    if (T > c->max_pos) arg_die("--seq %d: sequences of %d tokens exceed the model's %d positions", L, T, c->max_pos);
    // the GPU copy of the model (train_gpu.h), before anything is trained or printed
    TrainGpu *gpu = NULL;
    char gpu_desc[512] = "";
    DdpNccl nc = {0};
    if (nccl_on) ddp_nccl_init(&nc, &dp);  // picks this rank's GPU: before train_gpu_new allocates
    if (on_gpu && !(gpu = train_gpu_new(&m, Br, T, gmath, gpu_desc, sizeof gpu_desc, err, sizeof err))) die("%s", err);

    Table *tb = table_new(on_gpu ? "step08 training on the GPU: loss, gradient norm, learning rate, tokens/s"
                                 : "step08 training on the CPU (fp32): loss, gradient norm, learning rate, tokens/s");
    table_std_meta(tb);
    if (on_gpu) table_meta(tb, "device", "cuda: %s", gpu_desc);
    else table_meta(tb, "device", "cpu: %s", cpu_env_describe());
    table_meta(tb, "model", "%s %s: d %d, %d layers, %d/%d heads, head_dim %d, ff %d, vocab %d%s%s%s; %zu parameters",
               model_dir ? model_dir : preset_name, model_arch_name(c->arch), c->hidden, c->n_layers, c->n_heads,
               c->n_kv_heads, c->head_dim, c->intermediate, c->vocab, c->tie_embeddings ? ", tied" : "",
               c->qkv_bias ? ", qkv bias" : "", c->qk_norm ? ", q/k norm" : "", m.n_params);
    table_meta(tb, "task", "%s of %d symbols out of %d: %d tokens per sequence, %d scored; guessing loss ln(%d) = %.3f",
               task_name(task), L, n_sym, T, L, n_sym, log((double)n_sym));
    table_meta(tb, "optimizer", "AdamW beta 0.9/0.95 eps 1e-8, wd %g on matrices; clip %g; lr %g, warmup %d, cosine to %g "
               "at step %d; batch %d (%d tokens)", wd, clip, lr, warmup, min_lr, steps, B, B * T);
    if (nccl_on)
        table_meta(tb, "ddp", "%d rank%s (MPI), one GPU each (this one: GPU %d), %d sequences each (rows %d.. of the global "
                   "%d); gradients all-reduced by NCCL on a comm stream in buckets of >= %d KiB started during the "
                   "backward%s; weights' hashes compared every %d steps; watchdog %g s per collective", world,
                   world == 1 ? "" : "s", nc.device, Br, row0, B, bucket_kb,
                   bucket_kb ? "" : " (0: one all-reduce after the backward)", check_every, coll_timeout);
    else if (world > 1)
        table_meta(tb, "ddp", "%d ranks (MPI), %d sequences each (rows %d.. of the global %d); gradients all-reduced in "
                   "buckets of >= %d KiB started during the backward%s; weights' hashes compared every %d steps; "
                   "watchdog %g s per collective", world, Br, row0, B, bucket_kb,
                   bucket_kb ? "" : " (0: one all-reduce after the backward)", check_every, coll_timeout);
    table_meta(tb, "tok_s", "B * T tokens (all ranks) / wall time of one step (batch, forward, backward, all-reduce, clip, "
               "update)%s", on_gpu ? "; on the GPU the step ends with a device synchronize, so the host clock measures it" : "");
    table_col(tb, "step", "%.0f");
    table_col(tb, "loss", "%.4f");
    table_col(tb, "grad_norm", "%.4f");
    table_col(tb, "lr", "%.3e");
    table_col(tb, "tok_s", "%.0f");

    TrainActs a = {0};
    if (!gpu) train_acts_new(c, Br, T, &a);  // the GPU keeps its own
    AdamW opt;
    adamw_new(&opt, m.n_params);
    const AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = (float)wd};
    int *ids = xmalloc((size_t)B * T * sizeof(int)), *tg = xmalloc((size_t)B * T * sizeof(int));
    Rng data;
    rng_seed(&data, seed * 2 + 1);
    if (grad_dump) {  // step 1's batch, forward and backward; no clipping, no update
        task_make_batch(task, &data, B, L, n_sym, ids, tg);
        train_zero_grad(&m);
        const double loss1 = train_forward(&m, &a, ids, tg, B, T);
        if (loss1 < 0) die("train_forward failed");
        train_backward(&m, &a);
        const TrainGradDump g = {.ids = ids, .targets = tg, .B = B, .T = T, .loss = loss1, .n_counted = a.n_counted};
        if (train_export_grad_dump(&m, grad_dump, n_sym, &g, err, sizeof err)) die("--grad-dump: %s", err);
        table_meta(tb, "grad_dump", "%s: the starting model (fp32), step 1's batch (%d x %d, %d targets counted), its "
                   "loss and gradients before clipping; nothing trained", grad_dump, B, T, a.n_counted);
        table_row(tb);
        table_num(tb, "step", 1);
        table_num(tb, "loss", loss1);
        table_num(tb, "grad_norm", grad_global_norm_clip(m.grads, m.n_params, 0));
        table_num(tb, "lr", lr_schedule(0, warmup, steps, (float)lr, (float)min_lr));
        table_print(tb, outfmt_from_args(argc, argv), stdout);
        table_free(tb);
        free(ids), free(tg);
        adamw_free(&opt);
        train_acts_free(&a);
        train_model_free(&m);
        ddp_finalize(&dp);
        return 0;
    }
    // Checkpoints: the options a resume must match, the newest complete checkpoint, the writer.
    int s0 = 0;
    CkptWriter ckw;
    if (ckpt_dir) {
        CkptKV kv[CKPT_MAX_KV];
        int nkv = 0;
        nkv = ckpt_kv_set(kv, nkv, "model", "%s", model_dir ? model_dir : preset_name);
        nkv = ckpt_kv_set(kv, nkv, "task", "%s", task_name(task));
        nkv = ckpt_kv_set(kv, nkv, "steps", "%d", steps);
        nkv = ckpt_kv_set(kv, nkv, "batch", "%d", B);
        nkv = ckpt_kv_set(kv, nkv, "seq", "%d", L);
        nkv = ckpt_kv_set(kv, nkv, "symbols", "%d", n_sym);
        nkv = ckpt_kv_set(kv, nkv, "lr", "%.17g", lr);
        nkv = ckpt_kv_set(kv, nkv, "min_lr", "%.17g", min_lr);
        nkv = ckpt_kv_set(kv, nkv, "warmup", "%d", warmup);
        nkv = ckpt_kv_set(kv, nkv, "wd", "%.17g", wd);
        nkv = ckpt_kv_set(kv, nkv, "clip", "%.17g", clip);
        nkv = ckpt_kv_set(kv, nkv, "seed", "%llu", (unsigned long long)seed);
        // ranks and buckets: the per-rank batch and the order of the gradient sums depend on them
        nkv = ckpt_kv_set(kv, nkv, "world_size", "%d", world);
        nkv = ckpt_kv_set(kv, nkv, "bucket_kb", "%d", world > 1 ? bucket_kb : 0);
        // rank 0 alone writes (every rank holds the same state)
        if (lead && ckpt_writer_init(&ckw, ckpt_dir, ckpt_async, ckpt_keep, kv, nkv, err, sizeof err)) die("%s", err);
        if (gpu) ckpt_writer_set_alloc(&ckw, train_gpu_host_alloc, train_gpu_host_free);  // pinned: a fast download
        char latest[2048], skipped[512];
        const int found = resume ? ckpt_latest(ckpt_dir, latest, sizeof latest) : 0;
        if (resume) {
            long from = 0;
            if (found) {
                CkptState st;
                if (ckpt_load(latest, &m, &opt, &st, kv, nkv, err, sizeof err)) die("--resume: %s", err);
                if (st.step >= steps) die("--resume: %s is at step %ld, the end of --steps %d: nothing to train", latest, st.step, steps);
                s0 = (int)st.step, data = st.data, from = st.step;
                table_meta(tb, "resume", "from %s: step %ld done, AdamW t %ld; training steps %d..%d", latest, st.step,
                           st.adam_t, s0 + 1, steps);
            } else {
                table_meta(tb, "resume", "no complete checkpoint in %s: starting at step 1", ckpt_dir);
            }
            const int n_inc = ckpt_incomplete_after(ckpt_dir, from, skipped, sizeof skipped);
            if (n_inc && lead) {
                fprintf(stderr, "train: --resume: skipped %s in %s: no DONE marker (the write was interrupted); %s\n",
                        skipped, ckpt_dir, found ? "resuming from the newest complete checkpoint" : "starting at step 1");
                table_meta(tb, "resume_skipped", "%s: no DONE marker (incomplete, never read)", skipped);
            }
            // every rank must have loaded the same state
            ddp_check_same(&dp, ddp_hash_floats(m.params, m.n_params), "weights after the resume");
        }
    }
    if (world > 1 && !resume) ddp_check_same(&dp, ddp_hash_floats(m.params, m.n_params), "initial weights");
    if (gpu) train_gpu_upload(gpu, &m, 0), train_gpu_upload_adamw(gpu, &opt);  // a resumed state goes up too
    FILE *flog = loss_log && lead ? fopen_check(loss_log, "w") : NULL;
    FILE *fev = event_log && lead ? fopen_check(event_log, "a") : NULL;
    event(fev, "start world=%d resume_from=%d steps=%d pid=%ld", world, s0, steps, (long)getpid());
    double t_train = 0, t_fwd = 0, t_bwd = 0, t_opt = 0, t_comm = 0, loss = 0, t_first = 0, t_download = 0;
    for (int s = s0; s < steps; s++) {
        if (rank == hang_rank && s + 1 == hang_at) {  // fault injection: alive, but never answers again
            fprintf(stderr, "train: rank %d: --hang-at-step %d: this rank stops answering (the others' watchdog must "
                    "end the job)\n", rank, hang_at);
            fflush(stderr);
            for (;;) pause();
        }
        const double t0 = now_sec();
        // every rank draws the whole global batch (one data stream, the same on every rank and in
        // a checkpoint) and trains on its own rows
        task_make_batch(task, &data, B, L, n_sym, ids, tg);
        double t1, t2, t2b;
        if (gpu) {  // forward + backward in one call (the grads are zeroed on the device), on this rank's rows
            t1 = now_sec();
            dp.step = s + 1;  // for the watchdog's messages
            if (nccl_on) ddp_nccl_grads_begin(&nc, train_gpu_grads(gpu), m.n_params, s + 1);
            loss = train_gpu_forward_backward_hooked(gpu, ids + (size_t)row0 * T, tg + (size_t)row0 * T, NULL,
                                                     nccl_on ? ddp_nccl_grad_ready : NULL, &nc);
            if (loss < 0) die("train_gpu_forward_backward failed");
            t2 = t2b = now_sec();
            if (nccl_on) ddp_nccl_grads_finish(&nc);  // the device grads are the mean over the ranks
        } else {
            train_zero_grad(&m);
            t1 = now_sec();
            loss = train_forward(&m, &a, ids + (size_t)row0 * T, tg + (size_t)row0 * T, Br, T);
            if (loss < 0) die("train_forward failed");
            t2 = now_sec();
            ddp_grads_begin(&dp, m.grads, m.n_params, s + 1);
            train_backward_hooked(&m, &a, ddp_grad_ready, &dp);
            t2b = now_sec();
            ddp_grads_finish(&dp);  // every rank now holds the mean gradient of the global batch
        }
        if (world > 1) {  // the global loss: the mean of the ranks' (each shard scores the same count)
            ddp_allreduce_sum_f64(&dp, &loss, 1, "the loss all-reduce");
            loss /= world;
        }
        const double t3 = now_sec();
        t_comm += t3 - t2b;
        const double gn = gpu ? train_gpu_clip(gpu, clip) : grad_global_norm_clip(m.grads, m.n_params, clip);
        const float lr_s = lr_schedule(s, warmup, steps, (float)lr, (float)min_lr);
        if (gpu) train_gpu_adamw_step(gpu, &ac, lr_s);  // returns after a device synchronize
        else train_adamw_step(&m, &opt, &ac, lr_s);
        const double t4 = now_sec(), dt = t4 - t0;
        t_train += dt, t_fwd += t2 - t1, t_bwd += t2b - t2, t_opt += t4 - t3;
        if (s == s0) t_first = dt;
        if (!isfinite(loss) || !isfinite(gn)) die("step %d: loss %g, gradient norm %g: diverged (lower --lr?)", s, loss, gn);
        if (flog) fprintf(flog, "%d %a %a\n", s + 1, loss, gn), fflush(flog);
        event(fev, "step %d loss=%.6f", s + 1, loss);
        if (rank == flip_rank && s + 1 == flip_at) {  // fault injection: a silent bit flip in one replica
            uint32_t bits;
            memcpy(&bits, &m.params[m.n_params / 2], 4);
            bits ^= 1u << 3;
            memcpy(&m.params[m.n_params / 2], &bits, 4);
        }
        if (world > 1 && ((s + 1) % check_every == 0 || s + 1 == steps || (stop_at && s + 1 == stop_at))) {
            if (gpu) train_gpu_download(gpu, &m);  // the weights live on the GPU
            ddp_check_same(&dp, ddp_hash_floats(m.params, m.n_params), "weights");
        }
        if (ckpt_dir && lead && ((s + 1) % ckpt_every == 0 || s + 1 == steps)) {
            if (gpu) {  // params, m and v from the device straight into the writer's pinned snapshot
                float *snap = ckpt_snapshot_begin(&ckw, m.n_params, err, sizeof err);
                if (!snap) die("%s", err);
                const double td = now_sec();
                long adam_t = 0;
                train_gpu_snapshot(gpu, snap, snap + m.n_params, snap + 2 * m.n_params, &adam_t);
                t_download += now_sec() - td;
                const CkptState st = {.step = s + 1, .adam_t = adam_t, .data = data, .world_size = world};
                if (ckpt_snapshot_commit(&ckw, &m, &st, err, sizeof err)) die("%s", err);
            } else {
                const CkptState st = {.step = s + 1, .adam_t = opt.t, .data = data, .world_size = world};
                if (ckpt_save(&ckw, &m, &opt, &st, err, sizeof err)) die("%s", err);
            }
            event(fev, "ckpt %d %s", s + 1, ckpt_async ? "started" : "written");
        }
        if (lead && (s == 0 || s == steps - 1 || (s + 1) % log_every == 0)) {
            table_row(tb);
            table_num(tb, "step", s + 1);
            table_num(tb, "loss", loss);
            table_num(tb, "grad_norm", gn);
            table_num(tb, "lr", lr_s);
            table_num(tb, "tok_s", B * T / dt);
        }
        if (stop_at && s + 1 == stop_at) break;
    }
    if (flog && fclose(flog)) die("%s: write failed", loss_log);
    if (gpu) train_gpu_download(gpu, &m), train_gpu_download_adamw(gpu, &opt);  // for the evaluation and --save
    DdpNccl ncs = nc;  // the counts, for the table
    if (nccl_on) ddp_nccl_free(&nc);  // every rank is here together (rank 0 alone goes on below)
    // the ranks part here: what follows (the last checkpoint write, the held-out decoding, --save)
    // is rank 0's alone and may take longer than any collective's deadline
    ddp_barrier(&dp, "the barrier after the last step");
    const int steps_run = (stop_at && stop_at < steps ? stop_at : steps) - s0;
    if (world > 1)
        table_meta(tb, "replicas", "the weights are identical on all %d ranks (xxHash64 %016llx, compared every %d steps "
                   "and at the end)", world, (unsigned long long)ddp_hash_floats(m.params, m.n_params), check_every);
    if (ckpt_dir && lead) {
        const double stall_in_loop = ckw.stall_s;
        char keep_s[32] = "all";
        if (ckpt_keep) snprintf(keep_s, sizeof keep_s, "the newest %d", ckpt_keep);
        if (ckpt_wait(&ckw, err, sizeof err)) die("%s", err);
        table_meta(tb, "checkpoint", "%d written to %s (%s, every %d steps, keep %s): training thread stalled %.4f s = %.2f%% of "
                   "the training time; writes took %.4f s (%.2f ms each)%s", ckw.n_written, ckpt_dir,
                   ckpt_async ? "async" : "sync", ckpt_every, keep_s, ckw.stall_s,
                   100 * ckw.stall_s / t_train, ckw.write_total_s, ckw.n_written ? 1e3 * ckw.write_total_s / ckw.n_written : 0,
                   ckpt_async ? " on the writer thread" : ", all of it on the training thread");
        if (ckpt_async)
            table_meta(tb, "ckpt_stall", "async: snapshots (memcpy of params, m and v, %.2f MB each time) %.4f s, waits for "
                       "the previous write %.4f s, for the last write at the end %.4f s", 12e-6 * m.n_params, ckw.snapshot_s,
                       stall_in_loop - ckw.snapshot_s, ckw.stall_s - stall_in_loop);
        if (gpu)
            table_meta(tb, "ckpt_download", "device -> host copies of params, m and v (%.2f MB each time) before each "
                       "checkpoint, into pinned host memory: %.4f s in all (%.1f GB/s), counted in the stall above",
                       12e-6 * m.n_params, t_download, t_download > 0 ? 12e-9 * m.n_params * ckw.n_written / t_download : 0);
        ckpt_writer_free(&ckw);
    }
    table_meta(tb, "train_time", "%.2f s for %d steps: %.0f tokens/s on average", t_train, steps_run,
               (double)steps_run * B * T / t_train);
    if (nccl_on)
        table_meta(tb, "allreduce", "%ld bucket all-reduces by NCCL (%.1f per step); exposed on the device (the end of the "
                   "backward to the end of the last all-reduce and the 1/%d scaling, CUDA events) %.4f s = %.1f%% of the "
                   "training time (what the backward did not hide, and the wait for a slower rank); the host blocked in "
                   "the watchdog's wait %.4f s; enqueueing buckets during the backward %.4f s", ncs.n_allreduce,
                   (double)ncs.n_allreduce / (steps_run ? steps_run : 1), world, ncs.exposed_s,
                   100 * ncs.exposed_s / t_train, ncs.wait_s, ncs.enqueue_s);
    else if (world > 1)
        table_meta(tb, "allreduce", "%ld bucket all-reduces (%.1f per step); waiting for them after the backward %.4f s "
                   "= %.1f%% of the training time (what the backward did not hide, and the wait for a slower rank); "
                   "starting and testing them during the backward %.4f s", dp.n_allreduce, (double)dp.n_allreduce / (steps_run ? steps_run : 1),
                   dp.exposed_s, 100 * dp.exposed_s / t_train, dp.poll_s);
    if (gpu && steps_run > 1) {  // the first step pays for cuBLAS's setup: left out
        const double ts = (t_train - t_first) / (steps_run - 1), tok = (double)B * T;
        const double tflops = 6.0 * (double)m.n_params * tok / ts * 1e-12;
        table_meta(tb, "gpu_rate", "%.0f tokens/s; model FLOP/s = 6 x %zu params x %.0f tokens / step time = %.3f TFLOP/s "
                   "(steps 2..%d, %.3f ms each, host clock around each step, which ends with a device synchronize; the "
                   "6 N D count leaves out attention's T^2 terms)", tok / ts, m.n_params, tok, tflops, steps_run, 1e3 * ts);
        // the ceiling the rate is put against: cuBLAS's dense GEMM of the same math, measured now
        const int dt_gemm = gmath == TRAIN_GPU_FP32 ? 0 : 2;
        const double gms = roofline_gpu_gemm_ms(dt_gemm, 8192, 8192, 8192, 20);
        if (gms > 0) {
            const double ceil_tf = 2.0 * 8192.0 * 8192.0 * 8192.0 / (gms * 1e-3) * 1e-12;
            table_meta(tb, "gpu_ceiling", "%.1f%% of the dense GEMM ceiling%s: cuBLAS %s GEMM 8192^3 = %.1f TFLOP/s, measured "
                       "now (CUDA events, median of 20, step01 roofline_gpu_gemm_ms)",
                       100 * tflops / (ceil_tf * world),
                       world > 1 ? " of all the ranks' GPUs (ranks x one GPU's)" : "",
                       dt_gemm ? "bf16 (fp32 accumulate)" : "fp32 (no TF32)", ceil_tf);
        }
    }
    char comm_s[64] = "";
    if (world > 1 || nccl_on) snprintf(comm_s, sizeof comm_s, "waiting for the all-reduces %.0f%%, ", 100 * t_comm / t_train);
    if (gpu)
        table_meta(tb, "time_split", "forward + backward (ids up, loss down) %.0f%%, %sclip + AdamW (norm down, synchronize) "
                   "%.0f%%, the rest (batch) %.0f%%", 100 * t_fwd / t_train, comm_s, 100 * t_opt / t_train,
                   100 * (t_train - t_fwd - t_comm - t_opt) / t_train);
    else
        table_meta(tb, "time_split", "forward %.0f%%, backward %.0f%% (%.2f x the forward), %sclip + AdamW %.0f%%, the rest "
                   "(batch, zeroing) %.0f%%", 100 * t_fwd / t_train, 100 * t_bwd / t_train, t_bwd / t_fwd, comm_s,
                   100 * t_opt / t_train, 100 * (t_train - t_fwd - t_bwd - t_comm - t_opt) / t_train);
    // Held-out: a stream the training data never draws from; answered by the engine's forward.
    CpuModel cm;
    train_cpu_view(&m, &cm);
    double tok_acc = 0;
    const double t0 = now_sec();
    const double acc = n_eval && lead ? task_eval(&cm, task, seed ^ 0x5eed5eedULL, n_eval, L, n_sym, &tok_acc) : 0;
    if (n_eval)
        table_meta(tb, "held_out", "%d examples decoded greedily by step03's KV-cached CPU forward: %.1f%% exact, %.1f%% of "
                   "answer tokens right (%.2f s)", n_eval, 100 * acc, 100 * tok_acc, now_sec() - t0);
    else table_meta(tb, "held_out", "none decoded (--eval 0)");
    if (save_dir && lead) {  // train -> serve: the directory generate --model (and transformers) reads
        if (train_export_hf(&m, save_dir, save_dtype, n_sym, err, sizeof err)) die("--save: %s", err);
        char ex[256] = "", s[8], last[8];
        for (int i = 0; i < L && strlen(ex) + 8 < sizeof ex; i++) strcat(ex, export_symbol_text(i % n_sym, s, sizeof s));
        table_meta(tb, "saved", "%s (%s): config.json, model.safetensors, tokenizer.json (ids %d..%d are the symbols "
                   "%s..%s); ask it: generate --model %s --prompt '%s%s%s' --max-new-tokens %d", save_dir, save_dtype_s,
                   TASK_SYM0, TASK_SYM0 + n_sym - 1, export_symbol_text(0, s, sizeof s),
                   export_symbol_text(n_sym - 1, last, sizeof last), save_dir, EXPORT_BOS_TEXT, ex, EXPORT_SEP_TEXT, L);
    }
    if (lead) table_print(tb, outfmt_from_args(argc, argv), stdout);
    table_free(tb);
    event(fev, "end step=%d", s0 + steps_run);
    if (fev) fclose(fev);
    train_cpu_view_free(&cm);
    train_gpu_free(gpu);
    free(ids), free(tg);
    adamw_free(&opt);
    train_acts_free(&a);
    train_model_free(&m);
    ddp_finalize(&dp);  // last: under AddressSanitizer it runs the leak check (ddp.h)
    return 0;
}
