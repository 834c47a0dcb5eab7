// The C interface between libronde and its Gloo backend module. The module
// links the system Gloo and never LibTorch, and is opened with RTLD_DEEPBIND,
// so only plain C types cross this line: no exceptions, no STL objects.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever a signature below changes; libronde refuses a module of
// another version instead of calling it with the wrong arguments.
#define RONDE_GLOO_ABI_VERSION 1

// Element types the module can reduce. Collectives that only move bytes
// (allgather, broadcast, alltoall) take byte counts and need no type.
enum RondeGlooDType {
  RONDE_GLOO_F32 = 0,
  RONDE_GLOO_F64 = 1,
  RONDE_GLOO_F16 = 2,
  RONDE_GLOO_BF16 = 3,
  RONDE_GLOO_I8 = 4,
  RONDE_GLOO_U8 = 5,
  RONDE_GLOO_I16 = 6,
  RONDE_GLOO_I32 = 7,
  RONDE_GLOO_I64 = 8,
};

enum RondeGlooReduce {
  RONDE_GLOO_SUM = 0,
  RONDE_GLOO_MIN = 1,
  RONDE_GLOO_MAX = 2,
  RONDE_GLOO_PRODUCT = 3,
};

enum RondeGlooAlgorithm {
  RONDE_GLOO_RING = 0,
  RONDE_GLOO_BCUBE = 1,
};

// Error codes: 0 is success. A peer or network failure leaves the
// communicator unusable; a bad argument does not.
enum RondeGlooStatus {
  RONDE_GLOO_OK = 0,
  RONDE_GLOO_IO_ERROR = 1,
  RONDE_GLOO_TIMEOUT = 2,
  RONDE_GLOO_INVALID = 3,
  RONDE_GLOO_INTERNAL = 4,
};

// The key-value store the module rendezvouses through, provided by libronde
// (a c10d::TCPStore behind it). Each callback returns 0 on success, else
// writes a message into err (NUL-terminated, at most err_len bytes).
struct RondeGlooStore {
  void* self;
  int (*set)(
      void* self,
      const char* key,
      const char* data,
      size_t len,
      char* err,
      size_t err_len);
  // On success *data is malloc()ed by the callback and free()d by the module.
  int (*get)(
      void* self,
      const char* key,
      char** data,
      size_t* len,
      char* err,
      size_t err_len);
  int (*wait)(
      void* self,
      const char* const* keys,
      size_t n_keys,
      int64_t timeout_ms,
      char* err,
      size_t err_len);
};

typedef struct RondeGlooComm RondeGlooComm;

int ronde_gloo_abi_version(void);

// The file that this module's Gloo entry points resolve to (dladdr of
// gloo::allreduce), so libronde can check that it is not LibTorch's copy.
const char* ronde_gloo_library_path(void);

int ronde_gloo_connect(
    const struct RondeGlooStore* store,
    int rank,
    int size,
    const char* hostname,
    int64_t timeout_ms,
    int algorithm,
    RondeGlooComm** out,
    char* err,
    size_t err_len);
void ronde_gloo_destroy(RondeGlooComm* comm);
// Closes every connection and frees nothing: safe to call from another
// thread while a collective blocks on `comm`. Peers blocked on this rank
// then fail at once; ronde_gloo_destroy must still be called afterwards.
void ronde_gloo_interrupt(RondeGlooComm* comm);

// In place: buf holds this rank's input and receives the reduced result.
int ronde_gloo_allreduce(
    RondeGlooComm* comm,
    void* buf,
    size_t count,
    int dtype,
    int op,
    char* err,
    size_t err_len);
// out receives every rank's input in rank order; counts[r] is rank r's size
// in bytes (counts[rank] == in_bytes).
int ronde_gloo_allgatherv(
    RondeGlooComm* comm,
    const void* in,
    size_t in_bytes,
    void* out,
    const size_t* counts,
    char* err,
    size_t err_len);
int ronde_gloo_broadcast(
    RondeGlooComm* comm,
    void* buf,
    size_t bytes,
    int root,
    char* err,
    size_t err_len);
// send_bytes[r] bytes go to rank r, recv_bytes[r] bytes come from rank r;
// both buffers are laid out in rank order.
int ronde_gloo_alltoallv(
    RondeGlooComm* comm,
    const void* in,
    const int64_t* send_bytes,
    void* out,
    const int64_t* recv_bytes,
    char* err,
    size_t err_len);
int ronde_gloo_barrier(RondeGlooComm* comm, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif
