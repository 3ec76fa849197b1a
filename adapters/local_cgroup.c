/*
 * The container class's cgroups: memory, process-count and CPU limits,
 * pause (freezer), OOM accounting and teardown, on either cgroup interface
 * the host mounts (docs/local-provider.md "Limits").
 *
 *   v1  one hierarchy per controller: /sys/fs/cgroup/<ctrl>/osr/<id>, for
 *       memory, pids, cpu and freezer (what this project's build VM mounts).
 *   v2  the unified hierarchy: /sys/fs/cgroup<parent>/<id>, with memory,
 *       pids and cpu enabled in the parent's cgroup.subtree_control; the
 *       freezer is cgroup.freeze and teardown cgroup.kill (what a stock
 *       Debian 12 host, and most production hosts, mount). The parent is
 *       the `cgroup_parent` option, else <own>/sandboxes when our own cgroup
 *       is delegated to us (we then move into the leaf <own>/gateway), else
 *       /osr (docs/local-provider.md "The cgroup parent").
 *
 * osr__lcg_probe() and osr__lcg_describe() only read; osr__lcg_setup()
 * writes at provider init (before the loop runs, like the other
 * configuration-time probes). Everything else does blocking file-system
 * work and runs on the thread pool (prep_work, clean_work, freeze_work,
 * handoff_work in local.c). The only waits are bounded polls of kernel
 * state that changes asynchronously (frozen, populated).
 */
#include "adapters/local_int.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "osr/common.h"

#define CG_ROOT "/sys/fs/cgroup"
#define CG_PATH 512
#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif
/* How long freezing or emptying a group may take before we give up. The
 * kernel does both asynchronously (a task is frozen or dies when it next
 * returns to user space), normally within milliseconds. */
#define CG_WAIT_MS 5000
/* The v2 parent where nothing else says otherwise, and the two children
 * of a delegated cgroup: the sandboxes' parent and our own leaf. */
#define CG_DEFAULT   "/osr"
#define CG_SANDBOXES "sandboxes"
#define CG_LEAF      "gateway"

static const char *const v1_ctrl[] = {"memory", "pids", "cpu", "freezer"};

static int v1_on(const osr__lcg_t *cg, int i)
{
  const int on[] = {cg->mem, cg->pids, cg->cpu, cg->freezer};
  return on[i];
}

/* <root>[/<ctrl>]<parent>[/<id>][/<file>]; ctrl is NULL for v2, id "" for
 * the parent. Lengths are bounded by construction (parent < 256 bytes,
 * ids < 40). */
static void path_of(const osr__lcg_t *cg, char *out, size_t len, const char *ctrl, const char *id,
                    const char *file)
{
  snprintf(out, len, CG_ROOT "%s%s%s%s%s%s%s", ctrl ? "/" : "", ctrl ? ctrl : "", cg->parent,
           id[0] ? "/" : "", id, file ? "/" : "", file ? file : "");
}

int osr__local_read_small(const char *path, char *buf, size_t cap)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  size_t n = 0;
  while (n + 1 < cap) {
    ssize_t r = read(fd, buf + n, cap - 1 - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      break;
    n += (size_t)r;
  }
  close(fd);
  buf[n] = '\0';
  return (int)n;
}

/* One write of a control file: cgroupfs takes each write(2) as one
 * command, so no O_CREAT/O_TRUNC and no partial-write loop. */
static int cg_write(const char *path, const char *val)
{
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  size_t n = strlen(val);
  ssize_t w = write(fd, val, n);
  int rv = w == (ssize_t)n ? 0 : w < 0 ? -errno : -EIO;
  close(fd);
  return rv;
}

static int cg_write_u64(const char *path, uint64_t v)
{
  char val[32];
  snprintf(val, sizeof(val), "%llu", (unsigned long long)v);
  return cg_write(path, val);
}

/* The value of `key` in a flat-keyed file ("key value" lines: cgroup.events,
 * memory.events, memory.oom_control), or -1. */
static long keyed_value(const char *path, const char *key)
{
  char buf[1024];
  if (osr__local_read_small(path, buf, sizeof(buf)) <= 0)
    return -1;
  size_t kl = strlen(key);
  for (char *s = buf; *s != '\0';) {
    if (strncmp(s, key, kl) == 0 && s[kl] == ' ')
      return strtol(s + kl + 1, NULL, 10);
    char *nl = strchr(s, '\n');
    if (nl == NULL)
      break;
    s = nl + 1;
  }
  return -1;
}

