/*
 * Internal helpers of the local provider (adapters/local*.c). Not an API:
 * everything here is osr__local_* and used only by adapters/local.c and its
 * integration driver.
 */
#ifndef OSR_ADAPTERS_LOCAL_INT_H
#define OSR_ADAPTERS_LOCAL_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

/**
 * Build the classic-BPF seccomp program the container class hands to
 * bubblewrap (`bwrap --seccomp FD`): a denylist of the kernel interfaces a
 * sandbox never needs and that carry most container-escape history
 * (keyring, ptrace, mount, module loading, bpf, perf, userfaultfd, new user
 * namespaces, setns, kexec, ...). Denied calls fail with EPERM (ENOSYS for
 * clone3 so libc falls back to clone, whose flags we can inspect); foreign
 * architectures and x32 are killed.
 *
 * Writes the `struct sock_filter` array into `out` (at most `cap` bytes)
 * and returns its size in bytes, or 0 if `cap` is too small. Pure: no I/O.
 */
size_t osr__local_seccomp_bpf(void *out, size_t cap);

/* ---- cgroups (local_cgroup.c) ------------------------------------------- */

/** Which cgroup interface enforces the container class's limits. */
typedef enum osr__lcg_mode_e {
  OSR__LCG_NONE = 0, /**< no usable cgroup: rlimits only (prlimit --as, --nproc) */
  OSR__LCG_V1 = 1,   /**< per-controller hierarchies /sys/fs/cgroup/<ctrl>/osr/<id> */
  OSR__LCG_V2 = 2,   /**< the unified hierarchy /sys/fs/cgroup<parent>/<id> */
} osr__lcg_mode_t;

/** Bytes of a cgroup path below the mount (`cgroup_parent`), NUL included. */
#define OSR__LCG_PATH 256

/** What the host offers, probed by osr__lcg_probe() and made real by
 *  osr__lcg_setup(). Each flag says a limit is really enforced by a cgroup;
 *  a limit without its flag falls back to an rlimit (memory, pids) or is not
 *  enforced (cpu), and pause needs `freezer`. */
typedef struct osr__lcg_s {
  osr__lcg_mode_t mode;
  int mem, pids, cpu, freezer;
  int v2_host;                /**< /sys/fs/cgroup is cgroup2 (even when `mode` fell back to NONE) */
  int delegated;              /**< v2: our own cgroup is ours to divide: we live in `leaf` */
  char parent[OSR__LCG_PATH]; /**< the sandboxes' parent below the mount ("/osr") */
  char leaf[OSR__LCG_PATH];   /**< delegated: our own processes' group, "<own>/gateway" */
  char note[640]; /**< why this parent, and why limits fell back ("" = nothing to add) */
} osr__lcg_t;

/** The limits of one sandbox's cgroup. */
typedef struct osr__lcg_limits_s {
  uint64_t mem_bytes;  /**< memory.max / memory.limit_in_bytes; swap is forbidden */
  uint32_t pids_max;   /**< pids.max */
  uint32_t vcpus;      /**< cpu.max quota = vcpus x 100 ms per 100 ms period */
  uint32_t cpu_shares; /**< v1 cpu.shares (1024 = the default); v2 cpu.weight is scaled */
} osr__lcg_limits_t;

/**
 * Find out how limits can be enforced here: the unified hierarchy when
 * /sys/fs/cgroup is a cgroup2 mount (controllers from its cgroup.controllers,
 * cgroup.freeze from kernel 5.2), else the v1 controllers memory, pids, cpu,
 * freezer mounted writable under /sys/fs/cgroup/<ctrl>.
 *
 * v2 parent: `parent` (a cgroup path such as "/system.slice/osr.service/
 * sandboxes", a leading /sys/fs/cgroup is dropped) when non-NULL and
 * non-empty; else "<own>/sandboxes" when our own cgroup (/proc/self/cgroup)
 * is not the root, is writable and either holds no other process or carries
 * systemd's delegate xattr; else "/osr". When some existing group on the
 * way down to the parent lacks a controller and holds processes (which the
 * kernel's "no internal processes" rule makes unfixable from here), the
 * mode falls back to NONE (rlimits) and `note` says why. v1 ignores
 * `parent` (noted). Reads only: safe for available() and `osr doctor`.
 * Returns 0, or OSR_EINVAL when `parent` is not a valid cgroup path.
 */
int osr__lcg_probe(osr__lcg_t *cg, const char *parent);

/**
 * Make the probed v2 plan real (provider init, blocking but brief): move
 * every process of a delegated cgroup into its leaf, create the groups down
 * to the parent and enable the controllers on each level. What the parent
 * really got enabled decides `mem`, `pids`, `cpu`; a refusal is added to
 * `note`, and nothing enabled at all means mode NONE (rlimits). No-op
 * unless mode is V2.
 */
void osr__lcg_setup(osr__lcg_t *cg);

/** One line naming what enforces each limit, e.g. "cgroup v2: memory.max,
 *  ..., pause cgroup.freeze; sandboxes in /sys/fs/cgroup/osr", then the
 *  note if any. Returns `buf`. */
const char *osr__lcg_describe(const osr__lcg_t *cg, char *buf, size_t len);

