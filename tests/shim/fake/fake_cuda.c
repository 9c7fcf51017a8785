/* A stand-in for libcuda.so.1 with two devices, for the drop-in's device routing on machines without
 * a GPU: memory the test declares (fake_cuda_set_device_memory) is "device memory", and each thread has
 * a stack of current contexts, as the driver keeps. Only what the drop-in calls is here. */
#include <stddef.h>
#include <stdint.h>

typedef int CUresult;
enum { kSuccess = 0, kInvalidValue = 1, kInvalidDevice = 101, kInvalidContext = 201 };
enum { kDevices = 2, kMemoryTypeAttribute = 2, kMemoryTypeDevice = 2 };

static int contexts[kDevices] = {0, 1}; /* a primary context is its device's number */
static __thread int current = -1;       /* no context */
static __thread int pushed[16];
static __thread int depth = 0;
static uintptr_t device_begin, device_end;

void fake_cuda_set_device_memory(const void* p, size_t bytes) {
  device_begin = (uintptr_t)p;
  device_end = device_begin + bytes;
}

CUresult cuInit(unsigned flags) { (void)flags; return kSuccess; }
CUresult cuDeviceGetCount(int* n) { *n = kDevices; return kSuccess; }
CUresult cuDeviceGet(int* device, int ordinal) {
  if (ordinal < 0 || ordinal >= kDevices) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}
CUresult cuDevicePrimaryCtxRetain(void** context, int device) {
  if (device < 0 || device >= kDevices) return kInvalidDevice;
  *context = &contexts[device];
  return kSuccess;
}
CUresult cuDevicePrimaryCtxRelease_v2(int device) { return device < 0 || device >= kDevices ? kInvalidDevice : kSuccess; }
CUresult cuCtxPushCurrent_v2(void* context) {
  if (depth == 16) return kInvalidValue;
  pushed[depth++] = current;
  current = *(int*)context;
  return kSuccess;
}
CUresult cuCtxPopCurrent_v2(void** context) {
  if (depth == 0) return kInvalidContext;
  if (context) *context = &contexts[current];
  current = pushed[--depth];
  return kSuccess;
}
CUresult cuCtxGetCurrent(void** context) { *context = current < 0 ? NULL : &contexts[current]; return kSuccess; }
CUresult cuCtxGetDevice(int* device) {
  if (current < 0) return kInvalidContext;
  *device = current;
  return kSuccess;
}
CUresult cuPointerGetAttributes(unsigned n, int* attributes, void** data, unsigned long long p) {
  for (unsigned i = 0; i < n; ++i)
    if (attributes[i] == kMemoryTypeAttribute)
      *(unsigned*)data[i] = p >= device_begin && p < device_end ? kMemoryTypeDevice : 0;
  return kSuccess;
}
CUresult cuStreamSynchronize(void* stream) { (void)stream; return kSuccess; }
CUresult cuStreamIsCapturing(void* stream, int* status) { (void)stream; *status = 0; return kSuccess; }
CUresult cuThreadExchangeStreamCaptureMode(int* mode) { (void)mode; return kSuccess; }
CUresult cuStreamGetCtx(void* stream, void** context) { (void)stream; *context = &contexts[0]; return kSuccess; }
CUresult cuGetErrorString(CUresult r, const char** s) { (void)r; *s = "fake CUDA error"; return kSuccess; }
