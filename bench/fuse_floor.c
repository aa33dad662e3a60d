/* fuse_floor: the floor of FUSE on this kernel, for bench/mount_floor.py.
 *
 * A minimal in-memory filesystem on libfuse3's low-level API, answering every request at
 * once from C: what is left of a request's time is the kernel's and libfuse's part, which
 * any FUSE filesystem pays. gpumemd's mount (pyfuse3, daemon/fs/) is measured against it.
 *
 *     fuse_floor [-o OPTS] [-c COUNTS] [-s SET] [-x CLEAR] [-W] [-F] [-P BYTES]
 *                MOUNTPOINT TIMEOUT
 *
 * It serves in the foreground until unmounted (fusermount3 -u) or sent SIGTERM/SIGINT.
 * TIMEOUT is the entry and attribute timeout in seconds. -o is passed to the mount as
 * pyfuse3 passes its options. -s and -x are the FUSE_CAP_* masks that gpumemd's init
 * library sets (where the kernel offers them) and clears, in place of the default (clear
 * auto_inval_data, set nothing). With -c, the requests are counted per opcode and written
 * to COUNTS (a new file renamed over it) at each SIGUSR1 and at the end, as "seq N" and
 * then "OPNAME COUNT" lines. -P and -F: how a file's pages are made ("file data" below).
 *
 * What it mirrors of gpumemd, so that the two differ only in who answers:
 * - One request at a time: a single thread, the same receive/process loop as libfuse's
 *   fuse_session_loop (pyfuse3's loop receives and processes one buffer the same way),
 *   with one counter added (serve()).
 * - The same operations defined as pyfuse3 defines them where libfuse's init defaults
 *   depend on it: write_buf (libfuse then asks for splice_read: see "Receiving" below, as
 *   in gpumemd), readdirplus, no getlk/setlk/flock (no
 *   posix_locks or flock_locks: the kernel keeps locks itself), no access (never sent
 *   under default_permissions), no mknod/link/symlink (not needed by the workloads).
 *   readdir is defined too, unlike pyfuse3; the readdirplus_auto it would bring is
 *   cleared, below, so it is never called.
 * - Init flags: libfuse 3's defaults, minus readdirplus_auto (pyfuse3 clears it: every
 *   listing is READDIRPLUS) and minus auto_inval_data (gpumemd's DEFAULT_CLEAR in
 *   daemon/fs/mount.py). No writeback_cache, no posix_acl, no export_support (pyfuse3's
 *   Operations as gpumemd sets them). bench/mount_floor.py passes -s/-x computed from
 *   daemon/fs/mount.py (GPUMEMD_FUSE_INIT included), so the two always agree.
 * - Mount options: those of daemon/fs/mount.py's mount_options() (default_permissions,
 *   nodev, allow_other as root), passed by bench/mount_floor.py with -o.
 * - Entry and attribute timeout: ENTRY_TIMEOUT of daemon/fs/attrs.py (the TIMEOUT
 *   argument); a name not found is an ENOENT error, not a cached negative entry.
 * - Opens (daemon/fs/files.py): a write-only open is direct I/O (-W: through the page
 *   cache, as GPUMEMD_MOUNT_WRITE_ONLY=cached); any other open goes through the page cache
 *   with keep_cache set when the inode was opened (cached) before, which is gpumemd's
 *   answer when nothing changed the file outside the mount. O_TRUNC arrives in the open
 *   (atomic_o_trunc) and truncates there.
 * - flush answers ENOSYS as gpumemd does: the kernel stops sending it (one request less
 *   per close). fsync, fsyncdir and release answer at once.
 * - getxattr answers ENODATA and listxattr an empty list (a filesystem that has
 *   attributes but none set: not ENOSYS, which would stop the kernel asking; gpumemd cannot
 *   answer that, as it serves user.* attributes).
 * - st_blksize 1 MiB (daemon/fs/attrs.py's BLOCK).
 * - Request sizes and limits: none is set, here or by gpumemd (pyfuse3 3.5's init changes
 *   want flags only, daemon/fs/_fuseinit.c too, and neither passes max_read=, max_write=,
 *   max_background= or congestion_threshold= options), so libfuse 3.14 negotiates the same
 *   for both (fl_init logs them): max_write 1 MiB (its receive buffer, FUSE_MAX_MAX_PAGES
 *   = 256 pages plus a 4 KiB header, less the header); max_pages 256, sent because the
 *   kernel offers FUSE_MAX_PAGES (its fs.fuse.max_pages_limit is 256 on this kernel too);
 *   max_read unlimited (no max_read= option); max_readahead what the kernel offers (128
 *   KiB), raised after the mount to daemon/fs/mount.py's READ_AHEAD_KB (4 MiB) through the
 *   mount's read_ahead_kb, by bench/mount_floor.py as by gpumemd; max_background and
 *   congestion_threshold 0, the kernel's defaults (12 and 9). A 1 MiB write(2) to a direct
 *   I/O file is one WRITE, a cold read is READs of 1 MiB.
 * - Receiving: splice_read is asked for, but libfuse 3.14 splices only into a pipe of
 *   its whole buffer (1 MiB + 4 KiB), above fs.pipe-max-size (1 MiB), which takes
 *   CAP_SYS_RESOURCE: where the process lacks it (root in the 2-core VM: F_SETPIPE_SZ
 *   answers EPERM) libfuse reads each request with read(2) into its buffer, for gpumemd as
 *   for the floor (strace shows both). Either way a WRITE's bytes are copied twice: by the
 *   kernel (into libfuse's buffer, or into a pipe), then by one fuse_buf_copy straight into
 *   the file's buffer (a memcpy, or a read(2) from the pipe); pyfuse3 copies them into a
 *   bytes object instead, then gpumemd into its memory.
 * - Replies as pyfuse3's: a READ with fuse_reply_buf (one writev of the bytes to the
 *   device, from the file's buffer itself; no splice_write or splice_move, which neither
 *   asks for).
 * It checks no permission (default_permissions: the kernel does) and keeps no access time
 * by relatime (gpumemd does, at opens; it adds no request). */
