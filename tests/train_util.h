// train_util.h — the step08 suites' tiny copy-task model, trained the same way by every test that
// needs one (the learning test, the export's serve test).
// defines: TCOPY_L, TCOPY_NSYM, test_train_copy, test_need_mpi
#pragma once
#include "step08_ddp/train.h"

#define TCOPY_L 6      // symbols per example
#define TCOPY_NSYM 10  // distinct symbols

// A Llama (d 48, 2 layers, 4 / 2 heads, head_dim 12, ff 96) over the copy task's vocabulary, random
// init (seed 1), trained `steps` steps on batches of 16 (data seed 2): AdamW (0.9, 0.95, wd 0.01),
// clip 1, lr 1e-2 warmed up 20 steps, cosine to 1e-3. One OpenMP thread while it trains (a test
// process does not set OMP_WAIT_POLICY=passive as the programs do, and libgomp's spinning threads
// then stall OpenBLAS ~10x on 2 cores). m is new (train_model_free it); first and last10 (may be
// NULL) get the first step's loss and the mean of the last 10.
void test_train_copy(TrainModel *m, int steps, double *first, double *last10);
// Skips the test unless the build has MPI (HAVE_MPI) and mpirun is on PATH: the tests of ranks.
void test_need_mpi(void);
