/*
 * qccl.h — the public C API of qccl, a collective-communication library in the style of NCCL whose
 * distinctive feature is compression fused into the pipeline chunks of the collectives.
 *
 * Conventions (they hold for every function below unless its comment says otherwise):
 *   - Every function returns a qcclResult_t. On failure qcclGetLastError() gives one line that names
 *     the call, the argument and the value ("qcclAllReduce: datatype = 42 is not a qcclDataType_t").
 *   - Outputs are written only on success.
 *   - Buffers are owned by the caller. A blocking call may reuse them as soon as it returns; a
 *     non-blocking call (qcclI*) owns them until its request completes. After a call failed with
 *     qcclMismatch, qcclRemoteError, qcclTimeout or qcclAborted, keep its buffers allocated until
 *     qcclCommAbort or qcclCommDestroy has returned on that communicator (as NCCL asks for
 *     ncclCommAbort): a transfer with a peer that stopped answering cannot always be withdrawn (UCX
 *     cannot take back a send it has begun), and only the communicator's teardown ends it. They are host memory, or,
 *     in a build with CUDA, device memory of the calling thread's current CUDA device (see "Device
 *     buffers" below): a call's buffers are all on the host or all on the device. As in NCCL, their
 *     memory is not probed: a recvbuff the process may not write (or a sendbuff it may not read)
 *     faults the process.
 *   - A communicator is used by one thread at a time, as in NCCL. The exceptions: qcclCommAbort,
 *     which any thread may call at any time, and qcclTest and qcclWait, which one other thread (a
 *     completion thread) may call on a communicator's requests while the owning thread goes on
 *     issuing calls on it. Different communicators may be used concurrently.
 *   - Collectives must be called by every rank of the communicator in the same order with matching
 *     arguments. A rank that calls a different collective, count, datatype, op or root is detected
 *     (each message carries a frame header) and the collective fails with qcclMismatch on every rank.
 *   - A dead or stuck peer makes every surviving rank fail with qcclRemoteError or qcclTimeout within
 *     QCCL_TIMEOUT seconds instead of hanging.
 *
 * Result codes are grouped by blast radius:
 *   qcclInvalidArgument, qcclInvalidUsage   nothing was sent; the communicator is intact.
 *   qcclMismatch                            ranks disagreed; the communicator is unusable (abort it).
 *   qcclRemoteError, qcclTimeout, qcclAborted
 *                                           a peer or the communicator failed; unusable (abort it).
 *   qcclSystemError, qcclInternalError      the OS or qccl itself failed.
 *   qcclNonFinite                           a compressed collective completed, but some outputs are
 *                                           NaN or Inf (an input held one, or a value overflowed the
 *                                           codec): every rank holds the same outputs and returns this
 *                                           code; the communicator is intact. Which outputs, and
 *                                           whether they are NaN or keep an Inf, depends on the codec
 *                                           (see qcclAllReduceCompressed).
 */
#ifndef QCCL_H_
#define QCCL_H_

#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__) && !defined(QCCL_API)
#define QCCL_API __attribute__((visibility("default")))
#elif !defined(QCCL_API)
#define QCCL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define QCCL_MAJOR 0
#define QCCL_MINOR 1
#define QCCL_PATCH 0
#define QCCL_VERSION(X, Y, Z) ((X) * 10000 + (Y) * 100 + (Z))
#define QCCL_VERSION_CODE QCCL_VERSION(QCCL_MAJOR, QCCL_MINOR, QCCL_PATCH)

typedef enum {
  qcclSuccess = 0,
  qcclInvalidArgument = 1, /* a bad argument; nothing was sent */
  qcclInvalidUsage = 2,    /* a bad call sequence (e.g. GroupEnd without GroupStart); nothing sent */
  qcclMismatch = 3,        /* ranks called different collectives or passed different arguments */
  qcclRemoteError = 4,     /* a peer died, left, or reported an error */
  qcclTimeout = 5,         /* no progress for QCCL_TIMEOUT seconds */
  qcclAborted = 6,         /* the communicator was aborted (qcclCommAbort) */
  qcclSystemError = 7,     /* a system call or the network failed */
  qcclInternalError = 8,   /* a bug in qccl */
  qcclInProgress = 9,      /* a non-blocking request has not completed yet (never an error) */
  qcclNonFinite = 10,      /* a compressed collective's outputs hold NaN or Inf (see above) */
  qcclNumResults = 11
} qcclResult_t;

/* Datatypes and reduction ops use NCCL's numbering, so that values can be passed straight through. */
typedef enum {
  qcclInt8 = 0,
  qcclUint8 = 1,
  qcclInt32 = 2,
  qcclUint32 = 3,
  qcclInt64 = 4,
  qcclUint64 = 5,
  qcclFloat16 = 6,
  qcclFloat32 = 7,
  qcclFloat64 = 8,
  qcclBfloat16 = 9,
  qcclNumTypes = 10,
  /* Not datatypes: they give the enum the range of int, so that a C++ implementation can receive a
   * bad value (e.g. 42) as an argument to reject rather than as undefined behaviour. */
  qcclDataTypeRangeMin_ = -2147483647 - 1,
  qcclDataTypeRangeMax_ = 2147483647
} qcclDataType_t;

/* Integer sums and products wrap (two's complement). Floating-point reductions are carried out in
 * the datatype itself (fp16/bf16 round to nearest even after every operation, as NCCL does), and,
 * like the codecs, keep subnormal values whatever the calling thread's flush-to-zero mode (x86's FTZ
 * and DAZ, e.g. torch.set_flush_denormal(True)), so that such a rank computes the others' bits.
 * qcclAvg is the sum divided by the rank count: truncated toward zero for integers. max/min of
 * floating-point values propagate NaN. */
typedef enum {
  qcclSum = 0,
  qcclProd = 1,
  qcclMax = 2,
  qcclMin = 3,
  qcclAvg = 4,
  qcclNumOps = 5,
  qcclRedOpRangeMin_ = -2147483647 - 1, /* as for qcclDataType_t: any int is a value to reject */
  qcclRedOpRangeMax_ = 2147483647
} qcclRedOp_t;

typedef struct qcclComm* qcclComm_t;
typedef struct qcclRequest* qcclRequest_t;
typedef struct qcclCodec* qcclCodec_t;
typedef struct qcclCodecState* qcclCodecState_t;
typedef struct qcclCodecStore* qcclCodecStore_t;

#define QCCL_UNIQUE_ID_BYTES 128
/* The root's address and a random 64-bit magic. Copy it to every rank by any side channel; peers
 * presenting another magic are refused. */
typedef struct {
  char internal[QCCL_UNIQUE_ID_BYTES];
} qcclUniqueId;

/* Per-communicator settings. Initialise with QCCL_CONFIG_INITIALIZER, then set what you need; a field
 * left undefined takes its QCCL_* environment variable, else the default in README.md. */
#define QCCL_CONFIG_UNDEF_INT (-2147483647 - 1)
#define QCCL_CONFIG_UNDEF_DOUBLE (-1.0)
typedef struct qcclConfig_v100 {
  size_t size;          /* sizeof(qcclConfig_t): lets later versions grow the struct */
  unsigned int magic;   /* QCCL_CONFIG_MAGIC */
  unsigned int version; /* QCCL_VERSION_CODE of the header the caller compiled with */
  double timeoutSeconds;  /* QCCL_TIMEOUT: fail after this long without progress; 0 = never */
  int chunkBytes;         /* QCCL_CHUNK_BYTES: pipeline chunk size */
  int pipelineDepth;      /* QCCL_PIPELINE_DEPTH: chunks in flight per collective */
  const char* algorithms; /* QCCL_ALGO: force algorithms by name, e.g. "allreduce=ring" */
  const char* codec;      /* QCCL_CODEC: compress plain qcclAllReduce calls, e.g. "q8" (see below) */
  double codecMinBytes;   /* QCCL_CODEC_MIN_BYTES: only messages at least this large are compressed */
} qcclConfig_t;
#define QCCL_CONFIG_MAGIC 0x7143436cu
#define QCCL_CONFIG_INITIALIZER                                                           \
  {                                                                                       \
    sizeof(qcclConfig_t), QCCL_CONFIG_MAGIC, QCCL_VERSION_CODE, QCCL_CONFIG_UNDEF_DOUBLE, \
        QCCL_CONFIG_UNDEF_INT, QCCL_CONFIG_UNDEF_INT, NULL, NULL, QCCL_CONFIG_UNDEF_DOUBLE \
  }