#define _GNU_SOURCE
#define FUSE_USE_VERSION 34
#include <errno.h>
#include <fuse_lowlevel.h>
#include <getopt.h>
#include <linux/fuse.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define BLKSIZE (1 << 20)
#define HASH_BUCKETS (1 << 17)  /* names of all directories; chains stay short to ~10^6 */
#define NOPS 64                  /* opcodes counted by name; larger ones as OTHER */

struct entry;

struct node {
    struct stat st;
    unsigned long lookups;       /* the kernel's references: forget gives them back */
    unsigned opens;
    int cached;                  /* opened through the page cache before: keep_cache */
    char *data;                  /* a file's bytes: st_size of them valid, cap allocated */
    size_t cap;
    struct node *parent;         /* a directory's "..": its own for the root */
    struct entry **slots;        /* a directory's entries in creation order; NULL: removed */
    size_t nslots, capslots, live;
    unsigned opendirs;           /* slots are compacted only while nobody lists */
};

struct entry {
    struct entry *hnext;
    struct node *dir, *child;
    size_t slot, hash;
    char name[];
};

static struct node root_node;
static struct entry *table[HASH_BUCKETS];
static double timeout = 1.0;
static int write_only_direct = 1;
static unsigned want_set, want_clear = FUSE_CAP_AUTO_INVAL_DATA;   /* gpumemd's DEFAULT_CLEAR */
static unsigned long serial = FUSE_ROOT_ID;   /* st_ino of the next node */
static unsigned long counts[NOPS + 1];
static const char *counts_path;
static volatile sig_atomic_t dump_asked;

/* ---- nodes and names ------------------------------------------------------------------ */
/* A node's FUSE inode number is its address (the root's is FUSE_ROOT_ID): nothing to look
 * up, and it is freed only once the kernel has forgotten it. */
static struct node *node_of(fuse_ino_t ino) {
    return ino == FUSE_ROOT_ID ? &root_node : (struct node *)(uintptr_t)ino;
}

static fuse_ino_t ino_of(struct node *n) {
    return n == &root_node ? FUSE_ROOT_ID : (fuse_ino_t)(uintptr_t)n;
}

static void touch(struct timespec *a, struct timespec *b) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    *a = now;
    if (b)
        *b = now;
}

static struct node *new_node(fuse_req_t req, mode_t mode) {
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    struct node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->st.st_ino = ++serial;
    n->st.st_mode = mode;       /* the kernel has applied the umask (no dont_mask) */
    n->st.st_nlink = S_ISDIR(mode) ? 2 : 1;
    n->st.st_uid = ctx->uid;
    n->st.st_gid = ctx->gid;
    n->st.st_blksize = BLKSIZE;
    touch(&n->st.st_mtim, &n->st.st_ctim);
    n->st.st_atim = n->st.st_mtim;
    return n;
}

/* ---- file data ------------------------------------------------------------------------ */
/* A file's bytes are one buffer, st_size of them valid, whose capacity doubles as it grows
 * (reserve): a file written in order is reallocated log2(size) times, not at every write.
 * Below DATA_MAP bytes it is malloc's; from DATA_MAP up, an anonymous mapping of its own,
 * grown by mremap, which moves page table entries, not bytes (realloc would copy whenever
 * its chunk cannot grow in place). A write's bytes are copied once, from libfuse's buffer
 * straight to their place (fl_write_buf), and a read is answered from the buffer itself
 * (fl_read).
 *
 * A mapping freed with its file is kept as a spare (at most SPARES, the largest) and taken
 * by the next file that grows past DATA_MAP: its pages are made already, so writing a file
 * costs the copy alone, not a page fault and the zeroing of each new 4 KiB page (tmpfs
 * allocates its pages but does not zero those a write fills). -P BYTES makes one spare of
 * BYTES at the start (MAP_POPULATE), so that the first file of that size finds its pages
 * made too. With -F there are no spares: every file faults its pages in as it is written
 * (4 KiB pages: no MADV_HUGEPAGE). */
#define DATA_MAP ((size_t)1 << 20)
#define SPARES 2

struct spare {
    char *data;
    size_t cap;
};

static struct spare spares[SPARES];
static int fresh_pages;                      /* -F */

static char *map_bytes(size_t cap, int populate) {
    char *p = mmap(NULL, cap, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | (populate ? MAP_POPULATE : 0), -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* The largest spare of at least `cap` bytes, taken out of the list; NULL if none. */
static char *take_spare(size_t cap, size_t *got) {
    struct spare *best = NULL;
    for (int i = 0; i < SPARES; i++)
        if (spares[i].data && spares[i].cap >= cap && (!best || spares[i].cap > best->cap))
            best = &spares[i];
    if (!best)
        return NULL;
    char *data = best->data;
    *got = best->cap;
    best->data = NULL;
    return data;
}

/* Room for `need` bytes; the valid ones (st_size) are kept. */
static int reserve(struct node *n, size_t need) {
    if (need <= n->cap)
        return 0;
    size_t cap = n->cap ? n->cap : 4096;
    while (cap < need)
        cap *= 2;
    char *data;
    if (cap < DATA_MAP) {
        data = realloc(n->data, cap);
    } else if (n->cap >= DATA_MAP) {
        data = mremap(n->data, n->cap, cap, MREMAP_MAYMOVE);
        data = data == MAP_FAILED ? NULL : data;
    } else {                                /* malloc's until now: to a mapping */
        size_t got = cap;
        data = take_spare(cap, &got);
        if (!data)
            data = map_bytes(cap, 0);
        if (data) {
            if (n->st.st_size)
                memcpy(data, n->data, n->st.st_size);
            free(n->data);
        }
        cap = got;
    }
    if (!data)
        return ENOMEM;
    n->data = data;
    n->cap = cap;
    return 0;
}

static void set_size(struct node *n, off_t size) {
    n->st.st_size = size;
    n->st.st_blocks = (size + 511) / 512;
}

/* A file's buffer goes: a mapping to the spares (in place of a smaller one when full). */
static void free_data(struct node *n) {
    if (n->cap < DATA_MAP) {
        free(n->data);
        return;
    }
    struct spare *slot = NULL;             /* an empty one, else the smallest */
    for (int i = 0; i < SPARES && !fresh_pages; i++) {
        if (!spares[i].data) {
            slot = &spares[i];
            break;
        }
        if (!slot || spares[i].cap < slot->cap)
            slot = &spares[i];
    }
    if (slot && slot->data && slot->cap >= n->cap)
        slot = NULL;                        /* full of larger ones */
    if (slot) {
        if (slot->data)
            munmap(slot->data, slot->cap);
        slot->data = n->data;
        slot->cap = n->cap;
    } else {
        munmap(n->data, n->cap);
    }
}

/* Freed when nothing refers to it: no name, no kernel reference, not open. */
static void maybe_free(struct node *n) {
    if (n == &root_node || n->st.st_nlink || n->lookups || n->opens)
        return;
    free_data(n);
    free(n->slots);
    free(n);
}

static size_t hash_of(struct node *dir, const char *name) {
    size_t h = 1469598103934665603u ^ (uintptr_t)dir;   /* FNV-1a over the name */
    for (; *name; name++)
        h = (h ^ (unsigned char)*name) * 1099511628211u;
    return h;
}

static struct entry *find(struct node *dir, const char *name) {
    size_t h = hash_of(dir, name);
    for (struct entry *e = table[h % HASH_BUCKETS]; e; e = e->hnext)
        if (e->hash == h && e->dir == dir && strcmp(e->name, name) == 0)
            return e;
    return NULL;
}

/* Drop the removed slots of a directory nobody is listing, once they are half of it: new
 * names are appended, so a listing's offsets (slot numbers) stay valid while it lasts. */
static void compact(struct node *dir) {
    if (dir->opendirs || dir->nslots < 64 || 2 * dir->live > dir->nslots)
        return;
    size_t j = 0;
    for (size_t i = 0; i < dir->nslots; i++)
        if (dir->slots[i]) {
            dir->slots[i]->slot = j;
            dir->slots[j++] = dir->slots[i];
        }
    dir->nslots = j;
}

static int add_name(struct node *dir, const char *name, struct node *child) {
    size_t len = strlen(name);
    struct entry *e = malloc(sizeof *e + len + 1);
    if (!e)
        return ENOMEM;
    compact(dir);
    if (dir->nslots == dir->capslots) {
        size_t cap = dir->capslots ? 2 * dir->capslots : 16;
        struct entry **slots = realloc(dir->slots, cap * sizeof *slots);
        if (!slots) {
            free(e);
            return ENOMEM;
        }
        dir->slots = slots;
        dir->capslots = cap;
    }
    memcpy(e->name, name, len + 1);
    e->dir = dir;
    e->child = child;
    e->hash = hash_of(dir, name);
    e->slot = dir->nslots;
    dir->slots[dir->nslots++] = e;
    dir->live++;
    e->hnext = table[e->hash % HASH_BUCKETS];
    table[e->hash % HASH_BUCKETS] = e;
    touch(&dir->st.st_mtim, &dir->st.st_ctim);
    return 0;
}

static void remove_name(struct entry *e) {
    struct entry **p = &table[e->hash % HASH_BUCKETS];
    while (*p != e)
        p = &(*p)->hnext;
    *p = e->hnext;
    e->dir->slots[e->slot] = NULL;
    e->dir->live--;
    touch(&e->dir->st.st_mtim, &e->dir->st.st_ctim);
    free(e);
}

/* ---- replies -------------------------------------------------------------------------- */
static void fill_entry(struct fuse_entry_param *ep, struct node *n) {
    memset(ep, 0, sizeof *ep);
    ep->ino = ino_of(n);
    ep->attr = n->st;
    ep->attr_timeout = ep->entry_timeout = timeout;
}

/* An entry reply: the kernel now holds one more reference (a lookup) to the node. */
static void reply_entry(fuse_req_t req, struct node *n) {
    struct fuse_entry_param ep;
    fill_entry(&ep, n);
    n->lookups++;
    fuse_reply_entry(req, &ep);
}

/* A truncate: bytes past the old size read back as zeros (what a truncate cut off before
 * is not kept). */
static int resize(struct node *n, off_t size) {
    int err = reserve(n, (size_t)size);
    if (err)
        return err;
    if (size > n->st.st_size)
        memset(n->data + n->st.st_size, 0, size - n->st.st_size);
    set_size(n, size);
    touch(&n->st.st_mtim, &n->st.st_ctim);
    return 0;
}

/* ---- the operations ------------------------------------------------------------------- */
static void fl_init(void *userdata, struct fuse_conn_info *conn) {
    (void)userdata;
    conn->want &= ~FUSE_CAP_READDIRPLUS_AUTO;     /* pyfuse3's init: READDIRPLUS always */
    conn->want |= want_set & conn->capable;       /* then gpumemd's (daemon/fs/_fuseinit.c) */
    conn->want &= ~want_clear;
    fprintf(stderr, "fuse_floor: init capable=0x%x want=0x%x\n", conn->capable, conn->want);
    /* Left as libfuse sets them, as pyfuse3 and daemon/fs/_fuseinit.c leave them. */
    fprintf(stderr, "fuse_floor: init max_write=%u max_read=%u max_readahead=%u "
            "max_background=%u congestion_threshold=%u time_gran=%u\n", conn->max_write,
            conn->max_read, conn->max_readahead, conn->max_background,
            conn->congestion_threshold, conn->time_gran);
}

static void fl_lookup(fuse_req_t req, fuse_ino_t parent, const char *name) {
    struct entry *e = find(node_of(parent), name);
    if (e)
        reply_entry(req, e->child);
    else
        fuse_reply_err(req, ENOENT);
}

static void fl_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup) {
    struct node *n = node_of(ino);
    n->lookups -= nlookup;
    maybe_free(n);
    fuse_reply_none(req);
}

static void fl_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets) {
    for (size_t i = 0; i < count; i++) {
        struct node *n = node_of(forgets[i].ino);
        n->lookups -= forgets[i].nlookup;
        maybe_free(n);
    }
    fuse_reply_none(req);
}

static void fl_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    fuse_reply_attr(req, &node_of(ino)->st, timeout);
}

static void fl_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                       struct fuse_file_info *fi) {
    (void)fi;
    struct node *n = node_of(ino);
    if (to_set & FUSE_SET_ATTR_SIZE) {
        int err = S_ISDIR(n->st.st_mode) ? EISDIR : resize(n, attr->st_size);
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
    }
    if (to_set & FUSE_SET_ATTR_MODE)
        n->st.st_mode = (n->st.st_mode & S_IFMT) | (attr->st_mode & 07777);
    if (to_set & FUSE_SET_ATTR_UID)
        n->st.st_uid = attr->st_uid;
    if (to_set & FUSE_SET_ATTR_GID)
        n->st.st_gid = attr->st_gid;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW)
        touch(&n->st.st_atim, NULL);
    else if (to_set & FUSE_SET_ATTR_ATIME)
        n->st.st_atim = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW)
        touch(&n->st.st_mtim, NULL);
    else if (to_set & FUSE_SET_ATTR_MTIME)
        n->st.st_mtim = attr->st_mtim;
    if (to_set & FUSE_SET_ATTR_CTIME)
        n->st.st_ctim = attr->st_ctim;
    else
        touch(&n->st.st_ctim, NULL);
    fuse_reply_attr(req, &n->st, timeout);
}

