/*
 * nccl-net-zip: our own declaration of NCCL's network plugin ABI, version 8.
 *
 * Written from the documented layout (NCCL's ext-net README and the facts in
 * shared/DESIGN.md), not copied from NVIDIA's headers. bindgen turns this file
 * into src/ffi/abi.rs at build time; src/ffi/abi.rs pins every size with a
 * compile-time assertion.
 *
 * NCCL 2.20 .. 2.30 all load a plugin that exports only `ncclNetPlugin_v8`.
 */
#ifndef NCCL_NET_ZIP_NET_V8_H
#define NCCL_NET_ZIP_NET_V8_H

#include <stddef.h>
#include <stdint.h>

/* Result codes returned by every vtable entry. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

/* Log levels understood by NCCL's logger. */
typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5
} ncclDebugLogLevel;

/* Subsystem flags (NCCL_DEBUG_SUBSYS). NCCL's default mask includes INIT;
 * NCCL's own WARN lines carry every flag (NCCL_ALL, ~0). */
#define NCCL_INIT 0x1
#define NCCL_NET 0x10
#define NCCL_ALL (~0UL)

/* The logger is a C variadic: printf-style format plus arguments. */
typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char *file, int line, const char *fmt, ...);

/* Size of the opaque connection handle that NCCL copies between ranks. */
#define NCCL_NET_HANDLE_MAXSIZE 128

/* Pointer kinds for ptrSupport and regMr's type. */
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4

/* Most requests a comm may have outstanding (NCCL_NET_MAX_REQUESTS). */
#define NCCL_NET_MAX_REQUESTS 32

typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1
} ncclNetDeviceType;

/* Device-side handle for device-offloaded networking; we always return NULL. */
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void *handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v8_t;

/* What getProperties reports for one device: 64 bytes on LP64. */
typedef struct {
  char *name;          /* for logs */
  char *pciPath;       /* /sys path of the PCI device, or NULL */
  uint64_t guid;       /* unique per NIC */
  int ptrSupport;      /* NCCL_PTR_* bits */
  int regIsGlobal;     /* 1 if a registration is valid on every comm */
  int speed;           /* Mbps */
  int port;            /* port number */
  float latency;       /* microseconds */
  int maxComms;        /* most comms we can open */
  int maxRecvs;        /* most receives grouped in one irecv */
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
} ncclNetProperties_v8_t;

/* The vtable: a name then 18 entry points (checked against NCCL 2.30 net_v8.h). */
typedef struct {
  const char *name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int *ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t *props);
  ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
  ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                          ncclNetDeviceHandle_v8_t **sendDevComm);
  ncclResult_t (*accept)(void *listenComm, void **recvComm,
                         ncclNetDeviceHandle_v8_t **recvDevComm);
  ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
  ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type,
                              uint64_t offset, int fd, void **mhandle);
  ncclResult_t (*deregMr)(void *comm, void *mhandle);
  ncclResult_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle,
                        void **request);
  ncclResult_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags,
                        void **mhandles, void **request);
  ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                         void **request);
  ncclResult_t (*test)(void *request, int *done, int *sizes);
  ncclResult_t (*closeSend)(void *sendComm);
  ncclResult_t (*closeRecv)(void *recvComm);
  ncclResult_t (*closeListen)(void *listenComm);
  ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
} ncclNet_v8_t;

#endif /* NCCL_NET_ZIP_NET_V8_H */
