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
 * here, a reply. Nothing else of pyfuse3's or libfuse's behaviour changes. */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 34
#include <dlfcn.h>
#include <errno.h>
#include <fuse3/fuse_lowlevel.h>
#include <string.h>

typedef struct fuse_session *(*session_new_t)(struct fuse_args *,
                                              const struct fuse_lowlevel_ops *, size_t, void *);

static struct fuse_lowlevel_ops ops;
static void (*inner_init)(void *, struct fuse_conn_info *);
static void (*inner_getxattr)(fuse_req_t, fuse_ino_t, const char *, size_t);
static unsigned want_set, want_clear, seen_capable, seen_want;
static int sessions, inits;
static unsigned long answered;    /* GETXATTRs answered here (gpumem_fuse_answered) */

void gpumem_fuse_want(unsigned set, unsigned clear) { want_set = set; want_clear = clear; }
unsigned gpumem_fuse_capable(void) { return seen_capable; }
unsigned gpumem_fuse_wanted(void) { return seen_want; }
int gpumem_fuse_sessions(void) { return sessions; }
int gpumem_fuse_inits(void) { return inits; }
unsigned long gpumem_fuse_answered(void) { return answered; }

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

struct fuse_session *fuse_session_new(struct fuse_args *args,
                                      const struct fuse_lowlevel_ops *op, size_t op_size,
                                      void *userdata) {
    void *lib = dlopen("libfuse3.so.3", RTLD_LAZY | RTLD_NOLOAD);
    session_new_t real = lib ? (session_new_t)dlvsym(lib, "fuse_session_new", "FUSE_3.0") : 0;
    if (!real)
        return 0;
    memset(&ops, 0, sizeof ops);
    memcpy(&ops, op, op_size < sizeof ops ? op_size : sizeof ops);
    inner_init = ops.init;
    ops.init = init;
    inner_getxattr = ops.getxattr;
    if (inner_getxattr)
        ops.getxattr = getxattr;
    sessions++;
    return real(args, &ops, op_size, userdata);
}