static uint64_t mono_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Poll `key` of cgroup.events until it equals `want` (bounded). */
static int v2_wait_event(const osr__lcg_t *cg, const char *id, const char *key, long want)
{
  char path[CG_PATH];
  path_of(cg, path, sizeof(path), NULL, id, "cgroup.events");
  uint64_t end = mono_ms() + CG_WAIT_MS;
  for (;;) {
    long v = keyed_value(path, key);
    if (v == want)
      return 0;
    if (v < 0)
      return OSR_ENOENT; /* the group is gone */
    if (mono_ms() >= end)
      return OSR_ETIMEDOUT;
    usleep(2000); /* worker thread */
  }
}

/* SIGKILL every pid listed in a cgroup.procs file; 1 if there was any. */
static int kill_listed(const char *procs)
{
  char buf[1 << 16];
  int any = 0;
  if (osr__local_read_small(procs, buf, sizeof(buf)) <= 0)
    return 0;
  for (char *s = buf; *s != '\0';) {
    char *end;
    long pid = strtol(s, &end, 10);
    if (end == s) {
      s++;
      continue;
    }
    if (pid > 0) {
      kill((pid_t)pid, SIGKILL);
      any = 1;
    }
    s = end;
  }
  return any;
}

/* ---- probe -------------------------------------------------------------- */

static int kernel_at_least(int major, int minor)
{
  struct utsname u;
  int ma = 0, mi = 0;
  if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &ma, &mi) != 2)
    return 0;
  return ma > major || (ma == major && mi >= minor);
}

static int has_word(const char *list, const char *w)
{
  size_t n = strlen(w);
  for (const char *s = list; (s = strstr(s, w)) != NULL; s += n)
    if ((s == list || s[-1] == ' ') && (s[n] == ' ' || s[n] == '\n' || s[n] == '\0'))
      return 1;
  return 0;
}

static int v1_usable(const char *ctrl)
{
  /* Usable = we may create groups (root, controller mounted rw). */
  char path[128];
  snprintf(path, sizeof(path), CG_ROOT "/%s/cgroup.procs", ctrl);
  if (access(path, W_OK) != 0)
    return 0;
  snprintf(path, sizeof(path), CG_ROOT "/%s", ctrl);
  return access(path, W_OK) == 0;
}

/* A cgroup path below the mount as an operator may write it: "/a/b", each
 * component of [A-Za-z0-9._@:-] and not "." or "..", no empty component,
 * not "/" itself (the sandboxes need a parent of their own). */
static int rel_ok(const char *p)
{
  size_t n = strlen(p);
  if (n < 2 || n >= OSR__LCG_PATH || p[0] != '/' || p[n - 1] == '/')
    return 0;
  for (const char *c = p; *c != '\0'; c++) {
    if (*c == '/') {
      if (c[1] == '/' || (c[1] == '.' && (c[2] == '/' || c[2] == '\0')) ||
          (c[1] == '.' && c[2] == '.' && (c[3] == '/' || c[3] == '\0')))
        return 0;
      continue;
    }
    if (!(*c >= 'a' && *c <= 'z') && !(*c >= 'A' && *c <= 'Z') && !(*c >= '0' && *c <= '9') &&
        strchr("._@:-", *c) == NULL)
      return 0;
  }
  return 1;
}

/* Our own v2 cgroup ("0::<path>" of /proc/self/cgroup), relative to the
 * cgroup namespace root and so to this namespace's /sys/fs/cgroup mount. */
static int own_cgroup(char *out, size_t len)
{
  char buf[2048];
  if (osr__local_read_small("/proc/self/cgroup", buf, sizeof(buf)) <= 0)
    return OSR_ENOENT;
  for (char *s = buf; s != NULL && *s != '\0'; s = strchr(s, '\n') ? strchr(s, '\n') + 1 : NULL) {
    if (strncmp(s, "0::", 3) != 0)
      continue;
    size_t n = strcspn(s + 3, "\n");
    if (n == 0 || n >= len || s[3] != '/')
      return OSR_ENOENT;
    memcpy(out, s + 3, n);
    out[n] = '\0';
    return 0;
  }
  return OSR_ENOENT;
}