/**
 * Create sandbox `id`'s cgroup(s) with `lim` (worker thread: blocking file
 * system work). v1: one group per controller under <ctrl>/osr/, its
 * cgroup.procs chowned to `uid` so the unprivileged wrapper can join it.
 * v2: the parent (see osr__lcg_probe) is created if missing with memory,
 * pids and cpu enabled in its cgroup.subtree_control, and never holds
 * a process itself (the "no internal processes" rule); the sandbox group
 * gets memory.max, memory.swap.max = 0, pids.max and cpu.max, all root's.
 * Returns 0 or -errno. On error, osr__lcg_remove() undoes what was made.
 */
int osr__lcg_create(const osr__lcg_t *cg, const char *id, const osr__lcg_limits_t *lim, uid_t uid);

/** The common parent of every sandbox's group, for runsc (gvisor class),
 *  which creates its own group from config.json's cgroupsPath
 *  (<parent>/<id>, osr__lcg_cgroups_path): v2 makes sure the parent exists
 *  with the controllers enabled for its children, so
 *  runsc's group has memory, pids and cpu files to write; v1 does nothing
 *  (runsc creates the per-controller directories itself).
 *  Worker thread. Returns 0 or -errno. */
int osr__lcg_parent(const osr__lcg_t *cg);

/**
 * The cgroup.procs files a process writes its pid into to join sandbox
 * `id`'s cgroups: `out` gets up to `max` paths of `len` bytes each. Returns
 * how many (0 = no cgroup). v1 files accept a write from the sandbox uid
 * (see osr__lcg_create); the v2 file needs root (see spawn_container).
 */
size_t osr__lcg_procs_files(const osr__lcg_t *cg, const char *id, char *out, size_t len,
                            size_t max);

/** runsc's cgroupsPath for sandbox `id`: "<parent>/<id>" (v1: "/osr/<id>"). */
void osr__lcg_cgroups_path(const osr__lcg_t *cg, const char *id, char *out, size_t len);

/** Freeze (`on` = 1) or thaw sandbox `id` and wait, bounded, until the
 *  kernel says it is done (v2: "frozen 1|0" in cgroup.events). Worker
 *  thread. Returns 0, -errno, or OSR_ETIMEDOUT (v2: then thawed again). */
int osr__lcg_freeze(const osr__lcg_t *cg, const char *id, int on);

/** Set the CPU weight of sandbox `id`, given as v1 cpu.shares (v2 writes
 *  cpu.weight = shares x 100 / 1024, at least 1). Also for runsc's groups,
 *  which have the same path. Worker thread. Returns 0 or -errno. */
int osr__lcg_set_shares(const osr__lcg_t *cg, const char *id, uint32_t shares);

/** How many processes of sandbox `id` the kernel's OOM killer has killed
 *  (v2 memory.events, v1 memory.oom_control "oom_kill"), or -1 if unknown.
 *  Worker thread. */
long osr__lcg_oom_kills(const osr__lcg_t *cg, const char *id);

/** Kill every process of sandbox `id` and remove its cgroup(s) (worker
 *  thread, bounded). v2: cgroup.kill where the kernel has it (5.14), else a
 *  freeze + SIGKILL loop over cgroup.procs as in v1. Idempotent. */
void osr__lcg_remove(const osr__lcg_t *cg, const char *id);

/* ---- orphan reaping (local_reap.c) ------------------------------------------ */

/** Reaps the orphans a provider's runtimes leave to this process (gVisor's
 *  sandbox, gofer and ptrace stubs, which `runsc run --detach` leaves
 *  behind): see local_reap.c for why. Embedded in the provider; loop thread
 *  only. */
typedef struct osr__lreap_s {
  uv_loop_t *loop;
  uv_signal_t sig;  /* SIGCHLD */
  uv_timer_t retry; /* a pass that stopped at a zombie libuv reaps itself */
  int open;         /* handles not yet closed */
  int subreaper;    /* this one set PR_SET_CHILD_SUBREAPER */
  unsigned long reaped;
  void (*close_cb)(struct osr__lreap_s *r);
} osr__lreap_t;

/** Make this process a child subreaper (unless it is PID 1, which gets
 *  orphans anyway) and reap its orphans from SIGCHLD, never a child that
 *  a uv_process_t of `loop` waits for. Neither handle keeps the loop alive.
 *  Returns 0, or -errno when the prctl is refused (nothing to close then). */
int osr__lreap_init(osr__lreap_t *r, uv_loop_t *loop);

/** One pass now: reap every exited orphan. Returns how many. */
unsigned osr__lreap_run(osr__lreap_t *r);

/** Last pass, drop the subreaper attribute when no other provider holds it
 *  (children already reparented stay ours and are reaped by the next
 *  provider's init), close both handles; `cb` (may be NULL) runs once both
 *  are closed. Also valid after a failed init (then `cb` runs at once). */
void osr__lreap_close(osr__lreap_t *r, void (*cb)(osr__lreap_t *r));

/** Read at most `cap - 1` bytes of a small file into `buf`, NUL-terminated.
 *  Returns the length or -errno. Shared by local.c and local_cgroup.c. */
int osr__local_read_small(const char *path, char *buf, size_t cap);

#endif