/* What the last completed collective of a communicator did, on this rank. */
typedef struct qcclStats_v100 {
  size_t size;                /* set by the caller to sizeof(qcclStats_t) */
  uint64_t wireBytesSent;     /* payload bytes this rank put on the wire (frame headers excluded) */
  uint64_t wireBytesReceived; /* payload bytes this rank took off the wire */
  double seconds;             /* from the call to completion */
  uint64_t sequence;          /* the collective's sequence number on this communicator */
  char algorithm[32];         /* the algorithm that ran, as named in the registry */
  /* Compressed collectives (1, 0, 0 otherwise): */
  double compressionRatio;    /* bytes the uncompressed algorithm would send / wireBytesSent */
  double encodeSeconds;       /* time this rank spent encoding */
  double decodeSeconds;       /* time this rank spent decoding and accumulating */
  double wireSeconds;         /* the rest: seconds - encodeSeconds - decodeSeconds (moving and
                                 waiting for bytes, with the codec work it did not overlap) */
  char codec[64];             /* the codec's canonical spec, "" when uncompressed */
  /* IntSGD (the int8, int16, int32 codecs; 0 otherwise): */
  double intAlpha;            /* the scale alpha every rank shared (0: an exact float round) */
  uint64_t clippedValues;     /* values this rank clipped to its range (the sum stays exact) */
  uint64_t largestInteger;    /* the largest |S| among the integer sums (the same on every rank) */
  /* Link classes (the communicator's node map: QCCL_DEBUG=INFO logs it): */
  uint64_t interNodeBytesSent; /* the part of wireBytesSent that went to ranks of other nodes */
  /* Where the time went, every collective (docs/PERF.md "Where the time goes"). encodeSeconds,
     decodeSeconds, reduceSeconds and the part of transportSeconds spent posting are this call's own;
     the rest of transportSeconds, waitSeconds and wakeups are what the communicator's driver (the
     waiting caller or the progress thread) did from the start of the call's execution to its
     completion, for every call it drove meanwhile. The five never add up to more than seconds; the
     remainder is the drive loop itself, a wait behind earlier calls, and time the rank was not
     running (another process had its CPU). */
  double reduceSeconds;       /* data steps outside a codec: uncompressed sums, copies, averages */
  double transportSeconds;    /* in the transport: posting transfers, and progress that moved bytes
                                 (with UCX over TCP, the kernel's socket copies) */
  double waitSeconds;         /* waiting for the wire or a peer: polling that found nothing, sleeps */
  uint64_t wakeups;           /* times the driver slept and woke (on the transport's descriptor, or
                                 a pause while the transport could not be armed) */
} qcclStats_t;

/* ---- Library and errors ------------------------------------------------------------------------ */

/* Writes QCCL_VERSION_CODE of the library (which may differ from the header's). */
QCCL_API qcclResult_t qcclGetVersion(int* version);

/* A static string naming a result code. Never NULL. */
QCCL_API const char* qcclGetErrorString(qcclResult_t result);

/* The message of the last failed call made by this thread (comm may be NULL). Valid until the next
 * qccl call on this thread. Empty string when no call has failed. */
QCCL_API const char* qcclGetLastError(qcclComm_t comm);

/* ---- Communicators ------------------------------------------------------------------------------ */

/* Creates a unique id and starts the bootstrap root in this process (a thread that lives until all
 * nranks have joined, then exits). It waits for the first rank without limit, then for the others
 * until just before the first of the joined ranks would time out (each says how long it waits), and
 * then tells those ranks which ranks never joined. Call it once per communicator, on one process. The root listens on
 * QCCL_SOCKET_IFNAME's address, else the first non-loopback IPv4 interface, else loopback. */
QCCL_API qcclResult_t qcclGetUniqueId(qcclUniqueId* uniqueId);

/* An id for a communicator whose root listens at `address` ("host:port" or "[IPv6]:port"), for
 * launchers that give every process one address instead of copying an id from one process to the
 * others (NCCL's NCCL_COMM_ID, which the NCCL drop-in maps here). It starts nothing: every process
 * that names the same root gets the same id (its magic is a hash of the port, so two jobs that share
 * one address are not told apart), and rank 0's qcclCommInitRank starts the root, listening on the
 * address's port on every interface of its host, which the address must name (qcclSystemError when
 * it does not, or the port is taken). The other ranks retry until it listens; the root waits
 * QCCL_TIMEOUT at most for rank 0 itself. An address that does not resolve, or port 0:
 * qcclInvalidArgument. */
QCCL_API qcclResult_t qcclGetUniqueIdFromAddress(const char* address, qcclUniqueId* uniqueId);

/* Collective over nranks processes: joins communicator `uniqueId` as `rank` (0 <= rank < nranks).
 * Blocks until every rank has joined or QCCL_TIMEOUT expires (then up to a second more for the root
 * to say which ranks never came: qcclTimeout naming them). */
QCCL_API qcclResult_t qcclCommInitRank(qcclComm_t* comm, int nranks, qcclUniqueId uniqueId, int rank);
/* As qcclCommInitRank, with settings (config may be NULL). */
QCCL_API qcclResult_t qcclCommInitRankConfig(qcclComm_t* comm, int nranks, qcclUniqueId uniqueId,
                                             int rank, const qcclConfig_t* config);

/* Collective: builds the world communicator from the environment, in this order:
 *   QCCL_RANK, QCCL_NRANKS, QCCL_ROOT=host:port      (set by qcclrun)
 *   RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT        (torchrun)
 *   OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE        (Open MPI; root from QCCL_ROOT or MASTER_*)
 *   SLURM_PROCID, SLURM_NTASKS                        (Slurm; root from QCCL_ROOT or MASTER_*)
 * Rank 0 listens on the root's port. With none of these set it makes a single-rank communicator.
 * The magic is QCCL_MAGIC if set, else a hash of the job identity the launcher exports: the root's
 * host:port, the rank count and those of TORCHELASTIC_RUN_ID, SLURM_JOB_ID, SLURM_STEP_ID,
 * OMPI_MCA_ess_base_jobid and PMIX_NAMESPACE that are set (the same on every rank of a job). */
QCCL_API qcclResult_t qcclCommInitEnv(qcclComm_t* comm, const qcclConfig_t* config);

/* Collective: finishes outstanding operations, waits (up to QCCL_TIMEOUT) for every rank to reach
 * qcclCommDestroy, and frees the communicator. comm is invalid afterwards, even on failure, except
 * when refused with qcclInvalidUsage because this thread's open group (qcclGroupStart) holds calls
 * on comm; that refusal, unlike a refused call's, leaves the group as it was (a destroy is no call of
 * the group: the group still runs its calls, and comm may be destroyed after its end). A qcclCommAbort
 * of comm from another thread ends the wait: it returns qcclAborted. A call made with comm once it is
 * freed (also by a destroy or abort in another thread) fails with qcclInvalidArgument, "comm = 0x...
 * is not a live communicator", unless a communicator made since took the handle's address. */
QCCL_API qcclResult_t qcclCommDestroy(qcclComm_t comm);

/* Local and always returns: fails every outstanding operation with qcclAborted, tells the peers
 * (whose calls from this rank's oldest unfinished collective on, and point-to-point calls, then fail
 * with qcclRemoteError; older ones, which it has done its part of, may still finish) and frees the
 * communicator. Any thread may call it at any time, also while another thread is in a call on comm
 * or entering one, qcclCommDestroy included (that call then frees the handle as it returns): a call
 * holds the communicator until it returns (one in flight fails with qcclAborted), and a call that
 * looks the handle up after the abort fails with qcclInvalidArgument ("comm = 0x... is not a live
 * communicator"), as does a second abort, unless a communicator made since took the handle's address.
 * Not from a signal handler (it takes locks and joins a thread). comm is invalid afterwards. */
QCCL_API qcclResult_t qcclCommAbort(qcclComm_t comm);