/* How many processes other than this one cgroup `rel` ("" = the namespace
 * root) holds; 0 when it does not exist. */
static int others_in(const char *rel)
{
  char path[CG_PATH], buf[1 << 14];
  snprintf(path, sizeof(path), CG_ROOT "%s/cgroup.procs", rel);
  if (osr__local_read_small(path, buf, sizeof(buf)) <= 0)
    return 0;
  int n = 0;
  for (char *s = buf, *end; *s != '\0'; s = end) {
    long pid = strtol(s, &end, 10);
    if (end == s)
      break;
    n += pid > 0 && pid != (long)getpid();
  }
  return n;
}

/* systemd (251+) marks a Delegate=yes unit's cgroup with this xattr. */
static int delegate_marked(const char *rel)
{
  char path[CG_PATH], v[4] = "";
  snprintf(path, sizeof(path), CG_ROOT "%s", rel);
  return (getxattr(path, "trusted.delegate", v, sizeof(v) - 1) == 1 && v[0] == '1') ||
         (getxattr(path, "user.delegate", v, sizeof(v) - 1) == 1 && v[0] == '1');
}

static int writable(const char *rel, const char *file)
{
  char path[CG_PATH];
  snprintf(path, sizeof(path), CG_ROOT "%s%s%s", rel, file ? "/" : "", file ? file : "");
  return access(path, W_OK) == 0;
}

/* The controllers of ours that `rel`'s cgroup.subtree_control (or, with
 * file "cgroup.controllers", its offer) lists: bit 0 memory, 1 pids, 2 cpu. */
static unsigned ctrl_bits(const char *rel, const char *file)
{
  char path[CG_PATH], buf[512];
  snprintf(path, sizeof(path), CG_ROOT "%s/%s", rel, file);
  if (osr__local_read_small(path, buf, sizeof(buf)) < 0)
    return 0;
  return (has_word(buf, "memory") ? 1u : 0u) | (has_word(buf, "pids") ? 2u : 0u) |
         (has_word(buf, "cpu") ? 4u : 0u);
}

static unsigned want_bits(const osr__lcg_t *cg)
{
  return (cg->mem ? 1u : 0u) | (cg->pids ? 2u : 0u) | (cg->cpu ? 4u : 0u);
}

static void set_bits(osr__lcg_t *cg, unsigned b)
{
  cg->mem = (b & 1u) != 0;
  cg->pids = (b & 2u) != 0;
  cg->cpu = (b & 4u) != 0;
}

/* No limits by cgroups after all (rlimits), with the reason in the note. */
static void fall_back(osr__lcg_t *cg)
{
  cg->mode = OSR__LCG_NONE;
  cg->mem = cg->pids = cg->cpu = cg->freezer = 0;
}

/* One level down the path `p` (what is left of a parent path, "/b/c"):
 * append its first component to `rel` (sized OSR__LCG_PATH, and `rel` + `p`
 * is a prefix of that parent, so it fits) and return the rest, or NULL at
 * the end. */
static const char *descend(char *rel, const char *p)
{
  if (*p == '\0')
    return NULL;
  size_t n = strcspn(p + 1, "/") + 1, l = strlen(rel);
  memcpy(rel + l, p, n);
  rel[l + n] = '\0';
  return p + n;
}

/* The v2 parent: `want` (or the probe's choice) and, read-only, whether the
 * kernel will let us enable the controllers on the way down to it. It
 * refuses them in the cgroup.subtree_control of a non-root group that holds
 * processes ("no internal processes"), and a cgroup namespace root is such
 * a group (some containers). */
