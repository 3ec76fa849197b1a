/*
 * filesystem.Filesystem for osr-agent (contract §5).
 *
 * Every operation that touches the file system runs as a job on libuv's
 * thread pool (uv_queue_work) with plain POSIX calls, and only its JSON
 * answer comes back to the loop thread: a slow disk or a huge directory
 * never stalls other clients (STYLE 21). One job per call: a ListDir of
 * depth 3 is a single walk, not a chain of uv_fs_* round trips.
 *
 * WatchDir reads inotify directly (a non-blocking fd on a uv_poll_t)
 * rather than through uv_fs_event: libuv folds inotify's event kinds into
 * RENAME/CHANGE, and envd's five kinds (CREATE, WRITE, REMOVE, RENAME,
 * CHMOD, fsnotify's mapping) cannot be recovered from those.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "util/log.h"
#include "util/mem.h"

#define LISTDIR_MAX_ENTRIES 200000
#define WATCH_MAX_DIRS      4096

/* ---- entry info (thread pool) ------------------------------------------------------ */

/* Go's os.FileMode.String(): type letters from "dalTLDpSugct?" then rwx. */
static void go_mode_string(mode_t m, char *out)
{
  char *o = out;
  if (S_ISDIR(m))
    *o++ = 'd';
  if (S_ISLNK(m))
    *o++ = 'L';
  if (S_ISBLK(m) || S_ISCHR(m))
    *o++ = 'D';
  if (S_ISFIFO(m))
    *o++ = 'p';
  if (S_ISSOCK(m))
    *o++ = 'S';
  if (m & S_ISUID)
    *o++ = 'u';
  if (m & S_ISGID)
    *o++ = 'g';
  if (S_ISCHR(m))
    *o++ = 'c';
  if (m & S_ISVTX)
    *o++ = 't';
  if (o == out)
    *o++ = '-';
  static const char rwx[] = "rwxrwxrwx";
  for (int i = 0; i < 9; i++)
    *o++ = (m & (1u << (8 - i))) ? rwx[i] : '-';
  *o = '\0';
}

/* protobuf JSON Timestamp: RFC 3339, UTC, 0/3/6/9 fraction digits. */
static void rfc3339(const struct timespec *ts, char *out, size_t outsz)
{
  struct tm tm;
  time_t t = ts->tv_sec;
  gmtime_r(&t, &tm);
  size_t n = strftime(out, outsz, "%Y-%m-%dT%H:%M:%S", &tm);
  long ns = ts->tv_nsec;
  if (ns == 0)
    snprintf(out + n, outsz - n, "Z");
  else if (ns % 1000000 == 0)
    snprintf(out + n, outsz - n, ".%03ldZ", ns / 1000000);
  else if (ns % 1000 == 0)
    snprintf(out + n, outsz - n, ".%06ldZ", ns / 1000);
  else
    snprintf(out + n, outsz - n, ".%09ldZ", ns);
}

static const char *type_name(mode_t m)
{
  if (S_ISREG(m))
    return "FILE_TYPE_FILE";
  if (S_ISDIR(m))
    return "FILE_TYPE_DIRECTORY";
  if (S_ISLNK(m))
    return "FILE_TYPE_SYMLINK";
  return "FILE_TYPE_UNSPECIFIED";
}

