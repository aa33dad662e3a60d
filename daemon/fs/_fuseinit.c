/* The FUSE connection's init flags (issue 29, docs/mount.md "Init flags").
 *
 * pyfuse3 answers libfuse's init callback in its own C code and asks for a fixed set of
 * capabilities; libfuse's defaults (auto_inval_data among them) stand for the rest. This
 * library, loaded RTLD_GLOBAL before pyfuse3 (daemon/fs/initflags.py), defines
 * fuse_session_new@FUSE_3.0, so that pyfuse3's call binds here: the operations are copied,
 * their init wrapped, and libfuse's own fuse_session_new called with the copy. The wrapper
 * runs pyfuse3's init, then sets and clears the flags the daemon asked for (gpumem_fuse_want)
 * among those the kernel offers, and records what was offered and what was asked, for the
 * daemon to report.
 *
 * One request is answered here, never reaching Python: GETXATTR of a name outside `user.`.
 * The mount has no such attribute (daemon/fs/xattrs.py sets none and answers the same
 * ENODATA, without looking anything up), yet the kernel asks for them all the time:
 * `security.capability` before every write through the page cache (file_remove_privs), and
 * `ls -l` asks `security.selinux` and `system.posix_acl_access` of every file it lists.
 * Through pyfuse3 each costs a coroutine and a trip through the event loop (30-50 us);
 * here, a reply.
 *
 * And WRITE, once the daemon has named its writer (gpumem_fuse_serve_writes): pyfuse3 copies
 * every request's bytes into a new bytes object and runs the handler as a coroutine on the
 * next turn of the event loop; a dd of 1 MiB writes spent 45% of the daemon's time there
 * (docs/mount.md, "Writes from C"). Here the writer is called at once, on the same thread,
 * with the GIL (pyfuse3 holds it while libfuse dispatches), and given a read-only memoryview
 * of libfuse's own receive buffer: the daemon copies the bytes once, into the file's memory.
 * The view is released before the reply, so no reference kept past the call can read the
 * buffer that the next request overwrites. A request whose data sits
 * in a pipe (splice) still goes to pyfuse3.
 *
 * That buffer is this library's own once the daemon asks for it (gpumem_fuse_receive_buffer,
 * where the backend copies by DMA), so that the daemon can page-lock it once and copy a
 * WRITE's bytes to the GPU straight from where the kernel put them. libfuse reads into
 * buf->mem when it is set, and mallocs one otherwise; pyfuse3 frees it when its task ends.
 * So the interposed fuse_session_receive_buf lends the buffer (when buf->mem is unset) and
 * takes it back when nothing was received; fuse_session_process_buf takes it back after the
 * request is dispatched. pyfuse3 calls the two back to back, on one thread with no await
 * between them, and every handler copies what it needs of the request before process_buf
 * returns (libfuse's own loops reuse their buffer the same way): one buffer serves every task,
 * and pyfuse3 never sees it at its free(). Nothing else of pyfuse3's or libfuse's behaviour
 * changes. */
#define PY_SSIZE_T_CLEAN
#define Py_LIMITED_API 0x030B0000   /* the stable ABI (PyBUF_READ in it from 3.11): one build */
#include <Python.h>           /* first, as Python asks; its pyconfig.h defines _GNU_SOURCE */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#define FUSE_USE_VERSION 34
#include <dlfcn.h>
#include <errno.h>
#include <fuse3/fuse_lowlevel.h>
#include <string.h>
#include <sys/mman.h>

typedef struct fuse_session *(*session_new_t)(struct fuse_args *,
                                              const struct fuse_lowlevel_ops *, size_t, void *);
typedef int (*receive_t)(struct fuse_session *, struct fuse_buf *);
typedef void (*process_t)(struct fuse_session *, const struct fuse_buf *);

/* The receive buffer's address space: libfuse reads up to its own bufsize into it (1 MiB + 4
 * KiB in libfuse 3.14), and the kernel never sends more than max_write (at most its
 * max_pages limit, 65535 pages) and a header. Reserved, not committed: only the pages a
 * request reaches are ever made. */
#define RECEIVE_SPAN ((size_t)65536 * 4096 + (1u << 20))
static char *receive_mem;

static struct fuse_lowlevel_ops ops;
static void (*inner_init)(void *, struct fuse_conn_info *);
static void (*inner_getxattr)(fuse_req_t, fuse_ino_t, const char *, size_t);
static void (*inner_write_buf)(fuse_req_t, fuse_ino_t, struct fuse_bufvec *, off_t,
                               struct fuse_file_info *);
static PyObject *writer;  /* writer(fh, offset, view, address) -> bytes written or -errno */
static unsigned long served;      /* WRITEs served through it (gpumem_fuse_served) */
static unsigned want_set, want_clear, seen_capable, seen_want;
static int sessions, inits;
static unsigned long answered;    /* GETXATTRs answered here (gpumem_fuse_answered) */

void gpumem_fuse_want(unsigned set, unsigned clear) { want_set = set; want_clear = clear; }
unsigned gpumem_fuse_capable(void) { return seen_capable; }
unsigned gpumem_fuse_wanted(void) { return seen_want; }
int gpumem_fuse_sessions(void) { return sessions; }
int gpumem_fuse_inits(void) { return inits; }
unsigned long gpumem_fuse_answered(void) { return answered; }
unsigned long gpumem_fuse_served(void) { return served; }

