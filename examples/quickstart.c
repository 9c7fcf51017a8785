/* The example of README.md ("Using the library"), compiled and run by the test suite under qcclrun;
 * tests/docs/readme_test.cmake checks that README.md shows the lines between each pair of markers
 * verbatim. Every rank all-reduces a gradient of n floats in place, averages it while it "computes",
 * then averages it again through a 4-bit codec with error feedback; then runs two Marsit rounds on
 * an update (a full-precision one, then a sign one), and two IntSGD rounds on the gradient (the
 * exact first one, then integers). Every qccl call is checked: the first that fails prints its result
 * and the library's message, and the program exits with status 1. */
#include <stdio.h>
#include <stdlib.h>

/* [readme] */
#include <qccl.h>

/* Stops the program at the first failed call, with the result code and the message that names the
 * call, the argument and its value. */
static void check(qcclResult_t result, const char* call, int line) {
  if (result == qcclSuccess) return;
  fprintf(stderr, "quickstart.c:%d: %s: %s: %s\n", line, call, qcclGetErrorString(result), qcclGetLastError(NULL));
  exit(1);
}
#define CHECK(call) check((call), #call, __LINE__)
/* [readme] */

int main(void) {
  const size_t n = 1000003;
  float* grad = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) grad[i] = 1.0f;

  /* [readme] */
  qcclComm_t comm;
  CHECK(qcclCommInitEnv(&comm, NULL));        /* rank and size from qcclrun, torchrun, mpirun or srun */
  CHECK(qcclAllReduce(grad, grad, n, qcclFloat32, qcclSum, comm));  /* in place */

  qcclRequest_t req;                           /* or overlap it with computation */
  CHECK(qcclIAllReduce(grad, grad, n, qcclFloat32, qcclAvg, comm, &req));
  /* ... compute ... */
  CHECK(qcclWait(&req));
  /* [readme] */

  /* Every element is now the rank count: the sum of ones, then the average of equal values. */
  int nranks = 0, rank = 0, wrong = 0;
  CHECK(qcclCommCount(comm, &nranks));
  CHECK(qcclCommUserRank(comm, &rank));
  for (size_t i = 0; i < n; ++i) wrong += grad[i] != (float)nranks;

  /* [readme] */
  qcclCodec_t q4;
  CHECK(qcclCodecCreate("q4:bucket=512,round=stochastic,ef=on", &q4));
  qcclCodecState_t state;                      /* one per tensor: residual and step */
  CHECK(qcclCodecStateCreate(comm, n, &state));
  CHECK(qcclAllReduceCompressed(grad, grad, n, qcclFloat32, qcclAvg, q4, state, comm));
  /* [readme] */

  /* Averaging equal values is exact after quantization too: a constant bucket has step 0. */
  for (size_t i = 0; i < n; ++i) wrong += grad[i] != (float)nranks;
  CHECK(qcclCodecStateDestroy(state));
  CHECK(qcclCodecDestroy(q4));

  float* update = malloc(n * sizeof(float));
  float* step = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) update[i] = 0.25f;
  /* [readme] */
  qcclCodec_t marsit;
  CHECK(qcclCodecCreate("sign:eta_s=0.002,k=100,topology=ring", &marsit));  /* or topology=torus:RxC */
  qcclCodecState_t mstate;                     /* one per tensor: compensation and round */
  CHECK(qcclCodecStateCreate(comm, n, &mstate));
  CHECK(qcclAllReduceCompressed(update, step, n, qcclFloat32, qcclAvg, marsit, mstate, comm));
  /* [readme] */

  /* Round 0 is the full-precision average of equal values; round 1 sends signs, all positive. */
  for (size_t i = 0; i < n; ++i) wrong += step[i] != 0.25f;
  CHECK(qcclAllReduceCompressed(update, step, n, qcclFloat32, qcclAvg, marsit, mstate, comm));
  for (size_t i = 0; i < n; ++i) wrong += step[i] != 0.002f;
  CHECK(qcclCodecStateDestroy(mstate));
  CHECK(qcclCodecDestroy(marsit));
  free(update);
  free(step);

  const double lr = 0.1;
  /* [readme] */
  qcclCodec_t intsgd;
  CHECK(qcclCodecCreate("int8:alpha=lr", &intsgd));  /* or alpha=grad (no learning rate), or alpha=A fixed */
  qcclCodecState_t istate;                     /* one per tensor: alpha's moving average */
  CHECK(qcclCodecStateCreate(comm, n, &istate));
  CHECK(qcclCodecStateSetLearningRate(istate, lr));  /* whenever it changes */
  CHECK(qcclAllReduceCompressed(grad, grad, n, qcclFloat32, qcclAvg, intsgd, istate, comm));
  /* [readme] */

  /* The first round is exact: the average of equal values. The second sends small integers under the
   * shared alpha; their randomized rounding is unbiased, so the values average to the rank count. */
  for (size_t i = 0; i < n; ++i) wrong += grad[i] != (float)nranks;
  CHECK(qcclAllReduceCompressed(grad, grad, n, qcclFloat32, qcclAvg, intsgd, istate, comm));
  double mean = 0;
  for (size_t i = 0; i < n; ++i) mean += grad[i] / (double)n;
  wrong += mean < 0.99 * nranks || mean > 1.01 * nranks;
  CHECK(qcclCodecStateDestroy(istate));
  CHECK(qcclCodecDestroy(intsgd));
  printf("rank %d of %d: %d wrong elements\n", rank, nranks, wrong);
  free(grad);
  CHECK(qcclCommDestroy(comm));
  return wrong != 0;
}