/* Collective over every rank of comm (NCCL's ncclCommSplit): the ranks that pass the same color >= 0
 * form a new communicator, *newcomm, in which they are ranked by key, then by their rank in comm. A
 * rank that passes QCCL_SPLIT_NOCOLOR (any negative color) joins none: *newcomm = NULL, and it must
 * still make the call. config NULL: the new communicator takes comm's settings; else comm's settings
 * with the fields config sets. The new communicator is independent of comm: both may run
 * collectives at the same time, from one thread or several, and either may be destroyed first.
 * Blocks until the new communicator is built (or QCCL_TIMEOUT). Not inside qcclGroupStart/End.
 * Results: qcclInvalidArgument (newcomm NULL; a bad config field, on every rank when one rank's is
 * refused: that rank still takes part in the exchange, so comm stays intact), qcclInvalidUsage (inside a group,
 * which the refusal fails as a whole, as any call refused there: see qcclGroupStart), and comm's own
 * failure (qcclRemoteError, qcclTimeout, ...) when the exchange over it fails, which breaks comm as
 * any failed collective does. *newcomm is set only on success. */
#define QCCL_SPLIT_NOCOLOR (-1)
QCCL_API qcclResult_t qcclCommSplit(qcclComm_t comm, int color, int key, qcclComm_t* newcomm,
                                    const qcclConfig_t* config);

QCCL_API qcclResult_t qcclCommCount(const qcclComm_t comm, int* count);
QCCL_API qcclResult_t qcclCommUserRank(const qcclComm_t comm, int* rank);

/* qcclSuccess while the communicator is healthy; else the error that broke it (a peer failed, a
 * mismatch, a timeout), whose message qcclGetLastError then gives. Never blocks. */
QCCL_API qcclResult_t qcclCommGetAsyncError(qcclComm_t comm, qcclResult_t* asyncError);

/* Fills *stats (stats->size must be set) for the last collective that completed on comm (the
 * library's own exchanges over it, a qcclCommSplit's for instance, leave them). */
QCCL_API qcclResult_t qcclCommGetLastStats(qcclComm_t comm, qcclStats_t* stats);

/* ---- Device buffers ------------------------------------------------------------------------------
 * In a build with CUDA (qccl_info prints whether), every collective, point-to-point and compressed
 * call also takes buffers in CUDA device memory (cudaMalloc, or managed memory), all of one device
 * per communicator: the device of its first call on device buffers. qccl asks the CUDA driver
 * (cuPointerGetAttributes), only in a process that has loaded it and without making a context, so
 * that host buffers cost a lookup and host-only programs nothing; it leaves each thread's current
 * device as it found it.
 *
 * Order: such a call runs on a stream of qccl's own that first waits for the work the
 * communicator's stream held when the call was made, and the communicator's stream then waits for
 * the call's work, so that kernels queued before the call produce its input and kernels queued
 * after its completion see its output. Like a cuBLAS handle, a communicator has one stream, set
 * with qcclCommSetStream for the calls made after it (NULL, the default: CUDA's legacy default
 * stream); a cudaStream_t is passed as void* so that this header needs no CUDA header. A blocking
 * call returns once its result is in recvbuff; a non-blocking call's request completes then.
 *
 * The results have the host path's bits. The bytes move over NCCL point-to-point between the GPUs,
 * or through pinned host buffers over the same transport as host buffers (QCCL_GPU_WIRE;
 * point-to-point calls, IntSGD's agg=switch and messages of variable length always take the latter). The first collective on device buffers made outside
 * a group chooses, on every rank together, so every rank must make it at the same point; calls before
 * it, and inside groups before it, take the staged wire.
 *
 * Codec states work as on host buffers; an error-feedback residual has a copy in device memory, and
 * whichever copy the state's last call used is the current one (qcclCodecStateSave and Load, and a
 * call on host buffers, bring it back to the host first); so has Marsit's compensation. Marsit's sign
 * and IntSGD's int8..int32 (agg=switch too, its aggregator traffic staged) run on device buffers with
 * the host path's bits, alpha and clips; so do learned levels (QSDP) and AQ-SGD's aq2..aq8 in
 * qcclSendCompressed / qcclRecvCompressed; keyed delta calls take device buffers through the host
 * (qcclDeltaSend), and so, by default (QCCL_GPU_FFT=host), does the fft codec: the host's codec runs
 * on pinned copies of the buffers (the input copied when the call starts to run, the result when it
 * completes, ordered with the stream; the host path's bits). With QCCL_GPU_FFT=cufft the device runs
 * the fft codec with cuFFT instead: one result on every rank, but not the host's bits (cuFFT rounds
 * its own way), so every rank of such a call must be on device buffers under cuFFT, or all fail with
 * qcclMismatch. Not on device buffers:
 * graph capture: a call made while the communicator's stream is capturing fails with
 * qcclInvalidUsage before it touches the stream (qccl's progress thread runs the call on its own
 * stream, which a graph cannot record), and the capture goes on. A call whose sendbuff and recvbuff
 * are in different memories fails with qcclInvalidArgument, as does device memory in a build
 * without CUDA or of another device than the communicator's. */
QCCL_API qcclResult_t qcclCommSetStream(qcclComm_t comm, void* stream);
QCCL_API qcclResult_t qcclCommGetStream(qcclComm_t comm, void** stream);

/* ---- Collectives (blocking) ---------------------------------------------------------------------
 * Semantics, buffer sizes and in-place rules are NCCL's. count is in elements. A zero count is valid
 * and moves nothing: with no collective in flight on the communicator it returns at once on every
 * rank; behind non-blocking collectives still in flight, it completes once they have, as any
 * collective does (call order: see the non-blocking collectives), with no traffic of its own. A
 * collective's keeps its place in the call order all the same, so every rank must make it: where one
 * rank passes 0 and the others a count, their calls fail (by QCCL_TIMEOUT, waiting for its frame
 * header) rather than meet its next call. A zero-count qcclSend or qcclRecv needs no partner and
 * completes at once. */

/* recvbuff[i] = op over ranks of sendbuff[i]. In place when sendbuff == recvbuff. */
QCCL_API qcclResult_t qcclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                    qcclDataType_t datatype, qcclRedOp_t op, qcclComm_t comm);
/* Copies root's sendbuff into every rank's recvbuff. sendbuff is read on root only (elsewhere it is
 * not looked at, and may be NULL). Like qcclReduce,
 * it returns (with a nonzero count and more than one rank) on no rank before every rank has called it:
 * alongside the data, the ranks compare their calls (ceil(log2 nranks) rounds of 64-byte messages), so
 * that a rank passing another root or count fails the call with qcclMismatch everywhere instead of
 * letting the others finish with different data. */
QCCL_API qcclResult_t qcclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                    qcclDataType_t datatype, int root, qcclComm_t comm);
/* As AllReduce, with the result on root only (recvbuff is ignored elsewhere and may be NULL). */
QCCL_API qcclResult_t qcclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                 qcclDataType_t datatype, qcclRedOp_t op, int root, qcclComm_t comm);
/* recvbuff[r*sendcount + i] = sendbuff of rank r [i]. In place when
 * sendbuff == recvbuff + rank*sendcount (so sendbuff == recvbuff is in place on rank 0 only: on the
 * others it is an overlap that is not in place, refused with qcclInvalidArgument, and rank 0 waits
 * for them until QCCL_TIMEOUT). */
QCCL_API qcclResult_t qcclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                    qcclDataType_t datatype, qcclComm_t comm);
/* recvbuff[i] = op over ranks of sendbuff[rank*recvcount + i]. In place when
 * recvbuff == sendbuff + rank*recvcount (recvbuff == sendbuff on rank 0 only, as for qcclAllGather). */
QCCL_API qcclResult_t qcclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                        qcclDataType_t datatype, qcclRedOp_t op, qcclComm_t comm);
/* recvbuff[r*count + i] = sendbuff of rank r [rank*count + i]. Not in place (sendbuff and recvbuff
 * must not overlap). */
QCCL_API qcclResult_t qcclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                   qcclDataType_t datatype, qcclComm_t comm);
/* On the root: recvbuff[r*count + i] = sendbuff of rank r [i]; recvbuff is read only on the root
 * (others may pass NULL). In place when the root's sendbuff == recvbuff + root*count. */
QCCL_API qcclResult_t qcclGather(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                 int root, qcclComm_t comm);
/* recvbuff[i] = the root's sendbuff[rank*count + i]; sendbuff is read only on the root (others may
 * pass NULL). In place when the root's recvbuff == sendbuff + root*count. */