static void v2_choose(osr__lcg_t *cg, const char *want)
{
  char own[OSR__LCG_PATH], base[OSR__LCG_PATH] = "/";
  if (own_cgroup(own, sizeof(own)) == 0) {
    /* A restart from the leaf (e.g. systemd's DelegateSubgroup=gateway)
     * finds the same delegated subtree. */
    char *slash = strrchr(own, '/');
    snprintf(base, sizeof(base), "%s", own);
    if (slash != own && strcmp(slash + 1, CG_LEAF) == 0)
      base[slash - own] = '\0';
  }
  size_t bl = strlen(base);
  int others = strcmp(base, "/") ? others_in(base) : 0, marked = delegate_marked(base);
  int ours = strcmp(base, "/") != 0 && writable(base, NULL) && writable(base, "cgroup.procs") &&
             writable(base, "cgroup.subtree_control");
  if (want != NULL && want[0] != '\0') {
    snprintf(cg->parent, sizeof(cg->parent), "%s", want);
    snprintf(cg->note, sizeof(cg->note), "cgroup_parent %s", want);
    /* Set inside our own cgroup: that one must be left for a leaf too. */
    if (ours && strncmp(want, base, bl) == 0 && want[bl] == '/' &&
        strncmp(want + bl + 1, CG_LEAF, sizeof(CG_LEAF) - 1) != 0 &&
        bl + sizeof(CG_LEAF) + 1 <= sizeof(cg->leaf))
      cg->delegated = 1;
  } else if (strcmp(base, "/") == 0) {
    /* The (namespace) root: keep to a group of our own next to the rest. */
  } else if (!ours) {
    snprintf(cg->note, sizeof(cg->note), "own cgroup %s is not delegated (not writable)", base);
  } else if (!marked && access("/run/systemd/system", F_OK) == 0) {
    /* Under systemd a unit's group is systemd's unless the unit says
     * Delegate=yes (and then systemd marks it): root may write it, but
     * systemd would not expect our groups in it. */
    snprintf(cg->note, sizeof(cg->note),
             "own cgroup %s is not delegated (systemd, no Delegate=yes)", base);
  } else if (others > 0 && !marked) {
    /* e.g. a shell's group: the other processes are not ours to move. */
    snprintf(cg->note, sizeof(cg->note),
             "own cgroup %s is not delegated (%d other process(es), no delegate mark)", base,
             others);
  } else if (bl + sizeof(CG_SANDBOXES) + 1 > sizeof(cg->parent)) {
    snprintf(cg->note, sizeof(cg->note), "own cgroup path too long");
  } else {
    cg->delegated = 1;
    snprintf(cg->parent, sizeof(cg->parent), "%s/" CG_SANDBOXES, base);
    snprintf(cg->note, sizeof(cg->note), "delegated cgroup %s", base);
  }
  if (cg->delegated) {
    snprintf(cg->leaf, sizeof(cg->leaf), "%s/" CG_LEAF, base);
    size_t l = strlen(cg->note);
    snprintf(cg->note + l, sizeof(cg->note) - l, ", this process in %s", cg->leaf);
  }
  /* Walk from the namespace root down to the parent: every existing group
   * that still lacks one of the controllers must hold no process once we
   * are in the leaf (the real root is exempt from the rule; a namespace
   * root is not, and has a cgroup.type file where the real root has none). */
  int have_own = own_cgroup(own, sizeof(own)) == 0;
  int root_is_ns = access(CG_ROOT "/cgroup.type", F_OK) == 0;
  unsigned want_b = want_bits(cg);
  char rel[OSR__LCG_PATH] = "", path[CG_PATH];
  for (const char *p = cg->parent;;) {
    snprintf(path, sizeof(path), CG_ROOT "%s", rel);
    if (access(path, F_OK) != 0)
      break; /* we create the rest, empty */
    int self_here = have_own && strcmp(own, rel[0] ? rel : "/") == 0 &&
                    !(cg->delegated && strcmp(rel, base) == 0);
    int busy = (rel[0] != '\0' || root_is_ns) &&
               (ctrl_bits(rel, "cgroup.subtree_control") & want_b) != want_b &&
               (self_here || (others_in(rel) > 0 && !(cg->delegated && strcmp(rel, base) == 0)));
    if (busy) {
      size_t l = strlen(cg->note);
      snprintf(cg->note + l, sizeof(cg->note) - l,
               "%s%s holds processes, so the kernel refuses controllers in its "
               "cgroup.subtree_control (no internal processes)",
               l ? "; " : "", rel[0] ? rel : "the cgroup namespace root");
      fall_back(cg);
      return;
    }
    if ((p = descend(rel, p)) == NULL)
      break;
  }
}