json_t *osr__agent_entry_info(const char *path, int *err)
{
  struct stat lst, tst;
  if (lstat(path, &lst) != 0) {
    *err = -errno;
    return NULL;
  }
  const struct stat *t = &lst;
  char target[PATH_MAX];
  int is_link = S_ISLNK(lst.st_mode);
  if (is_link) {
    /* envd: a symlink reports its target's type plus symlinkTarget. */
    if (stat(path, &tst) == 0)
      t = &tst;
    if (realpath(path, target) == NULL) {
      ssize_t n = readlink(path, target, sizeof(target) - 1);
      target[n > 0 ? n : 0] = '\0';
    }
  }
  const char *base = strrchr(path, '/');
  base = base != NULL && base[1] != '\0' ? base + 1 : path;
  char perms[16], mtime[64], size[32], owner[64], group[64];
  go_mode_string(lst.st_mode, perms);
  rfc3339(&lst.st_mtim, mtime, sizeof(mtime));
  snprintf(size, sizeof(size), "%lld", (long long)t->st_size);

  struct passwd pw, *pr = NULL;
  struct group gr, *grp = NULL;
  char buf[4096];
  if (getpwuid_r(lst.st_uid, &pw, buf, sizeof(buf), &pr) == 0 && pr != NULL)
    snprintf(owner, sizeof(owner), "%s", pw.pw_name);
  else
    snprintf(owner, sizeof(owner), "%u", (unsigned)lst.st_uid);
  if (getgrgid_r(lst.st_gid, &gr, buf, sizeof(buf), &grp) == 0 && grp != NULL)
    snprintf(group, sizeof(group), "%s", gr.gr_name);
  else
    snprintf(group, sizeof(group), "%u", (unsigned)lst.st_gid);

  json_t *e = json_pack("{s:s,s:s,s:s,s:s,s:i,s:s,s:s,s:s,s:s}", "name", base, "type",
                        type_name(t->st_mode), "path", path, "size", size, "mode",
                        (int)(lst.st_mode & 0777), "permissions", perms, "owner", owner, "group",
                        group, "modifiedTime", mtime);
  if (is_link)
    json_object_set_new(e, "symlinkTarget", json_string(target));
  return e;
}

/* ---- jobs ------------------------------------------------------------------------------ */

enum { OP_STAT, OP_LIST, OP_MKDIR, OP_MOVE, OP_REMOVE };

typedef struct fs_job_s {
  uv_work_t w;
  agent_call_t *call;
  int op;
  char username[64];
  char a1[4096], a2[4096]; /* raw path arguments */
  uint32_t depth;
  agent_user_t user;
  json_t *result;
  osr_cx_code_t code;
  char msg[9000];
} fs_job_t;

static void job_fail(fs_job_t *j, osr_cx_code_t code, const char *fmt, ...) OSR_PRINTF(3, 4);
static void job_fail(fs_job_t *j, osr_cx_code_t code, const char *fmt, ...)
{
  va_list ap;
  j->code = code;
  va_start(ap, fmt);
  vsnprintf(j->msg, sizeof(j->msg), fmt, ap);
  va_end(ap);
}

static void job_errno(fs_job_t *j, int err, const char *what, const char *path)
{
  j->code = osr_cx_code_from_errno(err);
  snprintf(j->msg, sizeof(j->msg), "%s %s: %s", what, path, uv_strerror(err));
}

/* mkdir -p; created directories are given to `u` when acting for it. */
static int mkdir_p(char *path, const agent_user_t *u)
{
  struct stat st;
  if (stat(path, &st) == 0)
    return S_ISDIR(st.st_mode) ? 0 : UV_ENOTDIR;
  char *slash = strrchr(path, '/');
  if (slash != NULL && slash != path) {
    *slash = '\0';
    int rv = mkdir_p(path, u);
    *slash = '/';
    if (rv != 0)
      return rv;
  }
  if (mkdir(path, 0755) != 0 && errno != EEXIST)
    return -errno;
  if (u->switch_ids && chown(path, u->uid, u->gid) != 0)
    return -errno;
  return 0;
}

static int list_walk(fs_job_t *j, const char *dir, uint32_t level, json_t *arr)
{
  DIR *d = opendir(dir);
  if (d == NULL)
    return -errno;
  struct dirent *de;
  int rv = 0;
  while ((de = readdir(d)) != NULL) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (json_array_size(arr) >= LISTDIR_MAX_ENTRIES) {
      rv = OSR_ETOOLARGE;
      break;
    }
    char p[PATH_MAX];
    if (snprintf(p, sizeof(p), "%s/%s", strcmp(dir, "/") == 0 ? "" : dir, de->d_name) >=
        (int)sizeof(p))
      continue;
    int err = 0;
    json_t *e = osr__agent_entry_info(p, &err);
    if (e == NULL)
      continue; /* vanished meanwhile */
    json_array_append_new(arr, e);
    struct stat st;
    if (level < j->depth && lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
      rv = list_walk(j, p, level + 1, arr);
      if (rv == OSR_ETOOLARGE)
        break;
      rv = 0; /* unreadable subdirectories are listed, not entered */
    }
  }
  closedir(d);
  return rv;
}

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
  (void)sb;
  (void)ftw;
  int rv = flag == FTW_DP ? rmdir(p) : unlink(p);
  return rv != 0 && errno != ENOENT ? -1 : 0;
}