QCCL_API qcclResult_t qcclScatter(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                  int root, qcclComm_t comm);
/* Point to point: peer must call qcclRecv with the same count and datatype. Two ranks that send to
 * each other must do so inside qcclGroupStart/qcclGroupEnd (or with qcclISend/qcclIRecv), as in
 * NCCL, since a large send completes only when the receiver has posted its receive. The calls from
 * one rank to another meet in call order, whatever their form: the n-th send to peer (qcclSend,
 * qcclSendCompressed or qcclDeltaSend, blocking or not) meets the peer's n-th receive from this rank,
 * which must be of the same form and count (qcclMismatch otherwise: on the receiver at once; a
 * small send may have completed on the sender before the receiver looked at it, and its
 * communicator then learns of the failure as its asynchronous error). */
QCCL_API qcclResult_t qcclSend(const void* sendbuff, size_t count, qcclDataType_t datatype, int peer,
                               qcclComm_t comm);
QCCL_API qcclResult_t qcclRecv(void* recvbuff, size_t count, qcclDataType_t datatype, int peer,
                               qcclComm_t comm);

/* Between qcclGroupStart and qcclGroupEnd, calls are validated and queued instead of run; GroupEnd
 * starts them all at once and blocks until they complete, returning the first error. Groups nest
 * (only the outermost GroupEnd runs). Per thread. As in NCCL, a call refused inside a group (its own
 * result an error) fails the group as a whole: the outermost GroupEnd then runs none of its calls
 * (their requests fail too) and returns that call's result, naming it; the peers' matching calls
 * wait for this rank (until QCCL_TIMEOUT, or until it aborts the communicator). */
QCCL_API qcclResult_t qcclGroupStart(void);
QCCL_API qcclResult_t qcclGroupEnd(void);

/* ---- Collectives (non-blocking) ----------------------------------------------------------------
 * Same arguments as the blocking call, plus a request that completes when the operation has. The
 * operation progresses in the background (a progress thread per communicator) while the caller
 * computes. The buffers belong to qccl until the request completes. Inside a group, the request
 * starts at qcclGroupEnd.
 *
 * Order, as on a CUDA stream: the collectives of one communicator (blocking or not, in a group or
 * not) run in the order they were called, one pipeline for them all: the next one starts as soon as
 * the one before has started its last chunk, so back-to-back calls keep the pipeline full. Their
 * requests also complete in call order (a zero count's too): when a collective's request has
 * completed, so have those of every collective called before it on the communicator. As on a
 * stream, a collective whose buffers an older one still running writes (or reads, where this one
 * writes) starts when that one has finished (on device buffers: when all its work is queued on the
 * device, which runs the later call's after it): calls on one buffer back to back, in place or not, see
 * each other's results; calls on other buffers overlap. A call's QCCL_TIMEOUT counts from when it
 * starts, not from when it was called. Point-to-point calls (qcclSend/qcclRecv, qcclISend/qcclIRecv)
 * are not ordered: each progresses as soon as it is started, beside the collectives and the other
 * point-to-point calls, in any completion order (so ranks may post them in different orders), except
 * that of more than 4096 in flight to (or from) one peer, the newer start as the oldest finish. */
QCCL_API qcclResult_t qcclIAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                     qcclDataType_t datatype, qcclRedOp_t op, qcclComm_t comm,
                                     qcclRequest_t* request);
QCCL_API qcclResult_t qcclIBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                     qcclDataType_t datatype, int root, qcclComm_t comm,
                                     qcclRequest_t* request);
QCCL_API qcclResult_t qcclIReduce(const void* sendbuff, void* recvbuff, size_t count,
                                  qcclDataType_t datatype, qcclRedOp_t op, int root, qcclComm_t comm,
                                  qcclRequest_t* request);
QCCL_API qcclResult_t qcclIAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                     qcclDataType_t datatype, qcclComm_t comm, qcclRequest_t* request);
QCCL_API qcclResult_t qcclIReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                         qcclDataType_t datatype, qcclRedOp_t op, qcclComm_t comm,
                                         qcclRequest_t* request);
QCCL_API qcclResult_t qcclIAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                    qcclDataType_t datatype, qcclComm_t comm, qcclRequest_t* request);
QCCL_API qcclResult_t qcclIGather(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                  int root, qcclComm_t comm, qcclRequest_t* request);
QCCL_API qcclResult_t qcclIScatter(const void* sendbuff, void* recvbuff, size_t count, qcclDataType_t datatype,
                                   int root, qcclComm_t comm, qcclRequest_t* request);
QCCL_API qcclResult_t qcclISend(const void* sendbuff, size_t count, qcclDataType_t datatype, int peer,
                                qcclComm_t comm, qcclRequest_t* request);
QCCL_API qcclResult_t qcclIRecv(void* recvbuff, size_t count, qcclDataType_t datatype, int peer,
                                qcclComm_t comm, qcclRequest_t* request);

/* ---- Compressed collectives ------------------------------------------------------------------
 * A codec turns float32/float16/bfloat16 values into fewer bytes on the wire; qccl fuses it into the
 * pipeline chunks of the collective. Spec grammar: name[:key=value,...]
 *   none                 float32 as is (measures the fused path's own cost)
 *   fp16, bf16           IEEE half / bfloat16 (2 bytes per value, round to nearest even)
 *   q1 .. q8             bucketed min-max quantization: N bits per value plus 8 bytes per bucket
 *   sign                 Marsit (Wu et al., DAC 2022): one bit per value, merged stochastically at
 *                        every hop of a ring or torus (see qcclAllReduceCompressed)
 *   int8, int16, int32   IntSGD (Mishchenko et al., ICLR 2022): Int(alpha x) under a scale alpha all
 *                        ranks share, summed as integers without decoding (see qcclAllReduceCompressed)
 *   fft                  FFT sparsification (Wang et al., HPDC 2020), all-reduce only: per segment the
 *                        largest bins of the spectrum as N-bit range floats, variable length, every
 *                        rank's payloads decoded by every rank in rank order (on device buffers the
 *                        host codec runs on pinned copies: the host's bits)
 *   aq2 .. aq8           AQ-SGD's quantizer (Wang et al., NeurIPS 2022), point-to-point only
 *                        (qcclSendCompressed): N bits per value on the grid k s / 2^(N-1), k in
 *                        [-2^(N-1), 2^(N-1) - 1], s an fp16 max-abs scale per channel
 * keys: bucket=B (q only; multiple of 8; default 512), round=nearest|stochastic|shift (q only;
 * default nearest; stochastic rounding is unbiased; shift is QSDP's quantization by random shift, one
 * uniform per bucket shared by its values, unbiased too), levels=l0/l1/.../lK (q only: 2^N learned levels in
 * [0, 1], strictly increasing, from 0 to 1, in place of evenly spaced ones; qcclCodecLearnLevels
 * fits them; host memory only), ef=on|off (error feedback, not sign nor q1, whose error does not
 * shrink its input; needs a codec state; default off), seed=S (keys the random rounding and merging; default 0); for sign:
 * eta_s=E (required: the magnitude of a sign round's update), k=K (every K-th round, t = 0
 * included, is a full-precision average; 0 = never; default 100), topology=ring|torus:RxC (default
 * ring; R * C must be the rank count; ranks sit row-major); for int8, int16, int32:
 * round=stochastic|nearest (default stochastic: unbiased), alpha=grad|lr|A (grad: adaptive from the
 * decoded averages, no learning rate; lr: Algorithm 1, adaptive from the learning rate set with
 * qcclCodecStateSetLearningRate; A: fixed; default grad), beta=B (moving average, 0 <= B < 1,
 * default 0.9), eps=E (> 0, default 1e-8), alpha0=A (scale of the first round; default: the first
 * round is an exact float all-reduce), agg=ring|switch (who adds the integers: the ranks along a
 * ring, or the aggregator processes of QCCL_AGGREGATORS, as an in-network switch would; default
 * ring; the sums are the same bits); for fft: theta=T (fraction of the L'/2 + 1 bins of each
 * segment dropped, 0 <= T < 1; default 0.9; 0 is lossless: the uncompressed ring runs, exactly,
 * whatever fallback says, and with ef=on leaves the residual as it was), bits=N (per real or
 * imaginary part, 3..16; default 10), mant=M (mantissa bits of the range float, 1..N-1; default 6),
 * max=X|auto (largest magnitude, in units of the orthonormal spectrum, whose energy is the segment's;
 * default 1, the paper's; parts beyond it are clamped and counted in qcclStats_t::clipped; auto: each
 * segment's own power of two at or above its largest part, 2^-127 to 2^127, carried in its header,
 * so nothing clamps: the unscaled bins are finite, so a part reaches 2^127 only at L' = 2),
 * segment=L (values per FFT, 2..2^26; default 65536;
 * every segment, the tail too, is zero-padded to L', the smallest even length at or above its own with
 * no prime factor but 2, 3 and 5, within 7% of it from 1,000 values up: a large prime factor would
 * cost the transform a loop per value),
 * index=auto|bitmap|coo (how the bins sent are named; default auto: the smaller), round=trunc|nearest
 * (default trunc, never grows a value), ef=on|off, fallback=auto|off (auto: a call whose payloads
 * could outweigh the uncompressed ring's bytes, n * capacity >= 2 * count * element size, runs that
 * ring instead, exactly; not with ef=on; default auto). A theta schedule passes another fft codec
 * per call with the same state: the residual is the method's, not the codec's. For aq2 .. aq8:
 * channels=H (values per row, 1..2^24, the scales' channels: value i is in channel i % H; default 1,
 * one scale), rows=R (rows per block, each block with its own H scales, 0..2^24; default 0: the whole
 * message is one block, as AQ-SGD scales a micro-batch), round=nearest|stochastic (default nearest,
 * half to even, the paper's reference; stochastic is unbiased inside the grid), seed=S. aq1 is
 * refused: its levels {-s, 0} never correct a positive value.
 * All-reduce and all-gather: every rank ends with identical bits; the bits never depend on the chunk
 * size or pipeline depth. Error bounds per algorithm are in docs/PERF.md and the headers of
 * collectives/allreduce_*_compressed.cc, allgather_compressed_ring.cc, allgather_hierarchical.cc and
 * reduce_scatter_compressed_*.cc. QCCL_CODEC compresses plain all-reduce calls only. */