/* Called through ctypes.PyDLL (with the GIL): the writer, or None for pyfuse3's path. */
void gpumem_fuse_serve_writes(PyObject *callable) {
    PyObject *old = writer;
    if (callable == Py_None)
        callable = NULL;
    Py_XINCREF(callable);
    writer = callable;
    Py_XDECREF(old);
}

static void init(void *userdata, struct fuse_conn_info *conn) {
    if (inner_init)
        inner_init(userdata, conn);
    conn->want |= want_set & conn->capable;
    conn->want &= ~want_clear;
    seen_capable = conn->capable;
    seen_want = conn->want;
    inits++;
}

static void getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size) {
    if (strncmp(name, "user.", 5) != 0) {
        answered++;
        fuse_reply_err(req, ENODATA);
        return;
    }
    inner_getxattr(req, ino, name, size);
}

/* The receive buffer (made at the first call) and its reserved size; NULL if mmap fails. */
void *gpumem_fuse_receive_buffer(size_t *size) {
    if (!receive_mem) {
        void *mem = mmap(NULL, RECEIVE_SPAN, PROT_READ | PROT_WRITE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        receive_mem = mem == MAP_FAILED ? NULL : mem;
    }
    *size = receive_mem ? RECEIVE_SPAN : 0;
    return receive_mem;
}

static void *libfuse_symbol(const char *name) {
    void *lib = dlopen("libfuse3.so.3", RTLD_LAZY | RTLD_NOLOAD);
    return lib ? dlvsym(lib, name, "FUSE_3.0") : 0;
}

int fuse_session_receive_buf(struct fuse_session *se, struct fuse_buf *buf) {
    static receive_t real;
    if (!real && !(real = (receive_t)libfuse_symbol("fuse_session_receive_buf")))
        return -ENOSYS;
    int lent = receive_mem && !buf->mem;
    if (lent)
        buf->mem = receive_mem;
    int res = real(se, buf);
    if (lent && res <= 0)
        buf->mem = NULL;             /* no request: pyfuse3 may stop and free() it */
    return res;
}

void fuse_session_process_buf(struct fuse_session *se, const struct fuse_buf *buf) {
    static process_t real;
    if (!real && !(real = (process_t)libfuse_symbol("fuse_session_process_buf")))
        return;
    real(se, buf);
    if (receive_mem && buf->mem == receive_mem)
        ((struct fuse_buf *)buf)->mem = NULL;    /* pyfuse3's own variable: never freed */
}

/* An exception escaping the writer is a bug (the daemon's boundary turns every error into an
 * errno): printed as unraisable, and the request answered EIO; a KeyboardInterrupt is raised
 * again at Python's next check. */
static void drop_error(PyObject *where) {
    if (!PyErr_Occurred())
        return;
    if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)) {
        PyErr_Clear();
        PyErr_SetInterrupt();
    } else {
        PyErr_WriteUnraisable(where);
    }
}

/* What the writer answered: a count, or -errno. */
static long written_or_errno(PyObject *result, PyObject *where) {
    long n = -EIO;
    if (result) {
        n = PyLong_AsLong(result);
        Py_DECREF(result);
        if (n == -1 && PyErr_Occurred())
            n = -EIO;
    }
    drop_error(where);
    return n;
}

static void write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv, off_t off,
                      struct fuse_file_info *fi) {
    struct fuse_buf *buf = &bufv->buf[bufv->idx];
    if (!writer || bufv->count - bufv->idx != 1 || (buf->flags & FUSE_BUF_IS_FD) ||
        bufv->off > buf->size) {
        inner_write_buf(req, ino, bufv, off, fi);
        return;
    }
    PyGILState_STATE gil = PyGILState_Ensure();
    PyObject *callable = writer;
    Py_INCREF(callable);             /* the writer may be replaced while it runs */
    PyObject *view = PyMemoryView_FromMemory((char *)buf->mem + bufv->off,
                                             (Py_ssize_t)(buf->size - bufv->off), PyBUF_READ);
    PyObject *result = view ? PyObject_CallFunction(callable, "KLOK",
                                                    (unsigned long long)fi->fh,
                                                    (long long)off, view,
                                                    (unsigned long long)(uintptr_t)
                                                    ((char *)buf->mem + bufv->off)) : NULL;
    long n = written_or_errno(result, callable);
    if (view) {
        PyObject *gone = PyObject_CallMethod(view, "release", NULL);
        if (!gone) {                 /* still exported: a bug, and the reply must not wait */
            PyErr_WriteUnraisable(view);
        }
        Py_XDECREF(gone);
        Py_DECREF(view);
    }
    Py_DECREF(callable);
    served++;
    PyGILState_Release(gil);
    if (n >= 0)
        fuse_reply_write(req, (size_t)n);
    else
        fuse_reply_err(req, (int)-n);
}

struct fuse_session *fuse_session_new(struct fuse_args *args,
                                      const struct fuse_lowlevel_ops *op, size_t op_size,
                                      void *userdata) {
    session_new_t real = (session_new_t)libfuse_symbol("fuse_session_new");
    if (!real)
        return 0;
    memset(&ops, 0, sizeof ops);
    memcpy(&ops, op, op_size < sizeof ops ? op_size : sizeof ops);
    inner_init = ops.init;
    ops.init = init;
    inner_getxattr = ops.getxattr;
    if (inner_getxattr)
        ops.getxattr = getxattr;
    inner_write_buf = ops.write_buf;
    if (inner_write_buf)
        ops.write_buf = write_buf;
    sessions++;
    return real(args, &ops, op_size, userdata);
}
