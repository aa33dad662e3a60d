/* A fake libcuda.so.1 for tests on machines without a GPU.
 *
 * It implements the few driver API calls gpumemctl.cudadrv makes, with host memory standing in
 * for device memory, so the cuda backend, the client's CUDA data path and attach() run end to
 * end through the real cuda.bindings package on any Linux machine:
 *
 *   cuMemCreate                  a memfd of the requested size (POSIX-fd shareable)
 *   cuMemExportToShareableHandle dup() of that memfd;  import: fstat() + dup()
 *   cuMemAddressReserve          an anonymous PROT_NONE mapping (the "virtual address range")
 *   cuMemMap / cuMemSetAccess    mmap(MAP_FIXED|MAP_SHARED) of the memfd / mprotect()
 *   cuMemcpy*, cuMemset*         memcpy / memset (device pointers are host addresses)
 *   cuMemGetHandleForAddressRange  a memfd named "dmabuf" (FAKECUDA_NO_DMABUF=1: unsupported)
 *
 * Device count, memory and support flags come from the environment: FAKECUDA_DEVICES (2 by
 * default), FAKECUDA_TOTAL (bytes per device, 4 GiB by default), FAKECUDA_NO_VMM=1,
 * FAKECUDA_NO_DMABUF=1. Memory accounting is per process (a real GPU counts every process).
 *
 * cuda.bindings resolves every entry point through cuGetProcAddress_v2, so that is the one
 * symbol that matters; the functions are exported under their plain names as well.
 * This is test scaffolding: it checks arguments only as far as the tests need.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;

enum {
    CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100, CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201, CUDA_ERROR_INVALID_HANDLE = 400, CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_SUPPORTED = 801, CUDA_ERROR_UNKNOWN = 999,
};

#define MAX_DEVICES 8
#define MAX_MAPPINGS 4096
#define GRANULARITY (2ull << 20)

typedef struct {             /* what a CUmemGenericAllocationHandle points to */
    int fd;
    size_t size;
    int device;
    int imported;            /* the real driver refuses to re-export an imported handle */
} Alloc;

typedef struct { CUdeviceptr ptr; size_t size; Alloc *alloc; } Mapping;

typedef struct { int type; int handle_types; int loc_type; int loc_id; } PropHead;
typedef struct { int loc_type; int loc_id; unsigned long long flags; } AccessDesc;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static size_t used[MAX_DEVICES];
static Mapping mappings[MAX_MAPPINGS];
static int contexts[MAX_DEVICES];          /* the primary contexts are &contexts[i] */
static __thread CUcontext ctx_stack[64];
static __thread int ctx_depth;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static int device_count(void) {
    int n = env_int("FAKECUDA_DEVICES", 2);
    return n < 0 ? 0 : (n > MAX_DEVICES ? MAX_DEVICES : n);
}

static size_t device_total(void) {
    const char *v = getenv("FAKECUDA_TOTAL");
    return v && *v ? strtoull(v, NULL, 10) : (4ull << 30);
}

static int current_device(void) {
    if (ctx_depth == 0) return -1;
    return (int)((int *)ctx_stack[ctx_depth - 1] - contexts);
}

#define NEED_INIT() do { if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)
#define CHECK_DEV(d) do { if ((d) < 0 || (d) >= device_count()) \
                              return CUDA_ERROR_INVALID_DEVICE; } while (0)

CUresult cuInit(unsigned int flags) {
    (void)flags;
    if (device_count() == 0) return CUDA_ERROR_NO_DEVICE;
    initialized = 1;
    return CUDA_SUCCESS;
}

CUresult cuDriverGetVersion(int *version) { *version = 13000; return CUDA_SUCCESS; }

static const char *error_name(CUresult e) {
    switch (e) {
    case CUDA_SUCCESS: return "CUDA_SUCCESS";
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_DEVICE: return "CUDA_ERROR_INVALID_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_INVALID_HANDLE: return "CUDA_ERROR_INVALID_HANDLE";
    case CUDA_ERROR_NOT_FOUND: return "CUDA_ERROR_NOT_FOUND";
    case CUDA_ERROR_NOT_SUPPORTED: return "CUDA_ERROR_NOT_SUPPORTED";
    default: return NULL;
    }
}