static void fs_work(uv_work_t *w)
{
  fs_job_t *j = osr_container_of(w, fs_job_t, w);
  char p1[PATH_MAX], p2[PATH_MAX];
  osr__agent_resolve_user(j->call->agent, j->username, &j->user);
  if (osr__agent_abs_path(j->a1, j->user.home, p1, sizeof(p1)) != 0) {
    job_fail(j, OSR_CX_INVALID_ARGUMENT, "invalid path '%s'", j->a1);
    return;
  }
  struct stat st;
  int err = 0;
  switch (j->op) {
  case OP_STAT:
    j->result = osr__agent_entry_info(p1, &err);
    if (j->result == NULL)
      job_errno(j, err, "stat", p1);
    else
      j->result = json_pack("{s:o}", "entry", j->result);
    return;
  case OP_LIST: {
    if (stat(p1, &st) != 0) {
      job_errno(j, -errno, "path", p1);
      return;
    }
    if (!S_ISDIR(st.st_mode)) {
      job_fail(j, OSR_CX_INVALID_ARGUMENT, "path is not a directory: %s", p1);
      return;
    }
    json_t *arr = json_array();
    int rv = list_walk(j, p1, 1, arr);
    if (rv != 0) {
      json_decref(arr);
      if (rv == OSR_ETOOLARGE)
        job_fail(j, OSR_CX_RESOURCE_EXHAUSTED, "more than 200000 entries under %s", p1);
      else
        job_errno(j, rv, "list", p1);
      return;
    }
    j->result = json_pack("{s:o}", "entries", arr);
    return;
  }
  case OP_MKDIR: {
    if (lstat(p1, &st) == 0) {
      if (S_ISDIR(st.st_mode))
        job_fail(j, OSR_CX_ALREADY_EXISTS, "directory already exists: %s", p1);
      else
        job_fail(j, OSR_CX_INVALID_ARGUMENT, "path already exists but it is not a directory: %s",
                 p1);
      return;
    }
    int rv = mkdir_p(p1, &j->user);
    if (rv != 0) {
      job_errno(j, rv, "mkdir", p1);
      return;
    }
    json_t *e = osr__agent_entry_info(p1, &err);
    if (e == NULL)
      job_errno(j, err, "stat", p1);
    else
      j->result = json_pack("{s:o}", "entry", e);
    return;
  }
  case OP_MOVE: {
    if (osr__agent_abs_path(j->a2, j->user.home, p2, sizeof(p2)) != 0) {
      job_fail(j, OSR_CX_INVALID_ARGUMENT, "invalid destination '%s'", j->a2);
      return;
    }
    if (lstat(p1, &st) != 0) {
      job_errno(j, -errno, "source", p1);
      return;
    }
    char *slash = strrchr(p2, '/');
    if (slash != NULL && slash != p2) {
      *slash = '\0';
      int rv = mkdir_p(p2, &j->user);
      *slash = '/';
      if (rv != 0) {
        job_errno(j, rv, "mkdir", p2);
        return;
      }
    }
    if (rename(p1, p2) != 0) {
      job_errno(j, -errno, "rename", p1);
      return;
    }
    json_t *e = osr__agent_entry_info(p2, &err);
    if (e == NULL)
      job_errno(j, err, "stat", p2);
    else
      j->result = json_pack("{s:o}", "entry", e);
    return;
  }
  case OP_REMOVE:
    /* A missing path is not an error (envd: os.RemoveAll). */
    if (lstat(p1, &st) != 0) {
      if (errno == ENOENT) {
        j->result = json_object();
        return;
      }
      job_errno(j, -errno, "remove", p1);
      return;
    }
    if (nftw(p1, rm_cb, 32, FTW_DEPTH | FTW_PHYS) != 0) {
      job_errno(j, -errno, "remove", p1);
      return;
    }
    j->result = json_object();
    return;
  default:
    job_fail(j, OSR_CX_INTERNAL, "bad op");
  }
}