/* Parses a codec spec. An unknown name, key or value is qcclInvalidArgument naming the token. */
QCCL_API qcclResult_t qcclCodecCreate(const char* spec, qcclCodec_t* codec);
QCCL_API qcclResult_t qcclCodecDestroy(qcclCodec_t codec);
/* The codec's canonical spec: every key with its value (a learned codec's levels included), which
 * qcclCodecCreate reads back as the same codec. Written to spec when its `bytes` hold it and its
 * terminating NUL; *needed (unless NULL) gets that size. spec NULL with bytes 0 only asks the size;
 * a buffer too small is qcclInvalidArgument naming both sizes, with nothing written. */
QCCL_API qcclResult_t qcclCodecGetSpec(qcclCodec_t codec, char* spec, size_t bytes, size_t* needed);

/* QSDP's learned levels (Markov et al., ICML 2023, Algorithm 2): the 2^N levels of the q1 .. q8
 * codec `codec` fitted to `count` values of `data` (float, half or bfloat16), cut into the codec's
 * buckets and each bucket normalized to [0, 1], by online k-means (the nearest level moves 1% of the
 * way to each value; `epochs` passes, 1 to 1000, which at that fixed rate change little after the
 * first: a level is an average of its last hundred or so values; the end levels stay at the bucket's
 * minimum and maximum throughout; buckets holding NaN or Inf, or all one value, teach nothing, so
 * data without any other leaves the levels evenly spaced), returned as a new codec (*learned; free
 * it with qcclCodecDestroy). With levels, a value's error is bounded by G/2 of a bucket step (G the
 * widest gap between neighbouring levels, in steps; kernels/levels.h), not half a step. The wire size does
 * not change: the codes index the learned levels instead of evenly spaced ones, which lowers the
 * error on peaked (Laplace- or Gaussian-like) buckets at 2-5 bits (docs/PERF.md "Learned levels").
 * With a communicator this is a collective: every rank calls it with the same codec, epochs and
 * root, and every rank gets root's levels (only root's data are used; the others may pass NULL and
 * 0), so that all ranks encode and decode alike; a refusal on any rank (root's data or datatype, a
 * rank's codec, epochs or root) fails every rank with qcclInvalidArgument, and comm stays in step.
 * With comm NULL the levels are this rank's own.
 * The levels are part of the codec's spec ("levels=l0/l1/..."), and so of the hash frame headers
 * carry: ranks whose levels differ fail with qcclMismatch. Host memory only. */
QCCL_API qcclResult_t qcclCodecLearnLevels(qcclCodec_t codec, const void* data, size_t count, qcclDataType_t datatype,
                                           int epochs, int root, qcclComm_t comm, qcclCodec_t* learned);

/* State a codec keeps for one tensor across steps: the step counter that keys the random rounding
 * (Marsit's round t), and what the codec's method keeps: the error-feedback residual (ef=on: a
 * float32 per value), Marsit's compensation (a float32 per value and 8 bytes per 32 values), IntSGD's
 * moving average (a few bytes; nothing with a fixed alpha). That memory is made at the first call
 * that needs it and charged to the communicator's QCCL_CODEC_STATE_BUDGET (past it, that call fails
 * with qcclInvalidUsage before anything is sent); a state serves one method: a call with another
 * method's codec is qcclInvalidUsage. Every rank passes its own state at the same step: ranks whose
 * steps differ fail with qcclMismatch. Calls that share a state run one after the other in call
 * order, on one communicator at a time: a call on another communicator while calls on the state are
 * in flight is qcclInvalidUsage. Create one per tensor you all-reduce (all-gather, reduce-scatter) repeatedly; use it with
 * one tensor size and one collective.
 * Save/Load give a checkpoint: qcclCodecStateSize bytes (ask again after calls: the method's memory
 * appears at its first call), restored into a state of the same count; a checkpoint of an earlier
 * qccl release restores too. A mismatch or a corrupt buffer is qcclInvalidArgument and leaves the
 * state as it was. Not thread-safe per state. */
QCCL_API qcclResult_t qcclCodecStateCreate(qcclComm_t comm, size_t count, qcclCodecState_t* state);
QCCL_API qcclResult_t qcclCodecStateDestroy(qcclCodecState_t state);
QCCL_API qcclResult_t qcclCodecStateSize(qcclCodecState_t state, size_t* bytes);
QCCL_API qcclResult_t qcclCodecStateSave(qcclCodecState_t state, void* buffer, size_t bytes);
QCCL_API qcclResult_t qcclCodecStateLoad(qcclCodecState_t state, const void* buffer, size_t bytes);
/* IntSGD with alpha=lr: the learning rate eta_k of the state's next calls, until set again (lr > 0,
 * finite; every rank passes the same). Algorithm 1's alpha_k = sqrt(d) / sqrt(2 n r_k / eta_k^2 +
 * eps^2), r_k = beta r_(k-1) + (1 - beta) ||x^k - x^(k-1)||^2 from r_0 = 0 (as Proposition 2's proof
 * unrolls it), ||x^k - x^(k-1)||^2 = eta_(k-1)^2 ||g~||^2 for the SGD step x^(k+1) = x^k - eta_k g~, g~
 * the all-reduced average. */
QCCL_API qcclResult_t qcclCodecStateSetLearningRate(qcclCodecState_t state, double lr);

/* A store of many tensors' codec states by a 64-bit key the caller chooses (a parameter's or bucket's
 * id), for frameworks that compress many tensors: calls on states of different keys run concurrently,
 * calls on one key in call order. budgetBytes bounds the memory of the store's states (0: only the
 * communicator's QCCL_CODEC_STATE_BUDGET, which also counts them). A key's random rounding draws
 * from a stream of its own (the key mixed into the codec's seed), so that tensors rounded at the same
 * step have independent errors; states made alone with qcclCodecStateCreate share the codec's seed
 * (give each tensor's codec its own seed=S for the same). Thread-safe. */
QCCL_API qcclResult_t qcclCodecStoreCreate(qcclComm_t comm, size_t budgetBytes, qcclCodecStore_t* store);
/* Frees the store and its states' handles (calls in flight keep their states alive). */
QCCL_API qcclResult_t qcclCodecStoreDestroy(qcclCodecStore_t store);
/* The state of `key`, made for count values at the first get (another count later is
 * qcclInvalidArgument). The handle belongs to the store: the same for every get of the key, usable
 * wherever a qcclCodecState_t is, valid until the store is destroyed; qcclCodecStateDestroy refuses
 * it (qcclInvalidUsage). */
QCCL_API qcclResult_t qcclCodecStoreGet(qcclCodecStore_t store, uint64_t key, size_t count,
                                        qcclCodecState_t* state);