int osr__lcg_probe(osr__lcg_t *cg, const char *parent)
{
  memset(cg, 0, sizeof(*cg));
  snprintf(cg->parent, sizeof(cg->parent), CG_DEFAULT);
  if (parent != NULL && parent[0] != '\0') {
    if (strncmp(parent, CG_ROOT "/", sizeof(CG_ROOT)) == 0)
      parent += sizeof(CG_ROOT) - 1; /* /sys/fs/cgroup/a/b is /a/b */
    if (!rel_ok(parent))
      return OSR_EINVAL;
  }
  struct statfs sf;
  if (statfs(CG_ROOT, &sf) == 0 && sf.f_type == CGROUP2_SUPER_MAGIC) {
    /* Unified: the controllers the root offers, if we may manage it. */
    cg->v2_host = 1;
    if (access(CG_ROOT, W_OK) != 0) {
      snprintf(cg->note, sizeof(cg->note), CG_ROOT " is not writable");
      return 0;
    }
    set_bits(cg, ctrl_bits("", "cgroup.controllers"));
    /* cgroup.freeze is core (no controller) since 5.2; only non-root
     * groups have the file, so the kernel version is what tells. */
    cg->freezer = kernel_at_least(5, 2);
    cg->mode = OSR__LCG_V2;
    v2_choose(cg, parent);
    return 0;
  }
  cg->mem = v1_usable("memory");
  cg->pids = v1_usable("pids");
  cg->cpu = v1_usable("cpu");
  cg->freezer = v1_usable("freezer");
  cg->mode = cg->mem || cg->pids || cg->cpu || cg->freezer ? OSR__LCG_V1 : OSR__LCG_NONE;
  if (parent != NULL && parent[0] != '\0')
    snprintf(cg->note, sizeof(cg->note), "cgroup_parent %s ignored: it applies to cgroup v2",
             parent);
  return 0;
}

/* Move every process of `from` into `to` (pids that exit meanwhile are
 * gone anyway). Bounded: a group that keeps gaining processes is not ours. */
static int move_all(const char *from, const char *to)
{
  char src[CG_PATH], dst[CG_PATH], buf[1 << 14], val[24];
  snprintf(src, sizeof(src), CG_ROOT "%s/cgroup.procs", from);
  snprintf(dst, sizeof(dst), CG_ROOT "%s/cgroup.procs", to);
  for (int round = 0; round < 16; round++) {
    if (osr__local_read_small(src, buf, sizeof(buf)) < 0)
      return -errno;
    if (buf[0] == '\0')
      return 0;
    for (char *s = buf, *end; *s != '\0'; s = end) {
      long pid = strtol(s, &end, 10);
      if (end == s)
        break;
      snprintf(val, sizeof(val), "%ld", pid);
      int rv = cg_write(dst, val);
      if (rv != 0 && rv != -ESRCH)
        return rv;
    }
  }
  return OSR_EBUSY;
}

static void fmt_ctrl(char *on, size_t len, unsigned b)
{
  snprintf(on, len, "%s%s%s", b & 1u ? " +memory" : "", b & 2u ? " +pids" : "",
           b & 4u ? " +cpu" : "");
}

void osr__lcg_setup(osr__lcg_t *cg)
{
  char rel[OSR__LCG_PATH] = "", path[CG_PATH], on[64], err[OSR__LCG_PATH + 128] = "";
  if (cg->mode != OSR__LCG_V2)
    return;
  unsigned want = want_bits(cg);
  int rv;
  if (cg->delegated) {
    /* Leave the delegated group's root to the sandboxes' parent: a group
     * with processes cannot enable controllers for its children. */
    char base[OSR__LCG_PATH];
    snprintf(base, sizeof(base), "%s", cg->leaf);
    base[strlen(base) - sizeof(CG_LEAF)] = '\0';
    snprintf(path, sizeof(path), CG_ROOT "%s", cg->leaf);
    if ((mkdir(path, 0755) != 0 && errno != EEXIST && (rv = -errno)) ||
        (rv = move_all(base, cg->leaf)) != 0) {
      snprintf(err, sizeof(err), "moving into %s: %s", cg->leaf, strerror(-rv));
      goto out;
    }
  }
  /* Enable the controllers on every level down to the parent, creating
   * what is missing. A level that refuses is named in the note. */
  for (const char *p = cg->parent;;) {
    unsigned offer = rel[0] ? ctrl_bits(rel, "cgroup.controllers") : want;
    fmt_ctrl(on, sizeof(on), want & offer);
    snprintf(path, sizeof(path), CG_ROOT "%s/cgroup.subtree_control", rel);
    if (on[0] != '\0' && (rv = cg_write(path, on + 1)) != 0 && err[0] == '\0')
      snprintf(err, sizeof(err), "enabling%s in %s: %s", on, rel[0] ? rel : "/", strerror(-rv));
    if ((p = descend(rel, p)) == NULL)
      break;
    snprintf(path, sizeof(path), CG_ROOT "%s", rel);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
      snprintf(err, sizeof(err), "mkdir %s: %s", rel, strerror(errno));
      goto out;
    }
  }