static void fl_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode) {
    struct node *dir = node_of(parent);
    if (find(dir, name)) {
        fuse_reply_err(req, EEXIST);
        return;
    }
    struct node *n = new_node(req, S_IFDIR | (mode & 07777));
    int err = n ? add_name(dir, name, n) : ENOMEM;
    if (err) {
        free(n);
        fuse_reply_err(req, err);
        return;
    }
    n->parent = dir;
    dir->st.st_nlink++;
    reply_entry(req, n);
}

/* unlink and rmdir: the name goes; the node when nothing else refers to it. */
static void drop(fuse_req_t req, fuse_ino_t parent, const char *name, int is_dir) {
    struct entry *e = find(node_of(parent), name);
    if (!e) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    struct node *n = e->child, *dir = e->dir;
    if (is_dir != !!S_ISDIR(n->st.st_mode)) {
        fuse_reply_err(req, is_dir ? ENOTDIR : EISDIR);
        return;
    }
    if (is_dir && n->live) {
        fuse_reply_err(req, ENOTEMPTY);
        return;
    }
    remove_name(e);
    if (is_dir) {
        n->st.st_nlink = 0;
        dir->st.st_nlink--;
    } else {
        n->st.st_nlink--;
    }
    touch(&n->st.st_ctim, NULL);
    maybe_free(n);
    fuse_reply_err(req, 0);
}

static void fl_unlink(fuse_req_t req, fuse_ino_t parent, const char *name) {
    drop(req, parent, name, 0);
}

static void fl_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name) {
    drop(req, parent, name, 1);
}

static void fl_rename(fuse_req_t req, fuse_ino_t parent, const char *name,
                      fuse_ino_t newparent, const char *newname, unsigned int flags) {
    struct node *from = node_of(parent), *to = node_of(newparent);
    struct entry *src = find(from, name), *dst = find(to, newname);
    if (flags & RENAME_EXCHANGE) {          /* not needed by the workloads */
        fuse_reply_err(req, EINVAL);
        return;
    }
    if (!src) {
        fuse_reply_err(req, ENOENT);
        return;
    }
    struct node *n = src->child;
    if (dst && dst->child == n) {           /* the same file: nothing to do */
        fuse_reply_err(req, 0);
        return;
    }
    if (dst) {
        struct node *old = dst->child;
        int dir = S_ISDIR(old->st.st_mode);
        int err = flags & RENAME_NOREPLACE ? EEXIST
                  : dir && !S_ISDIR(n->st.st_mode) ? EISDIR
                  : !dir && S_ISDIR(n->st.st_mode) ? ENOTDIR
                  : dir && old->live ? ENOTEMPTY : 0;
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
        remove_name(dst);
        old->st.st_nlink = dir ? 0 : old->st.st_nlink - 1;
        if (dir)
            to->st.st_nlink--;
        maybe_free(old);
    }
    int err = add_name(to, newname, n);     /* first, so that a failure changes nothing */
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    remove_name(src);
    if (S_ISDIR(n->st.st_mode) && from != to) {
        from->st.st_nlink--;
        to->st.st_nlink++;
        n->parent = to;
    }
    touch(&n->st.st_ctim, NULL);
    fuse_reply_err(req, 0);
}

/* How gpumemd opens (daemon/fs/files.py, Files.info): write-only goes direct and forgets
 * the cached pages; otherwise the page cache, kept when it was filled at an earlier open. */
static void open_flags(struct node *n, struct fuse_file_info *fi) {
    if ((fi->flags & O_ACCMODE) == O_WRONLY && write_only_direct) {
        fi->direct_io = 1;
        fi->keep_cache = 0;
        n->cached = 0;
    } else {
        fi->direct_io = 0;
        fi->keep_cache = n->cached;
        n->cached = 1;
    }
    n->opens++;
}

static void fl_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                      struct fuse_file_info *fi) {
    struct node *dir = node_of(parent);
    struct entry *e = find(dir, name);
    struct node *n;
    if (e) {            /* made since the kernel looked: open it as it is (as gpumemd) */
        n = e->child;
        if (fi->flags & O_EXCL || S_ISDIR(n->st.st_mode)) {
            fuse_reply_err(req, fi->flags & O_EXCL ? EEXIST : EISDIR);
            return;
        }
        if (fi->flags & O_TRUNC)
            resize(n, 0);
    } else {
        n = new_node(req, S_IFREG | (mode & 07777));
        int err = n ? add_name(dir, name, n) : ENOMEM;
        if (err) {
            free(n);
            fuse_reply_err(req, err);
            return;
        }
    }
    struct fuse_entry_param ep;
    open_flags(n, fi);
    fill_entry(&ep, n);
    n->lookups++;
    fuse_reply_create(req, &ep, fi);
}

static void fl_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct node *n = node_of(ino);
    if (fi->flags & O_TRUNC) {              /* atomic_o_trunc: no setattr comes for it */
        int err = resize(n, 0);
        if (err) {
            fuse_reply_err(req, err);
            return;
        }
    }
    open_flags(n, fi);
    fuse_reply_open(req, fi);
}

/* Answered from the file's buffer itself: one writev to the device, as pyfuse3's read
 * (fuse_reply_buf of the bytes the handler returns). */
static void fl_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                    struct fuse_file_info *fi) {
    (void)fi;
    struct node *n = node_of(ino);
    size_t left = off < n->st.st_size ? (size_t)(n->st.st_size - off) : 0;
    fuse_reply_buf(req, left ? n->data + off : NULL, left < size ? left : size);
}

/* write_buf, not write: the operation pyfuse3 defines (see the top comment). The bytes are
 * copied once, straight into place: from libfuse's buffer, or, where splice_read is in
 * effect and the write is over a page, read from the pipe ("Receiving" above). */
static void fl_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in, off_t off,
                         struct fuse_file_info *fi) {
    (void)fi;
    struct node *n = node_of(ino);
    size_t len = fuse_buf_size(in);
    int err = reserve(n, (size_t)off + len);
    if (err) {
        fuse_reply_err(req, err);
        return;
    }
    if (off > n->st.st_size)                /* a hole: zeros */
        memset(n->data + n->st.st_size, 0, off - n->st.st_size);
    struct fuse_bufvec out = FUSE_BUFVEC_INIT(len);
    out.buf[0].mem = n->data + off;
    ssize_t got = fuse_buf_copy(&out, in, 0);
    if (got < 0) {
        fuse_reply_err(req, (int)-got);
        return;
    }
    if (off + got > n->st.st_size)
        set_size(n, off + got);
    touch(&n->st.st_mtim, &n->st.st_ctim);
    fuse_reply_write(req, (size_t)got);
}

static void fl_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)ino, (void)fi;
    fuse_reply_err(req, ENOSYS);            /* as gpumemd: no FLUSH at each close from now */
}

static void fl_fsync(fuse_req_t req, fuse_ino_t ino, int datasync,
                     struct fuse_file_info *fi) {
    (void)ino, (void)datasync, (void)fi;
    fuse_reply_err(req, 0);
}

static void fl_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    struct node *n = node_of(ino);
    n->opens--;
    maybe_free(n);
    fuse_reply_err(req, 0);
}

static void fl_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    struct node *n = node_of(ino);
    if (!S_ISDIR(n->st.st_mode)) {
        fuse_reply_err(req, ENOTDIR);
        return;
    }
    n->opendirs++;
    fuse_reply_open(req, fi);
}

/* A listing's offsets: 1 after ".", 2 after "..", slot + 3 after a slot's entry. With
 * `plus`, each entry but the dots is a reference the kernel takes (as a lookup). */
static void list(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, int plus) {
    struct node *dir = node_of(ino);
    char *buf = malloc(size);
    size_t used = 0;
    if (!buf) {
        fuse_reply_err(req, ENOMEM);
        return;
    }
    for (off_t i = off; ; i++) {
        const char *name = i == 0 ? "." : "..";
        struct node *n = i == 0 ? dir : dir->parent ? dir->parent : dir;
        if (i >= 2) {
            if ((size_t)(i - 2) >= dir->nslots)
                break;
            struct entry *e = dir->slots[i - 2];
            if (!e)
                continue;
            name = e->name;
            n = e->child;
        }
        size_t len;
        if (plus) {
            struct fuse_entry_param ep;
            fill_entry(&ep, n);
            len = fuse_add_direntry_plus(req, buf + used, size - used, name, &ep, i + 1);
        } else {
            len = fuse_add_direntry(req, buf + used, size - used, name, &n->st, i + 1);
        }
        if (len > size - used)
            break;
        used += len;
        if (plus && i >= 2)
            n->lookups++;
    }
    fuse_reply_buf(req, buf, used);
    free(buf);
}

static void fl_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                       struct fuse_file_info *fi) {
    (void)fi;
    list(req, ino, size, off, 0);
}

static void fl_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                           struct fuse_file_info *fi) {
    (void)fi;
    list(req, ino, size, off, 1);
}

static void fl_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi) {
    (void)fi;
    struct node *n = node_of(ino);
    n->opendirs--;
    compact(n);
    maybe_free(n);
    fuse_reply_err(req, 0);
}

static void fl_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync,
                        struct fuse_file_info *fi) {
    (void)ino, (void)datasync, (void)fi;
    fuse_reply_err(req, 0);
}

static void fl_statfs(fuse_req_t req, fuse_ino_t ino) {
    (void)ino;
    struct statvfs s = {.f_bsize = 4096, .f_frsize = 4096, .f_blocks = 1 << 24,
                        .f_bfree = 1 << 24, .f_bavail = 1 << 24, .f_files = 1UL << 32,
                        .f_ffree = 1UL << 32, .f_favail = 1UL << 32, .f_namemax = 255};
    fuse_reply_statfs(req, &s);
}

static void fl_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size) {
    (void)ino, (void)name, (void)size;
    fuse_reply_err(req, ENODATA);
}

static void fl_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
    (void)ino;
    if (size == 0)
        fuse_reply_xattr(req, 0);         /* the size of the (empty) list */
    else
        fuse_reply_buf(req, NULL, 0);
}

static const struct fuse_lowlevel_ops ops = {
    .init = fl_init, .lookup = fl_lookup, .forget = fl_forget,
    .forget_multi = fl_forget_multi, .getattr = fl_getattr, .setattr = fl_setattr,
    .mkdir = fl_mkdir, .unlink = fl_unlink, .rmdir = fl_rmdir, .rename = fl_rename,
    .create = fl_create, .open = fl_open, .read = fl_read, .write_buf = fl_write_buf,
    .flush = fl_flush, .fsync = fl_fsync, .release = fl_release, .opendir = fl_opendir,
    .readdir = fl_readdir, .readdirplus = fl_readdirplus, .releasedir = fl_releasedir,
    .fsyncdir = fl_fsyncdir, .statfs = fl_statfs, .getxattr = fl_getxattr,
    .listxattr = fl_listxattr,
};

/* ---- counting and serving ------------------------------------------------------------- */
static const char *const names[NOPS] = {
    [FUSE_LOOKUP] = "LOOKUP", [FUSE_FORGET] = "FORGET", [FUSE_GETATTR] = "GETATTR",
    [FUSE_SETATTR] = "SETATTR", [FUSE_READLINK] = "READLINK", [FUSE_SYMLINK] = "SYMLINK",
    [FUSE_MKNOD] = "MKNOD", [FUSE_MKDIR] = "MKDIR", [FUSE_UNLINK] = "UNLINK",
    [FUSE_RMDIR] = "RMDIR", [FUSE_RENAME] = "RENAME", [FUSE_LINK] = "LINK",
    [FUSE_OPEN] = "OPEN", [FUSE_READ] = "READ", [FUSE_WRITE] = "WRITE",
    [FUSE_STATFS] = "STATFS", [FUSE_RELEASE] = "RELEASE", [FUSE_FSYNC] = "FSYNC",
    [FUSE_SETXATTR] = "SETXATTR", [FUSE_GETXATTR] = "GETXATTR",
    [FUSE_LISTXATTR] = "LISTXATTR", [FUSE_REMOVEXATTR] = "REMOVEXATTR",
    [FUSE_FLUSH] = "FLUSH", [FUSE_INIT] = "INIT", [FUSE_OPENDIR] = "OPENDIR",
    [FUSE_READDIR] = "READDIR", [FUSE_RELEASEDIR] = "RELEASEDIR",
    [FUSE_FSYNCDIR] = "FSYNCDIR", [FUSE_GETLK] = "GETLK", [FUSE_SETLK] = "SETLK",
    [FUSE_SETLKW] = "SETLKW", [FUSE_ACCESS] = "ACCESS", [FUSE_CREATE] = "CREATE",
    [FUSE_INTERRUPT] = "INTERRUPT", [FUSE_BMAP] = "BMAP", [FUSE_DESTROY] = "DESTROY",
    [FUSE_IOCTL] = "IOCTL", [FUSE_POLL] = "POLL", [FUSE_BATCH_FORGET] = "BATCH_FORGET",
    [FUSE_FALLOCATE] = "FALLOCATE", [FUSE_READDIRPLUS] = "READDIRPLUS",
    [FUSE_RENAME2] = "RENAME2", [FUSE_LSEEK] = "LSEEK",
    [FUSE_COPY_FILE_RANGE] = "COPY_FILE_RANGE", [FUSE_SYNCFS] = "SYNCFS",
    [FUSE_TMPFILE] = "TMPFILE", [52] = "STATX",
};

/* The opcode from the request's header. A request libfuse left in the pipe (splice_read:
 * only those longer than a page past a write's header) can only be a WRITE here. */
static void count(const struct fuse_buf *buf) {
    if (buf->flags & FUSE_BUF_IS_FD) {
        counts[FUSE_WRITE]++;
        return;
    }
    uint32_t op = ((const struct fuse_in_header *)buf->mem)->opcode;
    counts[op < NOPS ? op : NOPS]++;
}

static void dump(void) {
    static unsigned long seq;
    char tmp[4096];
    if (!counts_path)
        return;
    snprintf(tmp, sizeof tmp, "%s.tmp", counts_path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        perror(tmp);
        return;
    }
    fprintf(f, "seq %lu\n", ++seq);
    for (int op = 0; op <= NOPS; op++)
        if (counts[op]) {
            if (op == NOPS)
                fprintf(f, "OTHER %lu\n", counts[op]);
            else if (names[op])
                fprintf(f, "%s %lu\n", names[op], counts[op]);
            else
                fprintf(f, "OP%d %lu\n", op, counts[op]);
        }
    if (fclose(f) != 0 || rename(tmp, counts_path) != 0)
        perror(counts_path);
}

static void on_usr1(int sig) {
    (void)sig;
    dump_asked = 1;
}

/* libfuse's fuse_session_loop, plus the count of each request and the dump of the counts
 * when asked: SIGUSR1 (no SA_RESTART) interrupts the wait for the next request. */
static int serve(struct fuse_session *se) {
    struct fuse_buf buf = {.mem = NULL};
    int res = 0;
    while (!fuse_session_exited(se)) {
        res = fuse_session_receive_buf(se, &buf);
        if (dump_asked) {
            dump_asked = 0;
            dump();
        }
        if (res == -EINTR)
            continue;
        if (res <= 0)
            break;
        count(&buf);
        fuse_session_process_buf(se, &buf);
    }
    free(buf.mem);
    fuse_session_reset(se);
    return res < 0 ? -res : 0;
}

static void usage(const char *prog) {
    fprintf(stderr, "usage: %s [-o OPTS] [-c COUNTS] [-s SET] [-x CLEAR] [-W] [-F] "
                    "[-P BYTES] MOUNTPOINT TIMEOUT\n", prog);
    exit(2);
}

int main(int argc, char **argv) {
    struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
    const char *opts = NULL;
    int c;
    size_t premade = 0;
    while ((c = getopt(argc, argv, "o:c:s:x:WFP:")) != -1) {
        switch (c) {
        case 'o': opts = optarg; break;
        case 'c': counts_path = optarg; break;
        case 's': want_set = (unsigned)strtoul(optarg, NULL, 0); break;
        case 'x': want_clear = (unsigned)strtoul(optarg, NULL, 0); break;
        case 'W': write_only_direct = 0; break;
        case 'F': fresh_pages = 1; break;
        case 'P': premade = strtoull(optarg, NULL, 0); break;
        default: usage(argv[0]);
        }
    }
    if (argc - optind != 2)
        usage(argv[0]);
    const char *mountpoint = argv[optind];
    timeout = strtod(argv[optind + 1], NULL);

    root_node.st.st_ino = FUSE_ROOT_ID;
    root_node.st.st_mode = S_IFDIR | 0755;
    root_node.st.st_nlink = 2;
    root_node.st.st_uid = getuid();
    root_node.st.st_gid = getgid();
    root_node.st.st_blksize = BLKSIZE;
    touch(&root_node.st.st_mtim, &root_node.st.st_ctim);
    root_node.st.st_atim = root_node.st.st_mtim;
    root_node.parent = &root_node;
    if (premade >= DATA_MAP && !fresh_pages) {
        spares[0].data = map_bytes(premade, 1);
        spares[0].cap = spares[0].data ? premade : 0;
    }

    /* The arguments as pyfuse3 builds them: a program name, then "-o OPTS". */
    if (fuse_opt_add_arg(&args, argv[0]) ||
        (opts && (fuse_opt_add_arg(&args, "-o") || fuse_opt_add_arg(&args, opts))))
        return 1;
    struct fuse_session *se = fuse_session_new(&args, &ops, sizeof ops, NULL);
    fuse_opt_free_args(&args);
    if (!se)
        return 1;
    int ret = 1;
    struct sigaction sa = {.sa_handler = on_usr1};   /* sa_flags 0: no SA_RESTART */
    sigemptyset(&sa.sa_mask);
    if (fuse_set_signal_handlers(se) == 0 && sigaction(SIGUSR1, &sa, NULL) == 0) {
        if (fuse_session_mount(se, mountpoint) == 0) {
            ret = serve(se);
            dump();
            fuse_session_unmount(se);
        }
        fuse_remove_signal_handlers(se);
    }
    fuse_session_destroy(se);
    return ret;
}