/* Forgets a key: its handle fails with qcclInvalidUsage until a get makes the key anew. A key the
 * store does not hold is qcclInvalidArgument. */
QCCL_API qcclResult_t qcclCodecStoreErase(qcclCodecStore_t store, uint64_t key);
/* A checkpoint of the whole store (every key's state, versioned): Size, then Save into that many
 * bytes. Load replaces the store's contents with a checkpoint's (of this release or an earlier
 * one): handles follow their keys; those of keys the checkpoint lacks act as erased. While a call on
 * any key is in flight, Load (as Save) is qcclInvalidUsage. The restored
 * states are charged before the old ones are freed. A corrupt buffer is qcclInvalidArgument and
 * leaves the store as it was. */
QCCL_API qcclResult_t qcclCodecStoreSize(qcclCodecStore_t store, size_t* bytes);
QCCL_API qcclResult_t qcclCodecStoreSave(qcclCodecStore_t store, void* buffer, size_t bytes);
QCCL_API qcclResult_t qcclCodecStoreLoad(qcclCodecStore_t store, const void* buffer, size_t bytes);

/* AllReduce through a codec. datatype: qcclFloat32, qcclFloat16 or qcclBfloat16; op: qcclSum or
 * qcclAvg. state may be NULL unless the codec has ef=on; with a state, its residual and step are
 * used and updated.
 * NaN and Inf under none, fp16, bf16 and q1 .. q8 (also in plain qcclAllReduce calls that QCCL_CODEC
 * compresses): none, fp16 and bf16 carry them as an uncompressed float sum would: an output is +Inf
 * (-Inf) where the inputs there hold +Inf (-Inf) and no NaN or opposite infinity, and NaN where they
 * hold a NaN or both infinities; fp16 also rounds a value or partial sum of magnitude 65520 or more
 * to +-Inf (bf16 only next to float32's largest value). The q codecs cannot carry them: every output
 * of a bucket in which an input was NaN or Inf (or whose values overflow float32) is NaN. Other
 * outputs are unaffected; with ef=on, the residual restarts at 0 where it would not be finite, so
 * later calls are not poisoned (a rank whose own values there were finite keeps their rounding error
 * as if the bucket had arrived, although the NaN output lost them). The call returns qcclNonFinite on every rank, with the count of
 * outputs that are NaN or Inf (the same on every rank) in qcclGetLastError. With one rank these codecs encode
 * nothing: recvbuff is a copy of sendbuff, NaN and Inf included, and the call returns qcclSuccess.
 * With the sign codec (Marsit): qcclFloat32, qcclAvg and a state are required; sendbuff is the
 * update u, and every rank receives the same g: eta_s * (2b - 1) with b the merged sign of w = u + c
 * (c <- w - g), or in rounds t = 0, K, 2K, ... the average of w (c <- 0). Where w is not finite,
 * that fragment's g is NaN on every rank and c is left as it was (qcclNonFinite). The first sign call
 * on a state charges 8 more bytes per 32 values to the budget (the pending round's bits and eta_s;
 * past the budget: qcclInvalidUsage, nothing run).
 * With the int codecs (IntSGD): each rank sends clip(Int(alpha x)) in the wire type, clipped so that
 * the sum of nranks integers fits it (int8 at 4 ranks: [-32, 31]); the ranks add integers without
 * decoding, so every rank gets the same bits whatever the rank order; recvbuff = S / (nranks alpha)
 * (qcclAvg) or S / alpha (qcclSum). Unclipped, each value is within 1/alpha of the exact average
 * (1/(2 alpha) with round=nearest). A state is needed unless alpha is fixed; its first round is an
 * exact float all-reduce unless alpha0 is given. qcclCommGetLastStats reports alpha, the values
 * clipped and the largest integer sum. A NaN or Inf input is never summed: that chunk is NaN on every
 * rank, the call returns qcclNonFinite everywhere, and alpha's moving average is left as it was. An
 * output beyond float16's (bfloat16's) range is +-Inf there, as an uncompressed sum's would be, and
 * is not reported: the integers summed were finite. The exact first round is a float all-reduce in
 * the data's type and cannot tell such an overflow from an Inf input: its +-Inf outputs are reported
 * (qcclNonFinite) and teach alpha nothing, so the next call is exact again (an average too: it divides
 * the float16 sum; alpha0 skips the exact round). */
QCCL_API qcclResult_t qcclAllReduceCompressed(const void* sendbuff, void* recvbuff, size_t count,
                                              qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                              qcclCodecState_t state, qcclComm_t comm);
QCCL_API qcclResult_t qcclIAllReduceCompressed(const void* sendbuff, void* recvbuff, size_t count,
                                               qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                               qcclCodecState_t state, qcclComm_t comm,
                                               qcclRequest_t* request);

/* AllGather through a codec (NCCL's qcclAllGather layout: recvbuff holds nranks * sendcount values,
 * rank r's block at recvbuff + r * sendcount; in place when sendbuff == recvbuff + rank * sendcount).
 * Each rank encodes its sendcount values exactly once; the encoded blocks travel around a ring
 * unchanged, and every rank, the owner of a block too (also on a single rank), decodes the same
 * bytes, so every rank ends with identical bits: block r is decode(encode(x_r)), within the codec's
 * bound of x_r (q codecs, nearest rounding: half a bucket step). datatype: qcclFloat32, qcclFloat16
 * or qcclBfloat16. state may be NULL unless the codec has ef=on; a state has sendcount values (the
 * residual of this rank's block) and its step keys the random rounding as for qcclAllReduceCompressed.
 * Wire bytes per rank: (nranks - 1) * E(sendcount), E the codec's encoded size. On a node map of
 * several nodes (QCCL_NODE_MAP, qcclrun --nodes, real hosts) the default is hierarchical instead
 * (compressed_hierarchical, allgather_hierarchical.cc): the same encoded blocks, so the same bits,
 * but each crosses each node boundary once: a member sends E(sendcount) to its node's leader, a
 * leader forwards its node's blocks to the next leader and every block to its members (QCCL_ALGO=
 * allgather=compressed_ring keeps the ring). Returns qcclNonFinite
 * on every rank when an input held NaN or Inf. The sign codec (Marsit) and the int codecs (IntSGD)
 * are all-reduce codecs: qcclInvalidArgument, nothing sent. Buffers, blocking and requests as for
 * qcclAllGather and qcclIAllGather. */
QCCL_API qcclResult_t qcclAllGatherCompressed(const void* sendbuff, void* recvbuff, size_t sendcount,
                                              qcclDataType_t datatype, qcclCodec_t codec, qcclCodecState_t state,
                                              qcclComm_t comm);
QCCL_API qcclResult_t qcclIAllGatherCompressed(const void* sendbuff, void* recvbuff, size_t sendcount,
                                               qcclDataType_t datatype, qcclCodec_t codec, qcclCodecState_t state,
                                               qcclComm_t comm, qcclRequest_t* request);

/* ReduceScatter through a codec (NCCL's layout: sendbuff holds nranks * recvcount values, block r
 * for rank r; in place when recvbuff == sendbuff + rank * recvcount). Each rank encodes its
 * contribution to every other rank's block exactly once and sends it to the block's owner; the owner
 * adds the decoded contributions to its own input, which is never encoded, in a fixed order (its own
 * first, then rank order), and divides by nranks for qcclAvg. Error with nearest rounding: at most
 * the sum over the nranks - 1 contributions of half their bucket step, plus float32 rounding
 * (collectives/reduce_scatter_compressed_pairwise.cc). The bits do not depend on the chunk size, the
 * pipeline depth or timing; a single rank copies (nothing is encoded). datatype: qcclFloat32,
 * qcclFloat16 or qcclBfloat16 (the sum is kept in float32 and rounded to the datatype once, at the
 * end: add half an ulp of the result to the error); op: qcclSum or qcclAvg. state may be NULL unless
 * the codec has ef=on; a state has nranks * recvcount values (the residual of this rank's whole
 * input). Wire bytes per rank: (nranks - 1) * E(recvcount). On a node map of several nodes the
 * default is hierarchical (QSDP's): the ranks of a node sum their inputs in full precision (members
 * send them unencoded, in the datatype), and each block's node sum is encoded once per remote node
 * and crosses each node boundary once, so the error has one term per remote node instead of one per
 * remote rank, each that of a node sum's bucket (compressed_two_level on nodes of equal size: every
 * rank of a node sums and encodes its lane's blocks and keeps their residuals; compressed_hierarchical
 * otherwise: the leader does, and keeps them; collectives/reduce_scatter_compressed_*.cc give the
 * bounds and wire bytes). NaN or Inf in any rank's input for
 * this rank's block, its own included, or a float16 result beyond 65504, makes this rank's call
 * return qcclNonFinite; so does, with the fp16 codec on a node map, a node sum of magnitude 65520 or
 * more, which fp16 rounds to +-Inf as it does the all-reduce's partial sums (the flat
 * QCCL_ALGO=reducescatter=compressed_pairwise encodes the inputs alone). Marsit's and IntSGD's
 * codecs: qcclInvalidArgument, nothing sent. Buffers, blocking and requests as for qcclReduceScatter
 * and qcclIReduceScatter. */