static void fs_after(uv_work_t *w, int status)
{
  fs_job_t *j = osr_container_of(w, fs_job_t, w);
  (void)status;
  if (j->result != NULL)
    agent_call_reply(j->call, j->result);
  else
    agent_call_error(j->call, j->code != 0 ? j->code : OSR_CX_INTERNAL, "%s", j->msg);
  osr_free(j);
}

static void fs_queue(agent_call_t *call, int op, const char *k1, const char *k2)
{
  json_t *v1 = json_object_get(call->msg, k1);
  json_t *v2 = k2 != NULL ? json_object_get(call->msg, k2) : NULL;
  if (!json_is_string(v1) || (k2 != NULL && !json_is_string(v2))) {
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "%s is required",
                     k2 != NULL && json_is_string(v1) ? k2 : k1);
    return;
  }
  fs_job_t *j = osr_xcalloc(1, sizeof(*j));
  j->call = call;
  j->op = op;
  snprintf(j->username, sizeof(j->username), "%s", call->username);
  /* Copied now: the worker thread never touches shared JSON. */
  if (snprintf(j->a1, sizeof(j->a1), "%s", json_string_value(v1)) >= (int)sizeof(j->a1) ||
      (v2 != NULL &&
       snprintf(j->a2, sizeof(j->a2), "%s", json_string_value(v2)) >= (int)sizeof(j->a2))) {
    osr_free(j);
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "path too long");
    return;
  }
  json_t *depth = json_object_get(call->msg, "depth");
  j->depth = json_is_integer(depth) && json_integer_value(depth) > 0
                 ? (uint32_t)json_integer_value(depth)
                 : 1;
  if (j->depth > 64)
    j->depth = 64;
  if (uv_queue_work(call->agent->loop, &j->w, fs_work, fs_after) != 0) {
    osr_free(j);
    agent_call_error(call, OSR_CX_INTERNAL, "cannot queue work");
  }
}

void osr__agent_fs_stat(agent_call_t *call)
{
  fs_queue(call, OP_STAT, "path", NULL);
}

void osr__agent_fs_list_dir(agent_call_t *call)
{
  fs_queue(call, OP_LIST, "path", NULL);
}

void osr__agent_fs_make_dir(agent_call_t *call)
{
  fs_queue(call, OP_MKDIR, "path", NULL);
}

void osr__agent_fs_move(agent_call_t *call)
{
  fs_queue(call, OP_MOVE, "source", "destination");
}

void osr__agent_fs_remove(agent_call_t *call)
{
  fs_queue(call, OP_REMOVE, "path", NULL);
}

/* ---- WatchDir ---------------------------------------------------------------------------- */

typedef struct watch_dir_s {
  int wd;
  char *rel; /* "" for the root, "a/b" below it */
} watch_dir_t;

typedef struct watch_s {
  uv_work_t w;
  agent_call_t *call;
  agent_stream_t *st;
  uv_poll_t poll;
  int fd;
  int recursive;
  int polling;
  char username[64];
  char raw[4096];
  char root[PATH_MAX];
  watch_dir_t *dirs;
  size_t ndirs;
  osr_cx_code_t code;
  char msg[9000];
} watch_t;

#define WATCH_MASK                                                                                 \
  (IN_CREATE | IN_MODIFY | IN_DELETE | IN_DELETE_SELF | IN_MOVED_FROM | IN_MOVED_TO |              \
   IN_MOVE_SELF | IN_ATTRIB)

static void watch_add(watch_t *wt, const char *rel)
{
  if (wt->ndirs >= WATCH_MAX_DIRS)
    return;
  char p[PATH_MAX];
  if (rel[0] == '\0')
    snprintf(p, sizeof(p), "%s", wt->root);
  else if (snprintf(p, sizeof(p), "%s/%s", wt->root, rel) >= (int)sizeof(p))
    return;
  int wd = inotify_add_watch(wt->fd, p, WATCH_MASK | IN_ONLYDIR | IN_DONT_FOLLOW);
  if (wd < 0)
    return;
  for (size_t i = 0; i < wt->ndirs; i++)
    if (wt->dirs[i].wd == wd)
      return; /* already watched (renamed back) */
  wt->dirs[wt->ndirs].wd = wd;
  wt->dirs[wt->ndirs].rel = osr_xstrdup(rel);
  wt->ndirs++;
}