CUresult cuGetErrorName(CUresult e, const char **out) {
    *out = error_name(e);
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorString(CUresult e, const char **out) {
    *out = error_name(e) ? "fake driver error" : NULL;
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuDeviceGetCount(int *count) { NEED_INIT(); *count = device_count(); return 0; }

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    NEED_INIT();
    CHECK_DEV(ordinal);
    *dev = ordinal;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    NEED_INIT();
    CHECK_DEV(dev);
    snprintf(name, len, "Fake GPU %d (host memory)", dev);
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetUuid(unsigned char *uuid, CUdevice dev) {
    static const unsigned char base[16] = {0xfa, 0x4e, 0xc0, 0xda, 0x12, 0x34, 0x40, 0x00,
                                           0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
    NEED_INIT();
    CHECK_DEV(dev);
    memcpy(uuid, base, 16);
    uuid[15] = (unsigned char)dev;
    return CUDA_SUCCESS;
}

CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
    NEED_INIT();
    CHECK_DEV(dev);
    *bytes = device_total();
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetAttribute(int *value, int attr, CUdevice dev) {
    NEED_INIT();
    CHECK_DEV(dev);
    switch (attr) {
    case 102: *value = !env_int("FAKECUDA_NO_VMM", 0); break;       /* VMM supported */
    case 103: *value = !env_int("FAKECUDA_NO_VMM", 0); break;       /* POSIX-fd handles */
    case 110: *value = 1; break;                                    /* RDMA with VMM */
    case 124: *value = !env_int("FAKECUDA_NO_DMABUF", 0); break;    /* dma-buf */
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    NEED_INIT();
    CHECK_DEV(dev);
    *ctx = &contexts[dev];
    return CUDA_SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease(CUdevice dev) { NEED_INIT(); CHECK_DEV(dev); return 0; }

CUresult cuCtxPushCurrent(CUcontext ctx) {
    if (ctx_depth >= 64) return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxPopCurrent(CUcontext *ctx) {
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext top = ctx_stack[--ctx_depth];
    if (ctx) *ctx = top;
    return CUDA_SUCCESS;
}

/* As the driver: replace the top of the stack (push onto an empty one). */
CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (ctx_depth == 0) ctx_stack[ctx_depth++] = ctx;
    else ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxSynchronize(void) { return ctx_depth ? 0 : CUDA_ERROR_INVALID_CONTEXT; }

CUresult cuMemGetInfo(size_t *free_bytes, size_t *total) {
    int dev = current_device();
    if (dev < 0) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    *total = device_total();
    *free_bytes = *total - used[dev];
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuMemGetAllocationGranularity(size_t *gran, const PropHead *prop, int option) {
    (void)option;
    NEED_INIT();
    if (prop->loc_type != 1) return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(prop->loc_id);
    *gran = GRANULARITY;
    return CUDA_SUCCESS;
}

static CUresult new_alloc(int fd, size_t size, int dev, CUmemGenericAllocationHandle *out) {
    Alloc *a = malloc(sizeof *a);
    if (!a) return CUDA_ERROR_OUT_OF_MEMORY;
    a->fd = fd; a->size = size; a->device = dev; a->imported = 0;
    *out = (CUmemGenericAllocationHandle)(uintptr_t)a;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const PropHead *prop,
                     unsigned long long flags) {
    NEED_INIT();
    if (flags || prop->type != 1 || prop->loc_type != 1) return CUDA_ERROR_INVALID_VALUE;
    if (env_int("FAKECUDA_NO_VMM", 0)) return CUDA_ERROR_NOT_SUPPORTED;
    CHECK_DEV(prop->loc_id);
    if (size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    int dev = prop->loc_id;
    pthread_mutex_lock(&lock);
    if (size > device_total() - used[dev]) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    used[dev] += size;
    pthread_mutex_unlock(&lock);
    char name[32];
    snprintf(name, sizeof name, "fakecuda-dev%d", dev);   /* import reads the device back */
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
        if (fd >= 0) close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return new_alloc(fd, size, dev, handle);
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    Alloc *a = (Alloc *)(uintptr_t)handle;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    used[a->device] -= a->size;
    pthread_mutex_unlock(&lock);
    close(a->fd);
    free(a);
    return CUDA_SUCCESS;
}

CUresult cuMemExportToShareableHandle(void *out, CUmemGenericAllocationHandle handle, int type,
                                      unsigned long long flags) {
    Alloc *a = (Alloc *)(uintptr_t)handle;
    if (!a || type != 1 || flags) return CUDA_ERROR_INVALID_VALUE;
    /* As an H100 with driver 580 does: exporting an imported handle is CUDA_ERROR_INVALID_VALUE. */
    if (a->imported) return CUDA_ERROR_INVALID_VALUE;
    int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return CUDA_ERROR_UNKNOWN;
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle,
                                        int type) {
    struct stat st;
    NEED_INIT();
    int fd = (int)(intptr_t)os_handle;
    if (type != 1 || fstat(fd, &st) < 0 || st.st_size <= 0) return CUDA_ERROR_INVALID_VALUE;
    char path[64], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t len = readlink(path, target, sizeof target - 1);
    if (len < 0) return CUDA_ERROR_INVALID_VALUE;
    target[len] = 0;
    const char *tag = strstr(target, "fakecuda-dev");
    if (!tag) return CUDA_ERROR_INVALID_VALUE;            /* not one of our allocations */
    int dev = atoi(tag + strlen("fakecuda-dev"));
    CHECK_DEV(dev);
    int mine = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (mine < 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    used[dev] += (size_t)st.st_size;
    pthread_mutex_unlock(&lock);
    CUresult rc = new_alloc(mine, (size_t)st.st_size, dev, handle);
    if (rc == CUDA_SUCCESS) ((Alloc *)(uintptr_t)*handle)->imported = 1;
    return rc;
}

CUresult cuMemGetAllocationPropertiesFromHandle(PropHead *prop, CUmemGenericAllocationHandle h) {
    Alloc *a = (Alloc *)(uintptr_t)h;
    if (!a) return CUDA_ERROR_INVALID_VALUE;
    prop->type = 1;
    prop->handle_types = 1;
    prop->loc_type = 1;
    prop->loc_id = a->device;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags) {
    (void)align; (void)addr;
    NEED_INIT();
    if (flags || size == 0 || size % GRANULARITY) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    return munmap((void *)(uintptr_t)ptr, size) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h,
                  unsigned long long flags) {
    Alloc *a = (Alloc *)(uintptr_t)h;
    if (!a || flags || offset + size > a->size) return CUDA_ERROR_INVALID_VALUE;
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, a->fd,
                   (off_t)offset);
    if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MAPPINGS; i++) {
        if (mappings[i].ptr == 0) {
            mappings[i] = (Mapping){ptr, size, a};
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    void *p = mmap((void *)(uintptr_t)ptr, size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MAPPINGS; i++)
        if (mappings[i].ptr == ptr) mappings[i].ptr = 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const AccessDesc *desc, size_t count) {
    if (count != 1 || desc->loc_type != 1) return CUDA_ERROR_INVALID_VALUE;
    CHECK_DEV(desc->loc_id);
    int prot = desc->flags == 3 ? PROT_READ | PROT_WRITE : desc->flags == 1 ? PROT_READ : 0;
    return mprotect((void *)(uintptr_t)ptr, size, prot) ? CUDA_ERROR_INVALID_VALUE : 0;
}

static CUresult copy(void *dst, const void *src, size_t n) {
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    memcpy(dst, src, n);
    return CUDA_SUCCESS;
}

CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n) {
    return copy((void *)(uintptr_t)dst, src, n);
}
CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n) {
    return copy(dst, (const void *)(uintptr_t)src, n);
}
CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n) {
    return copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
}
CUresult cuMemcpyHtoDAsync(CUdeviceptr dst, const void *src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyHtoD(dst, src, n);
}
CUresult cuMemcpyDtoHAsync(void *dst, CUdeviceptr src, size_t n, CUstream s) {
    (void)s;
    return cuMemcpyDtoH(dst, src, n);
}

CUresult cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    memset((void *)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

CUresult cuMemsetD32(CUdeviceptr dst, unsigned int v, size_t n) {
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    unsigned int *p = (unsigned int *)(uintptr_t)dst;
    for (size_t i = 0; i < n; i++) p[i] = v;
    return CUDA_SUCCESS;
}

CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags) {
    (void)flags;
    /* Remember the size in front of the buffer, for cuMemFreeHost's munmap. */
    size_t total = size + 4096;
    char *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return CUDA_ERROR_OUT_OF_MEMORY;
    *(size_t *)p = total;
    *pp = p + 4096;
    return CUDA_SUCCESS;
}

CUresult cuMemFreeHost(void *ptr) {
    char *p = (char *)ptr - 4096;
    return munmap(p, *(size_t *)p) ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
}

/* Page-locking existing host memory (the daemon's host tier of an asleep allocation): the
   fake's copies work on any memory, so it only checks the arguments and the context, and
   counts what is registered, so that unregistering what never was is an error. */
static long registered;

CUresult cuMemHostRegister(void *p, size_t size, unsigned int flags) {
    (void)flags;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!p || !size) return CUDA_ERROR_INVALID_VALUE;
    registered++;
    return CUDA_SUCCESS;
}

CUresult cuMemHostUnregister(void *p) {
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (!p || registered <= 0) return CUDA_ERROR_INVALID_VALUE;
    registered--;
    return CUDA_SUCCESS;
}

static int objects;          /* streams and events are opaque non-null pointers */

CUresult cuStreamCreate(CUstream *s, unsigned int flags) {
    (void)flags;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *s = &objects;
    return CUDA_SUCCESS;
}
CUresult cuStreamDestroy(CUstream s) { return s ? 0 : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return CUDA_SUCCESS; }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int f) {
    (void)s; (void)e; (void)f;
    return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent *e, unsigned int flags) {
    (void)flags;
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    *e = &objects;
    return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream s) { (void)s; return e ? 0 : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuEventSynchronize(CUevent e) { return e ? 0 : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuEventQuery(CUevent e) { return e ? 0 : CUDA_ERROR_INVALID_HANDLE; }
CUresult cuEventDestroy(CUevent e) { return e ? 0 : CUDA_ERROR_INVALID_HANDLE; }

CUresult cuMemGetHandleForAddressRange(void *out, CUdeviceptr ptr, size_t size, int type,
                                       unsigned long long flags) {
    (void)flags;
    if (env_int("FAKECUDA_NO_DMABUF", 0)) return CUDA_ERROR_NOT_SUPPORTED;
    if (type != 1 || size == 0 || ptr % 4096 || size % 4096) return CUDA_ERROR_INVALID_VALUE;
    int found = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_MAPPINGS; i++)
        if (mappings[i].ptr && mappings[i].ptr <= ptr &&
            ptr + size <= mappings[i].ptr + mappings[i].size)
            found = 1;
    pthread_mutex_unlock(&lock);
    if (!found) return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("dmabuf", MFD_CLOEXEC);
    if (fd < 0) return CUDA_ERROR_UNKNOWN;
    *(int *)out = fd;
    return CUDA_SUCCESS;
}

/* ---- symbol lookup ------------------------------------------------------------------- */
struct entry { const char *name; void *fn; };
#define E(f) {#f, (void *)f}
static const struct entry table[] = {
    E(cuInit), E(cuDriverGetVersion), E(cuGetErrorName), E(cuGetErrorString),
    E(cuDeviceGetCount), E(cuDeviceGet), E(cuDeviceGetName), E(cuDeviceGetUuid),
    E(cuDeviceTotalMem), E(cuDeviceGetAttribute), E(cuDevicePrimaryCtxRetain),
    E(cuDevicePrimaryCtxRelease), E(cuCtxPushCurrent), E(cuCtxPopCurrent), E(cuCtxSetCurrent), E(cuCtxSynchronize),
    E(cuMemGetInfo), E(cuMemGetAllocationGranularity), E(cuMemCreate), E(cuMemRelease),
    E(cuMemExportToShareableHandle), E(cuMemImportFromShareableHandle),
    E(cuMemGetAllocationPropertiesFromHandle), E(cuMemAddressReserve),
    E(cuMemAddressFree), E(cuMemMap), E(cuMemUnmap), E(cuMemSetAccess), E(cuMemcpyHtoD),
    E(cuMemcpyDtoH), E(cuMemcpyDtoD), E(cuMemcpyHtoDAsync), E(cuMemcpyDtoHAsync),
    E(cuMemsetD8), E(cuMemsetD32), E(cuMemHostAlloc), E(cuMemFreeHost), E(cuStreamCreate),
    E(cuMemHostRegister), E(cuMemHostUnregister),
    E(cuStreamDestroy), E(cuStreamSynchronize), E(cuStreamWaitEvent), E(cuEventCreate),
    E(cuEventRecord), E(cuEventSynchronize), E(cuEventQuery), E(cuEventDestroy),
    E(cuMemGetHandleForAddressRange),
    {NULL, NULL},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                             unsigned long long flags, int *status) {
    (void)version; (void)flags;
    for (const struct entry *e = table; e->name; e++) {
        if (strcmp(e->name, symbol) == 0) {
            *pfn = e->fn;
            if (status) *status = 0;
            return CUDA_SUCCESS;
        }
    }
    if (getenv("FAKECUDA_TRACE")) fprintf(stderr, "fakecuda: no %s\n", symbol);
    *pfn = NULL;
    if (status) *status = 1;
    return CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                          unsigned long long flags) {
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