out:
  set_bits(cg, ctrl_bits(cg->parent, "cgroup.subtree_control") & want);
  if (want_bits(cg) != want && err[0] != '\0') {
    size_t l = strlen(cg->note);
    snprintf(cg->note + l, sizeof(cg->note) - l, "%s%s", l ? "; " : "", err);
  }
  if (want_bits(cg) == 0 && want != 0)
    fall_back(cg);
}

const char *osr__lcg_describe(const osr__lcg_t *cg, char *buf, size_t len)
{
  int v2 = cg->mode == OSR__LCG_V2;
  snprintf(buf, len, "%s: memory %s, processes %s, cpu %s, pause %s%s%s%s%s",
           v2                        ? "cgroup v2"
           : cg->mode == OSR__LCG_V1 ? "cgroup v1"
                                     : "no usable cgroup",
           cg->mem ? (v2 ? "memory.max" : "memory.limit_in_bytes") : "rlimit (prlimit --as)",
           cg->pids ? "pids.max" : "rlimit (prlimit --nproc, per uid)",
           cg->cpu ? (v2 ? "cpu.max" : "cpu.cfs_quota_us") : "not limited",
           cg->freezer ? (v2 ? "cgroup.freeze" : "freezer.state") : "unavailable",
           v2 ? "; sandboxes in " CG_ROOT : "", v2 ? cg->parent : "", cg->note[0] ? "; " : "",
           cg->note);
  return buf;
}

/* ---- create ------------------------------------------------------------- */

/* The v2 parent with our controllers enabled for its children, as
 * osr__lcg_setup() left it (made again if someone removed it). The parent
 * never gets a process: the kernel refuses controllers in the
 * subtree_control of a group that has processes ("no internal
 * processes"), and ours stay in <parent>/<id>. */
static int v2_parent(const osr__lcg_t *cg)
{
  char path[CG_PATH], on[64];
  fmt_ctrl(on, sizeof(on), want_bits(cg));
  path_of(cg, path, sizeof(path), NULL, "", NULL);
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    return -errno;
  if (on[0] == '\0')
    return 0;
  path_of(cg, path, sizeof(path), NULL, "", "cgroup.subtree_control");
  return cg_write(path, on + 1);
}
static int v2_create(const osr__lcg_t *cg, const char *id, const osr__lcg_limits_t *lim)
{
  char path[CG_PATH], val[48];
  int rv = v2_parent(cg);
  if (rv != 0)
    return rv;
  path_of(cg, path, sizeof(path), NULL, id, NULL);
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    return -errno;
  if (cg->mem) {
    path_of(cg, path, sizeof(path), NULL, id, "memory.max");
    if ((rv = cg_write_u64(path, lim->mem_bytes)) != 0)
      return rv;
    /* No swapping around the limit; the file is absent without swap
     * accounting, and then there is nothing to forbid. */
    path_of(cg, path, sizeof(path), NULL, id, "memory.swap.max");
    if ((rv = cg_write(path, "0")) != 0 && rv != OSR_ENOENT)
      return rv;
  }
  if (cg->pids) {
    path_of(cg, path, sizeof(path), NULL, id, "pids.max");
    if ((rv = cg_write_u64(path, lim->pids_max)) != 0)
      return rv;
  }
  if (cg->cpu) {
    snprintf(val, sizeof(val), "%u 100000", lim->vcpus * 100000u);
    path_of(cg, path, sizeof(path), NULL, id, "cpu.max");
    if ((rv = cg_write(path, val)) != 0)
      return rv;
    if (lim->cpu_shares != 0 && lim->cpu_shares != 1024u &&
        (rv = osr__lcg_set_shares(cg, id, lim->cpu_shares)) != 0)
      return rv;
  }
  return 0;
}

static int v1_create(const osr__lcg_t *cg, const char *id, const osr__lcg_limits_t *lim, uid_t uid)
{
  char path[CG_PATH];
  int rv;
  for (int i = 0; i < 4; i++) {
    if (!v1_on(cg, i))
      continue;
    path_of(cg, path, sizeof(path), v1_ctrl[i], "", NULL); /* .../osr/ */
    mkdir(path, 0755);
    path_of(cg, path, sizeof(path), v1_ctrl[i], id, NULL);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
      return -errno;
    /* The wrapper joins as the sandbox uid (spawn_container). cgroup v1
     * lets a writer of cgroup.procs move only tasks of its own uid, and
     * every other file of the group (the limits, `tasks`) stays root's;
     * inside the sandbox the cgroup file system is not even mounted. */
    path_of(cg, path, sizeof(path), v1_ctrl[i], id, "cgroup.procs");
    if (chown(path, uid, uid) != 0)
      return -errno;
  }
  if (cg->mem) {
    path_of(cg, path, sizeof(path), "memory", id, "memory.limit_in_bytes");
    if ((rv = cg_write_u64(path, lim->mem_bytes)) != 0)
      return rv;
    /* Where swap accounting exists, forbid swapping around the limit. */
    path_of(cg, path, sizeof(path), "memory", id, "memory.memsw.limit_in_bytes");
    cg_write_u64(path, lim->mem_bytes);
  }
  if (cg->pids) {
    path_of(cg, path, sizeof(path), "pids", id, "pids.max");
    if ((rv = cg_write_u64(path, lim->pids_max)) != 0)
      return rv;
  }
  if (cg->cpu) {
    path_of(cg, path, sizeof(path), "cpu", id, "cpu.cfs_period_us");
    cg_write(path, "100000");
    path_of(cg, path, sizeof(path), "cpu", id, "cpu.cfs_quota_us");
    if ((rv = cg_write_u64(path, (uint64_t)lim->vcpus * 100000u)) != 0)
      return rv;
    if (lim->cpu_shares != 0 && lim->cpu_shares != 1024u &&
        (rv = osr__lcg_set_shares(cg, id, lim->cpu_shares)) != 0)
      return rv;
  }
  return 0;
}

int osr__lcg_create(const osr__lcg_t *cg, const char *id, const osr__lcg_limits_t *lim, uid_t uid)
{
  switch (cg->mode) {
  case OSR__LCG_V2:
    return v2_create(cg, id, lim);
  case OSR__LCG_V1:
    return v1_create(cg, id, lim, uid);
  default:
    return 0;
  }
}

void osr__lcg_cgroups_path(const osr__lcg_t *cg, const char *id, char *out, size_t len)
{
  snprintf(out, len, "%s/%s", cg->parent, id);
}

int osr__lcg_parent(const osr__lcg_t *cg)
{
  return cg->mode == OSR__LCG_V2 ? v2_parent(cg) : 0;
}

size_t osr__lcg_procs_files(const osr__lcg_t *cg, const char *id, char *out, size_t len, size_t max)
{
  size_t n = 0;
  if (cg->mode == OSR__LCG_V2 && max > 0) {
    path_of(cg, out, len, NULL, id, "cgroup.procs");
    return 1;
  }
  for (int i = 0; cg->mode == OSR__LCG_V1 && i < 4 && n < max; i++)
    if (v1_on(cg, i))
      path_of(cg, out + len * n++, len, v1_ctrl[i], id, "cgroup.procs");
  return n;
}

/* ---- run time ----------------------------------------------------------- */

int osr__lcg_freeze(const osr__lcg_t *cg, const char *id, int on)
{
  char path[CG_PATH];
  if (!cg->freezer)
    return OSR_ENOENT;
  if (cg->mode == OSR__LCG_V2) {
    path_of(cg, path, sizeof(path), NULL, id, "cgroup.freeze");
    int rv = cg_write(path, on ? "1" : "0");
    if (rv == 0)
      rv = v2_wait_event(cg, id, "frozen", on ? 1 : 0);
    if (rv == OSR_ETIMEDOUT && on)
      cg_write(path, "0"); /* not paused after all: leave it running */
    return rv;
  }
  path_of(cg, path, sizeof(path), "freezer", id, "freezer.state");
  const char *v = on ? "FROZEN" : "THAWED";
  int rv = cg_write(path, v);
  if (rv == 0) {
    /* Freezing is asynchronous in cgroup v1: wait (bounded) until done. */
    char st[32];
    for (int i = 0; i < 200; i++) {
      if (osr__local_read_small(path, st, sizeof(st)) > 0 && strncmp(st, v, strlen(v)) == 0)
        break;
      usleep(1000);
    }
  }
  return rv;
}