static void watch_scan(watch_t *wt, const char *rel, int level)
{
  char p[PATH_MAX];
  if (snprintf(p, sizeof(p), "%s%s%s", wt->root, rel[0] != '\0' ? "/" : "", rel) >= (int)sizeof(p))
    return;
  DIR *d = opendir(p);
  if (d == NULL || level > 32) {
    if (d != NULL)
      closedir(d);
    return;
  }
  struct dirent *de;
  while ((de = readdir(d)) != NULL && wt->ndirs < WATCH_MAX_DIRS) {
    if (de->d_type != DT_DIR || strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    char r[PATH_MAX];
    if (snprintf(r, sizeof(r), "%s%s%s", rel, rel[0] != '\0' ? "/" : "", de->d_name) >=
        (int)sizeof(r))
      continue;
    watch_add(wt, r);
    watch_scan(wt, r, level + 1);
  }
  closedir(d);
}

static void watch_work(uv_work_t *w)
{
  watch_t *wt = osr_container_of(w, watch_t, w);
  agent_user_t u;
  osr__agent_resolve_user(wt->call->agent, wt->username, &u);
  if (osr__agent_abs_path(wt->raw, u.home, wt->root, sizeof(wt->root)) != 0) {
    wt->code = OSR_CX_INVALID_ARGUMENT;
    snprintf(wt->msg, sizeof(wt->msg), "invalid path");
    return;
  }
  struct stat st;
  if (stat(wt->root, &st) != 0) {
    wt->code = osr_cx_code_from_errno(-errno);
    snprintf(wt->msg, sizeof(wt->msg), "path %s: %s", wt->root, strerror(errno));
    return;
  }
  if (!S_ISDIR(st.st_mode)) {
    wt->code = OSR_CX_INVALID_ARGUMENT;
    snprintf(wt->msg, sizeof(wt->msg), "path %s is not a directory", wt->root);
    return;
  }
  wt->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (wt->fd < 0) {
    wt->code = OSR_CX_RESOURCE_EXHAUSTED;
    snprintf(wt->msg, sizeof(wt->msg), "inotify: %s", strerror(errno));
    return;
  }
  wt->dirs = osr_xcalloc(WATCH_MAX_DIRS, sizeof(*wt->dirs));
  watch_add(wt, "");
  if (wt->recursive)
    watch_scan(wt, "", 0);
  if (wt->ndirs == 0) {
    wt->code = OSR_CX_INTERNAL;
    snprintf(wt->msg, sizeof(wt->msg), "inotify_add_watch %s failed", wt->root);
  }
}

static void watch_free(watch_t *wt)
{
  for (size_t i = 0; i < wt->ndirs; i++)
    osr_free(wt->dirs[i].rel);
  osr_free(wt->dirs);
  if (wt->fd >= 0)
    close(wt->fd);
  osr_free(wt);
}

static void on_poll_closed(uv_handle_t *h)
{
  watch_free(h->data);
}

static const char *event_type(uint32_t m)
{
  if (m & (IN_CREATE | IN_MOVED_TO))
    return "EVENT_TYPE_CREATE";
  if (m & IN_MODIFY)
    return "EVENT_TYPE_WRITE";
  if (m & (IN_DELETE | IN_DELETE_SELF))
    return "EVENT_TYPE_REMOVE";
  if (m & (IN_MOVED_FROM | IN_MOVE_SELF))
    return "EVENT_TYPE_RENAME";
  if (m & IN_ATTRIB)
    return "EVENT_TYPE_CHMOD";
  return NULL;
}

static void on_inotify(uv_poll_t *h, int status, int events)
{
  watch_t *wt = h->data;
  (void)events;
  if (status != 0 || wt->st == NULL)
    return;
  /* Bounded per callback (STYLE 17): one read of at most 64 KiB. */
  char buf[65536] __attribute__((aligned(__alignof__(struct inotify_event))));
  ssize_t n = read(wt->fd, buf, sizeof(buf));
  if (n <= 0)
    return;
  for (char *q = buf; q < buf + n;) {
    const struct inotify_event *ev = (const struct inotify_event *)(void *)q;
    q += sizeof(*ev) + ev->len;
    const char *rel = NULL;
    size_t di = 0;
    for (; di < wt->ndirs; di++)
      if (wt->dirs[di].wd == ev->wd) {
        rel = wt->dirs[di].rel;
        break;
      }
    if (ev->mask & IN_IGNORED) {
      if (rel != NULL) {
        osr_free(wt->dirs[di].rel);
        wt->dirs[di] = wt->dirs[--wt->ndirs];
      }
      continue;
    }
    if (rel == NULL)
      continue;
    /* A watched directory's own DELETE_SELF/MOVE_SELF is reported by its
     * parent's watch already, except for the root. */
    if ((ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF)) && rel[0] != '\0')
      continue;
    const char *type = event_type(ev->mask);
    if (type == NULL)
      continue;
    char name[PATH_MAX];
    const char *leaf = ev->len > 0 ? ev->name : "";
    snprintf(name, sizeof(name), "%s%s%s", rel, rel[0] != '\0' && leaf[0] != '\0' ? "/" : "", leaf);
    if (wt->recursive && (ev->mask & (IN_CREATE | IN_MOVED_TO)) && (ev->mask & IN_ISDIR)) {
      /* inotify is not recursive: watch new subdirectories as they come
       * (inotify_add_watch is one short syscall on a local path). */
      watch_add(wt, name);
    }
    json_t *msg = json_pack("{s:{s:s,s:s}}", "filesystem", "name", name, "type", type);
    if (agent_stream_send(wt->st, msg) != 0)
      return;
  }
  if (wt->st != NULL && agent_stream_queued(wt->st) >= AGENT_STREAM_LOW && wt->polling) {
    /* The client is slow: leave events in the kernel queue meanwhile. */
    uv_poll_stop(&wt->poll);
    wt->polling = 0;
  }
}

static void watch_on_writable(agent_stream_t *st, void *data)
{
  watch_t *wt = data;
  (void)st;
  if (!wt->polling) {
    wt->polling = 1;
    uv_poll_start(&wt->poll, UV_READABLE, on_inotify);
  }
}

static void watch_on_close(agent_stream_t *st, void *data)
{
  watch_t *wt = data;
  (void)st;
  wt->st = NULL;
  uv_close((uv_handle_t *)&wt->poll, on_poll_closed);
}

static const agent_stream_events_t watch_events = {watch_on_writable, watch_on_close};

static void watch_after(uv_work_t *w, int status)
{
  watch_t *wt = osr_container_of(w, watch_t, w);
  agent_call_t *call = wt->call;
  (void)status;
  if (wt->code != 0 || call->req == NULL) {
    agent_call_error(call, wt->code != 0 ? wt->code : OSR_CX_CANCELED, "%s", wt->msg);
    watch_free(wt);
    return;
  }
  if (uv_poll_init(call->agent->loop, &wt->poll, wt->fd) != 0) {
    agent_call_error(call, OSR_CX_INTERNAL, "cannot poll inotify");
    watch_free(wt);
    return;
  }
  wt->poll.data = wt;
  wt->st = agent_stream_begin(call, &watch_events, wt, "{\"keepalive\":{}}");
  if (wt->st == NULL) {
    uv_close((uv_handle_t *)&wt->poll, on_poll_closed);
    return;
  }
  agent_stream_send(wt->st, json_pack("{s:{}}", "start"));
  wt->polling = 1;
  uv_poll_start(&wt->poll, UV_READABLE, on_inotify);
}

void osr__agent_fs_watch_dir(agent_call_t *call)
{
  json_t *path = json_object_get(call->msg, "path");
  if (!json_is_string(path) || json_string_length(path) >= 4096) {
    agent_call_error(call, OSR_CX_INVALID_ARGUMENT, "path is required");
    return;
  }
  watch_t *wt = osr_xcalloc(1, sizeof(*wt));
  wt->call = call;
  wt->fd = -1;
  wt->recursive = json_is_true(json_object_get(call->msg, "recursive"));
  snprintf(wt->username, sizeof(wt->username), "%s", call->username);
  snprintf(wt->raw, sizeof(wt->raw), "%s", json_string_value(path));
  if (uv_queue_work(call->agent->loop, &wt->w, watch_work, watch_after) != 0) {
    osr_free(wt);
    agent_call_error(call, OSR_CX_INTERNAL, "cannot queue work");
  }
}
