// Preloaded in front of the real libnccl.so.2, the drop-in interposes every ncclX and pncclX of the
// process, including those the real library calls itself through the dynamic linker (its ncclBcast
// calls ncclBroadcast, for example). Such calls must reach the real library's own code. Here the
// program calls the real pncclBcast directly, with a NULL communicator: the real library's internal
// ncclBroadcast lands in the drop-in, which must hand it back (the real library then reports the NULL
// communicator in its own words) rather than treat it as a program's call (which would leave the
// drop-in's own message). Run with LD_PRELOAD=libqccl_nccl.so; exits 1 on a failed check.
#include <dlfcn.h>
#include <nccl.h>

#include <cstdio>
#include <cstring>

int main() {
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) ++failures;
    std::printf("%s: %s\n", ok ? "ok" : "FAILED", what);
  };
  void* real = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD);
  check(real != nullptr, "the real libnccl.so.2 is loaded (the program links it)");
  if (!real) return 1;
  auto real_bcast = reinterpret_cast<ncclResult_t (*)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t)>(
      dlsym(real, "pncclBcast"));
  auto real_last_error = reinterpret_cast<const char* (*)(ncclComm_t)>(dlsym(real, "pncclGetLastError"));
  check(real_bcast && real_last_error, "the real library's pncclBcast and pncclGetLastError");
  if (!real_bcast || !real_last_error) return 1;

  // The program's own calls reach the drop-in.
  int version = 0;
  check(ncclGetVersion(&version) == ncclSuccess && version == NCCL_VERSION_CODE, "ncclGetVersion is the drop-in's");
  float x[4] = {0, 0, 0, 0};
  check(ncclBroadcast(x, x, 4, ncclFloat32, 0, nullptr, nullptr) == ncclInvalidArgument &&
            std::strstr(ncclGetLastError(nullptr), "ncclBroadcast: comm = (nil)") != nullptr,
        "the program's ncclBroadcast(NULL comm) is refused by the drop-in, in its words");

  // The real library's internal call goes back to it. First a drop-in error of another call, which a
  // wrongly served internal ncclBroadcast would replace with its own.
  check(ncclGetVersion(nullptr) == ncclInvalidArgument, "ncclGetVersion(NULL) is refused");
  const char* before = ncclGetLastError(nullptr);
  char saved[512];
  std::snprintf(saved, sizeof(saved), "%s", before);
  ncclResult_t r = real_bcast(x, 4, ncclFloat32, 0, nullptr, nullptr);
  std::printf("real pncclBcast(NULL comm) -> %d; real library: '%s'; drop-in: '%s'\n", r, real_last_error(nullptr),
              ncclGetLastError(nullptr));
  check(r == ncclInvalidArgument, "the real pncclBcast fails with ncclInvalidArgument");
  check(std::strcmp(ncclGetLastError(nullptr), saved) == 0,
        "its internal ncclBroadcast never ran the drop-in's code (the drop-in's last error is unchanged)");
  check(std::strstr(real_last_error(nullptr), "comm") != nullptr, "the real library reported the NULL comm itself");
  return failures ? 1 : 0;
}