int osr__lcg_set_shares(const osr__lcg_t *cg, const char *id, uint32_t shares)
{
  char path[CG_PATH];
  if (!cg->cpu)
    return 0;
  if (cg->mode == OSR__LCG_V2) {
    /* cpu.weight is 1..10000 with 100 the default, cpu.shares 2..262144
     * with 1024: keep the ratio to the default. */
    uint64_t w = (uint64_t)shares * 100u / 1024u;
    path_of(cg, path, sizeof(path), NULL, id, "cpu.weight");
    return cg_write_u64(path, w < 1 ? 1 : w > 10000 ? 10000 : w);
  }
  path_of(cg, path, sizeof(path), "cpu", id, "cpu.shares");
  return cg_write_u64(path, shares);
}

long osr__lcg_oom_kills(const osr__lcg_t *cg, const char *id)
{
  char path[CG_PATH];
  if (!cg->mem)
    return -1;
  if (cg->mode == OSR__LCG_V2)
    path_of(cg, path, sizeof(path), NULL, id, "memory.events");
  else
    path_of(cg, path, sizeof(path), "memory", id, "memory.oom_control");
  return keyed_value(path, "oom_kill");
}

/* ---- teardown ----------------------------------------------------------- */

static void v2_remove(const osr__lcg_t *cg, const char *id)
{
  char path[CG_PATH], freeze[CG_PATH];
  path_of(cg, path, sizeof(path), NULL, id, "cgroup.kill");
  /* cgroup.kill (5.14) SIGKILLs the whole subtree at once, in the kernel,
   * so a fork bomb cannot outrun it. */
  if (cg_write(path, "1") != 0 || v2_wait_event(cg, id, "populated", 0) == OSR_ETIMEDOUT) {
    /* Older kernels: freeze so nothing forks while we kill. A frozen task
     * still dies of SIGKILL in v2 (unlike v1, no thaw is needed first). */
    path_of(cg, freeze, sizeof(freeze), NULL, id, "cgroup.freeze");
    cg_write(freeze, "1");
    path_of(cg, path, sizeof(path), NULL, id, "cgroup.procs");
    for (int round = 0; round < 200 && kill_listed(path); round++)
      usleep(5000); /* worker thread: waiting for the kernel to reap */
    cg_write(freeze, "0");
    v2_wait_event(cg, id, "populated", 0);
  }
  path_of(cg, path, sizeof(path), NULL, id, NULL);
  rmdir(path);
}

/* Kill every task of a sandbox's cgroups, freezing first so a fork bomb
 * cannot outrun the kill loop, then remove the groups. */
static void v1_remove(const osr__lcg_t *cg, const char *id)
{
  char path[CG_PATH];
  int frozen = 0;
  if (cg->freezer) {
    path_of(cg, path, sizeof(path), "freezer", id, "freezer.state");
    frozen = cg_write(path, "FROZEN") == 0;
  }
  for (int round = 0; round < 200; round++) {
    int any = 0;
    for (int i = 0; i < 4; i++) {
      if (!v1_on(cg, i))
        continue;
      path_of(cg, path, sizeof(path), v1_ctrl[i], id, "cgroup.procs");
      any |= kill_listed(path);
    }
    if (frozen) {
      /* SIGKILL is delivered to frozen tasks only once they thaw. */
      path_of(cg, path, sizeof(path), "freezer", id, "freezer.state");
      cg_write(path, "THAWED");
      frozen = 0;
    }
    if (!any)
      break;
    usleep(5000); /* worker thread: waiting for the kernel to reap */
  }
  for (int i = 0; i < 4; i++) {
    path_of(cg, path, sizeof(path), v1_ctrl[i], id, NULL);
    rmdir(path);
  }
}

void osr__lcg_remove(const osr__lcg_t *cg, const char *id)
{
  if (cg->mode == OSR__LCG_V2)
    v2_remove(cg, id);
  else
    v1_remove(cg, id);
}