QCCL_API qcclResult_t qcclReduceScatterCompressed(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                  qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                  qcclCodecState_t state, qcclComm_t comm);
QCCL_API qcclResult_t qcclIReduceScatterCompressed(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                   qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                   qcclCodecState_t state, qcclComm_t comm,
                                                   qcclRequest_t* request);

/* Send and Recv through a codec (AQ-SGD's stateless quantization of pipeline activations and their
 * gradients, Wang et al., NeurIPS 2022, or any fixed-length value codec): the sender encodes its
 * count values chunk by chunk and sends each chunk's bytes as soon as they are encoded; the receiver
 * decodes each chunk into recvbuff as it arrives, so encode, wire and decode overlap (aq with rows=0,
 * whose scales span the whole message, is encoded whole, then sent in chunk-sized messages, and
 * decoded once they all arrived). recvbuff holds
 * decode(encode(x)), the same bits whatever the chunk size. Codecs: none, fp16, bf16, q1 .. q8 and
 * aq2 .. aq8, without ef (no residual: point-to-point messages are not summed); sign, int and fft
 * are collectives' codecs: qcclInvalidArgument. aq is AQ-SGD's quantizer, a max-abs scale s per
 * channel of a [rows, channels] matrix (e.g. aq4:channels=1600 for a GPT2 activation), the channel's
 * largest magnitude m rounded up to fp16 (s - m < 2^-10 m, or 2^-24 below fp16's normal 2^-14):
 * nearest rounding errs by at most s / 2^b, and by s / 2^(b-1) near the top, which the grid's top
 * level (1 - 2^(1-b)) s cannot reach. Values are divided by s
 * itself: AQ-SGD's reference divides by s + 1e-6 and decodes with s, which shrank every value of a
 * channel whose s is below about 2e-3 (by 9% at s = 1e-5). datatype: qcclFloat32,
 * qcclFloat16 or qcclBfloat16. Both ends pass the same count, datatype and codec: a receiver whose
 * codec differs fails with qcclMismatch. Wire bytes: E(count), the codec's encoded size
 * (qcclCommGetLastStats). A NaN or Inf input (or, for q, a bucket whose range overflows; for aq, a
 * channel beyond float16's 65504) arrives as NaN over its bucket or channel, and the receiver's call
 * returns qcclNonFinite (the sender's succeeds: it has no output). Groups, blocking, requests and
 * matching as for qcclSend and qcclRecv. */
QCCL_API qcclResult_t qcclSendCompressed(const void* sendbuff, size_t count, qcclDataType_t datatype,
                                         qcclCodec_t codec, int peer, qcclComm_t comm);
QCCL_API qcclResult_t qcclRecvCompressed(void* recvbuff, size_t count, qcclDataType_t datatype, qcclCodec_t codec,
                                         int peer, qcclComm_t comm);
QCCL_API qcclResult_t qcclISendCompressed(const void* sendbuff, size_t count, qcclDataType_t datatype,
                                          qcclCodec_t codec, int peer, qcclComm_t comm, qcclRequest_t* request);
QCCL_API qcclResult_t qcclIRecvCompressed(void* recvbuff, size_t count, qcclDataType_t datatype, qcclCodec_t codec,
                                          int peer, qcclComm_t comm, qcclRequest_t* request);

/* AQ-SGD's keyed delta messages (Wang et al., NeurIPS 2022, Algorithm 1), for the activations a
 * pipeline stage sends the next: per sample key, both ends keep m, the last message of that sample,
 * in a store of their own (one per direction of a link, the same configuration at both ends); a
 * call sends one row per key (rowValues values each; row r of sendbuff for keys[r]): a key the
 * sender's store does not hold (first sight, evicted, or every key while warm-up is on) is sent
 * whole in the store's type and becomes m, the others are sent as Q(x - m) under the store's aq
 * codec (the scales per channel over the delta rows of each section of the call's rows, see below)
 * and both ends set m += the decoded
 * delta; recvbuff receives the full rows as sent and m + delta for the others (in m's arithmetic,
 * rounded once to the datatype). The two stores stay bit-equal: the sender decides everything and
 * says it in the message (64-byte header: store id, sequence number, keys hash, configuration
 * hash; evicted keys; which rows are full), and the receiver checks every field before it changes
 * anything, then answers; the sender changes its store only when the receiver accepted. Both
 * calls then fail alike, with nothing changed: qcclMismatch when the receiver's keys (in order),
 * count, codec, types, row size or store id differ, or a message was lost or repeated (the
 * sequence), or a delta names a key the receiver does not hold; qcclNonFinite when a delta holds
 * NaN or Inf (or a channel beyond float16's 65504) or a row sent whole does (or holds a value beyond
 * the storeType's range: it would arrive as Inf), or when a key's new m would leave the storeType's
 * range (m + delta past float16's 65504: an m of Inf would refuse all the key's later deltas; the key
 * keeps its m and goes on from it; with low-bit m, qcclDeltaStoreSetLowBits, the limit is its float16
 * scales': a row beyond 65504 is refused whatever the storeType, on first sight too), and
 * qcclInvalidUsage over the budget: the
 * sender sends only its refusal, which the receiver returns. budgetBytes bounds the rows' memory
 * (0: none): a call that needs more is refused, unless evictLeastRecent = 1, with which the sender
 * evicts its least recently used keys (never the call's) and the receiver mirrors it; a receiver's
 * budget must hold what its sender's keeps (else both calls fail, qcclInvalidUsage). Keys in one
 * call are distinct. datatype: qcclFloat32, qcclFloat16 or qcclBfloat16 (each end its own);
 * storeType: the same three (qcclFloat16 is the paper's). Buffers in host memory or CUDA device memory
 * (see qcclCommSetStream: ordered with the communicator's stream; the rows cross through pinned host
 * memory, since the store and its kernels are the host's: a sender's are copied when its call starts
 * to run, a receiver's when it completes, failed receives' applied rows included). Each call is one
 * exchange between the two ends: a message in five parts (the header with the evicted keys and the
 * bitmap, then four sections, each encoded while the part before it is on the wire and applied as
 * it arrives, so that the codec's work overlaps the wire: the call's keys are cut into as many
 * sections, up to four, as keep the extra scales under 1/32 of the delta's bytes, the other
 * sections empty), each part announced by its length (8 bytes, counted in wireBytesSent beside
 * lastMessageBytes) and sent in messages of a pipeline chunk (QCCL_CHUNK_BYTES), so that a part
 * longer than QCCL_TIMEOUT on a slow link still shows progress; then the receiver's answer, which
 * completes the sender's call. A part longer than twice the largest the receiver's call could be
 * sent (a sender that names far more keys, or whose rows are more than twice the receiver's) is
 * received and dropped, and both calls fail as a mismatch.
 *
 * Blocking, non-blocking (qcclIDeltaSend / qcclIDeltaRecv: the buffer and the store stay the
 * caller's until qcclWait or qcclTest says the call completed, with its result; the keys are
 * copied) and inside groups (started at qcclGroupEnd, so that a stage can send its activations and
 * receive its gradients in one group), like qcclSend and qcclRecv. Calls on one store run one after
 * the other in call order, each once the one before completed (every message depends on the store
 * the one before left), and so do the two ends' calls; calls on other stores and other
 * point-to-point calls run beside them, and meet their peer's calls in call order with them
 * (qcclSend). Warm-up is the store's setting when the call is made.
 * While calls on a store are in flight, qcclDeltaStoreSetFile, SetLowBits and Load are refused
 * (qcclInvalidUsage); qcclDeltaStoreDestroy may be called, and the store lives on until they
 * complete. A store is one end of one link, so its calls go to one peer (on one communicator, a
 * call naming another is qcclInvalidUsage); it is not tied to a communicator, but calls in flight on
 * it must all be on one (qcclInvalidUsage otherwise), which orders them. Otherwise a failed call (a
 * refusal, a mismatch) fails on both ends, the communicator goes on, both stores are as they were,
 * and so is recvbuff, but for the rows of sections applied before the failure showed (a NaN the
 * sender met in a later section of its rows). */
typedef struct qcclDeltaStore* qcclDeltaStore_t;
typedef struct {
  uint64_t keys;             /* keys held */
  uint64_t bytes;            /* their rows' memory */
  uint64_t sequence;         /* messages sent or received */
  uint64_t lastMessageBytes; /* the last message's bytes on the wire (the answer's 256 aside) */
  uint64_t lastFullRows;     /* rows that message sent whole */
} qcclDeltaStoreInfo_t;
QCCL_API qcclResult_t qcclDeltaStoreCreate(qcclCodec_t codec, size_t rowValues, qcclDataType_t storeType,
                                           size_t budgetBytes, int evictLeastRecent, uint32_t id,
                                           qcclDeltaStore_t* store);
QCCL_API qcclResult_t qcclDeltaStoreDestroy(qcclDeltaStore_t store);
/* Warm-up (the paper's first epoch): while on, every row is sent whole (the sender's setting). */
QCCL_API qcclResult_t qcclDeltaStoreSetWarmup(qcclDeltaStore_t store, int on);
/* The file tier, for a store larger than memory (the paper's QNLI run keeps 82 GB per direction):
 * the rows live in a new file created at path (on the disk that should hold them) and removed from
 * its directory at once, so that nothing is left behind, even after a crash, and two stores given
 * one path each have their own; mapped into memory, so that the kernel pages them in and out (each
 * call asks it to read the rows it will use ahead, from the moment it is made: a non-blocking call
 * queued behind others has its rows on their way while they run); its space is freed by
 * qcclDeltaStoreDestroy.
 * "" returns them to memory. Each end chooses for itself; the messages are the same. Only while the
 * store holds no key (qcclInvalidUsage otherwise); qcclSystemError, naming the path and the
 * reason, when the file cannot be created, when the path exists (an existing file is never
 * truncated or removed), and when it cannot grow (a full disk) during a call, which then fails on
 * both ends with neither store changed, as for a refusal. */
QCCL_API qcclResult_t qcclDeltaStoreSetFile(qcclDeltaStore_t store, const char* path);
/* Low-bit m (the paper's App. H.5): each key's m kept as bits-bit codes (2 .. 8) with a float16
 * scale per channel of the store's codec over the key's row, which both ends re-quantize (nearest)
 * after every message, so the stores stay bit-equal; a row then takes about bits/16 of its float16
 * size (budgets count these bytes). The paper found 8 bits as good as float16 and 2 bits slightly
 * worse. 0 returns to storeType. Both ends must set the same (the configuration hash covers it: a
 * mismatch fails both calls with qcclMismatch). Only while the store holds no key (qcclInvalidUsage);
 * other bits: qcclInvalidArgument. */
QCCL_API qcclResult_t qcclDeltaStoreSetLowBits(qcclDeltaStore_t store, int bits);
QCCL_API qcclResult_t qcclDeltaStoreGetInfo(qcclDeltaStore_t store, qcclDeltaStoreInfo_t* info);
/* A checkpoint (versioned, with a checksum): Size, then Save into that many bytes; Load restores one
 * of a store of the same configuration (qcclMismatch otherwise, qcclInvalidArgument when corrupt,
 * qcclInvalidUsage when its keys take more than the store's budget; the store unchanged). A key
 * whose m in the checkpoint is not finite (written before such an m was refused) is sent whole by
 * its next call, at both ends alike. */
QCCL_API qcclResult_t qcclDeltaStoreSize(qcclDeltaStore_t store, size_t* bytes);
QCCL_API qcclResult_t qcclDeltaStoreSave(qcclDeltaStore_t store, void* buffer, size_t bytes);
QCCL_API qcclResult_t qcclDeltaStoreLoad(qcclDeltaStore_t store, const void* buffer, size_t bytes);
QCCL_API qcclResult_t qcclDeltaSend(const void* sendbuff, size_t nkeys, const uint64_t* keys, qcclDataType_t datatype,
                                    qcclDeltaStore_t store, int peer, qcclComm_t comm);
QCCL_API qcclResult_t qcclDeltaRecv(void* recvbuff, size_t nkeys, const uint64_t* keys, qcclDataType_t datatype,
                                    qcclDeltaStore_t store, int peer, qcclComm_t comm);
QCCL_API qcclResult_t qcclIDeltaSend(const void* sendbuff, size_t nkeys, const uint64_t* keys, qcclDataType_t datatype,
                                     qcclDeltaStore_t store, int peer, qcclComm_t comm, qcclRequest_t* request);
QCCL_API qcclResult_t qcclIDeltaRecv(void* recvbuff, size_t nkeys, const uint64_t* keys, qcclDataType_t datatype,
                                     qcclDeltaStore_t store, int peer, qcclComm_t comm, qcclRequest_t* request);

/* Segments (QSDP's per-layer compression, Markov et al., ICML 2023, §5.1): a block (AllGather's
 * sendcount values, each of ReduceScatter's nranks blocks of recvcount) cut into consecutive runs,
 * e.g. one per layer, each sent with the codec (exact = 0) or exactly (exact = 1: norm layers and
 * biases, in the block's own datatype, bit for bit but for NaN payloads, which may come back quiet
 * and are reported as qcclNonFinite; the hierarchical ReduceScatters send a node's
 * float32 sums of an exact segment as float32). The codec's bucket grid restarts at every
 * segment, so a segment's bytes depend on its own values only. The counts must add up to the block's
 * (segments of 0 values are allowed); nsegments from 1 to 2^20. Every rank passes the same list (the
 * frame headers' codec hash covers it: a rank with another list fails with qcclMismatch). Otherwise
 * as qcclAllGatherCompressed and qcclReduceScatterCompressed; error feedback keeps no residual on
 * exact segments (nothing is lost there). */
typedef struct {
  size_t count; /* values in this segment */
  int exact;    /* 1: sent exactly; 0: with the codec */
} qcclSegment_t;
QCCL_API qcclResult_t qcclAllGatherCompressedSegments(const void* sendbuff, void* recvbuff, size_t sendcount,
                                                      qcclDataType_t datatype, qcclCodec_t codec,
                                                      const qcclSegment_t* segments, int nsegments,
                                                      qcclCodecState_t state, qcclComm_t comm);
QCCL_API qcclResult_t qcclIAllGatherCompressedSegments(const void* sendbuff, void* recvbuff, size_t sendcount,
                                                       qcclDataType_t datatype, qcclCodec_t codec,
                                                       const qcclSegment_t* segments, int nsegments,
                                                       qcclCodecState_t state, qcclComm_t comm,
                                                       qcclRequest_t* request);
QCCL_API qcclResult_t qcclReduceScatterCompressedSegments(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                          qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                          const qcclSegment_t* segments, int nsegments,
                                                          qcclCodecState_t state, qcclComm_t comm);
QCCL_API qcclResult_t qcclIReduceScatterCompressedSegments(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                           qcclDataType_t datatype, qcclRedOp_t op, qcclCodec_t codec,
                                                           const qcclSegment_t* segments, int nsegments,
                                                           qcclCodecState_t state, qcclComm_t comm,
                                                           qcclRequest_t* request);

/* Non-blocking check. When the request has completed, writes *done = 1, frees it, sets *request to
 * NULL and returns the operation's result; otherwise writes *done = 0 and returns qcclSuccess. A
 * NULL *request (one a test or wait already freed) writes *done = 1 and returns qcclSuccess, as
 * qcclWait returns at once. A request is tested or waited for by one thread at a time. */
QCCL_API qcclResult_t qcclTest(qcclRequest_t* request, int* done);
/* Blocks until the request completes, frees it, sets *request to NULL and returns its result.
 * A NULL *request returns qcclSuccess at once. */
QCCL_API qcclResult_t qcclWait(qcclRequest_t* request);

#ifdef __cplusplus
}
#endif

#endif /* QCCL_H_ */
