/*
 * GET/POST /files for osr-agent (contract §6).
 *
 * Downloads: a thread-pool job resolves the user and path and opens the
 * file; the loop then answers 200 with Content-Length and streams the file
 * with uv_fs_read into one 256 KiB buffer, one read and one HTTP write in
 * flight at a time, so memory per download is fixed.
 *
 * Uploads (application/octet-stream or multipart/form-data): each body
 * chunk is held (osr_http_req_hold: the client gets no more credit) while
 * it is written to the file with uv_fs_write, and released when written
 * (STYLE 14). Octet-stream chunks are written in place (zero-copy);
 * multipart data goes through the streaming parser into a 256 KiB staging
 * buffer. A 50 GB upload costs the same memory as a 5 byte one.
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/multipart.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#if defined(OSR_TLS_BORINGSSL) || defined(OSR_TLS_OPENSSL)
#include <openssl/sha.h>
#endif

#define FILE_BUF         (256 * 1024)
#define MAX_UPLOAD_FILES 1000

/* ---- query parameters ---------------------------------------------------------------- */

/* Decoded value of query parameter `name` into out; 1 if present. */
static int query_param(const osr_http_req_t *req, const char *name, char *out, size_t outsz)
{
  const char *q = req->query.base, *end = req->query.base + req->query.len;
  size_t nl = strlen(name);
  while (q != NULL && q < end) {
    const char *amp = memchr(q, '&', (size_t)(end - q));
    const char *pe = amp != NULL ? amp : end;
    if ((size_t)(pe - q) >= nl && memcmp(q, name, nl) == 0 && (q + nl == pe || q[nl] == '=')) {
      const char *v = q + nl < pe ? q + nl + 1 : pe;
      size_t o = 0;
      for (; v < pe && o + 1 < outsz; v++) {
        if (*v == '%' && pe - v >= 3 && osr_hexval(v[1]) >= 0 && osr_hexval(v[2]) >= 0) {
          out[o++] = (char)(osr_hexval(v[1]) * 16 + osr_hexval(v[2]));
          v += 2;
        } else {
          out[o++] = *v == '+' ? ' ' : *v;
        }
      }
      out[o] = '\0';
      return 1;
    }
    q = amp != NULL ? amp + 1 : NULL;
  }
  out[0] = '\0';
  return 0;
}

int osr__agent_files_signature_ok(agent_t *a, osr_http_req_t *req);
int osr__agent_files_signature_ok(agent_t *a, osr_http_req_t *req)
{
  /* Signed URLs (contract §6): v1_ + base64_nopad(sha256(
   * "<path>:<read|write>:<username>:<token>[:<expiration>]")). */
  char sig[128], path[4096], user[128], exp[32];
  if (a->token == NULL || !query_param(req, "signature", sig, sizeof(sig)) ||
      strncmp(sig, "v1_", 3) != 0)
    return 0;
  query_param(req, "path", path, sizeof(path));
  query_param(req, "username", user, sizeof(user));
  int has_exp = query_param(req, "signature_expiration", exp, sizeof(exp));
  if (has_exp) {
    char *e;
    long long t = strtoll(exp, &e, 10);
    if (*e != '\0' || t < (long long)time(NULL))
      return 0;
  }
  const char *op =
      req->method.len == 3 && memcmp(req->method.base, "GET", 3) == 0 ? "read" : "write";
  size_t need = strlen(path) + strlen(user) + strlen(a->token) + strlen(exp) + 16;
  char *pre = osr_try_malloc(need);
  if (pre == NULL)
    return 0;
  int n = snprintf(pre, need, "%s:%s:%s:%s%s%s", path, op, user, a->token, has_exp ? ":" : "",
                   has_exp ? exp : "");
  unsigned char md[32];
  SHA256((const unsigned char *)pre, (size_t)n, md);
  osr_free(pre);
  char want[64];
  size_t wl = osr_b64_encode(md, sizeof(md), want, 0);
  size_t gl = strlen(sig + 3);
  unsigned char diff = (unsigned char)(gl != wl);
  for (size_t i = 0; i < wl; i++)
    diff |= (unsigned char)(want[i] ^ (i < gl ? sig[3 + i] : 0));
  return diff == 0;
}

/* ---- shared state ------------------------------------------------------------------------- */

typedef struct files_s {
  agent_t *a;
  osr_http_req_t *req; /* NULL once the exchange is over */
  int is_get;
  int busy; /* a job or uv_fs request is in flight */
  int done; /* on_done fired */
  uv_work_t w;
  uv_fs_t fsr;
  char username[64];
  char qpath[4096]; /* ?path= (decoded), "" if absent */
  int has_qpath;
  agent_user_t user;
  char path[4096]; /* the file being read or written */
  int fd;
  int err; /* job result (negative errno) */
  int is_dir;
  int64_t size;
  int64_t off;
  char *buf; /* FILE_BUF bytes */
  size_t buf_len;
  /* upload */
  int multipart;
  osr_mp_t mp;
  osr_iovec_t held; /* the body chunk being processed (held) */
  size_t held_pos;
  char *held_copy; /* the last chunk, copied instead of held (below) */
  int is_held;     /* osr_http_req_hold() is in effect for `held` */
  uint64_t received;
  int body_eof;
  int in_part;
  char **files; /* paths written, for the answer */
  size_t nfiles;
  int failed;
} files_t;

/* Done with the current chunk: un-hold it (or free our copy of it). */
static void release_held(files_t *f)
{
  f->held = osr_iov(NULL, 0);
  if (f->held_copy != NULL)
    osr_freep(&f->held_copy);
  if (f->is_held) {
    f->is_held = 0;
    if (f->req != NULL)
      osr_http_req_release(f->req); /* more body may arrive */
  }
}

static void files_free(files_t *f)
{
  osr_free(f->held_copy);
  if (f->fd >= 0)
    close(f->fd); /* only reached on error paths with no fs request in flight */
  osr_free(f->buf);
  for (size_t i = 0; i < f->nfiles; i++)
    osr_free(f->files[i]);
  osr_free(f->files);
  osr_free(f);
}

static void files_on_done(osr_http_req_t *req, int status)
{
  files_t *f = req->data;
  (void)status;
  f->req = NULL;
  f->done = 1;
  if (!f->busy)
    files_free(f);
}

/* A job or fs request finished: returns 1 if the exchange is gone (and f
 * was freed), so the caller stops. */
static int settle(files_t *f)
{
  f->busy = 0;
  if (f->done) {
    files_free(f);
    return 1;
  }
  return 0;
}

static void fail(files_t *f, int status, const char *fmt, ...) OSR_PRINTF(3, 4);
static void fail(files_t *f, int status, const char *fmt, ...)
{
  char msg[8400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  f->failed = 1;
  if (f->held.base != NULL)
    release_held(f);
  osr__agent_send_http_error(f->req, status, msg);
}

static int errno_status(int err)
{
  switch (err) {
  case UV_ENOENT:
    return 404;
  case UV_ENOSPC:
  case -EDQUOT:
    return 507;
  case UV_EACCES:
  case UV_EPERM:
    return 403;
  case UV_EISDIR:
  case UV_ENOTDIR:
  case UV_EINVAL:
    return 400;
  default:
    return 500;
  }
}

/* ---- download ------------------------------------------------------------------------------ */

static void dl_read(files_t *f);

static void dl_written(osr_http_req_t *req, int status, void *arg)
{
  files_t *f = arg;
  (void)req;
  if (status != 0 || f->req == NULL)
    return; /* on_done follows / followed */
  dl_read(f);
}

static void dl_on_read(uv_fs_t *r)
{
  files_t *f = r->data;
  ssize_t n = r->result;
  uv_fs_req_cleanup(r);
  if (settle(f))
    return;
  if (n < 0) {
    osr_http_abort(f->req); /* headers are out: all we can do is cut it short */
    return;
  }
  if (n == 0 && f->off < f->size) {
    osr_http_abort(f->req); /* the file shrank under us */
    return;
  }
  f->off += n;
  int end = f->off >= f->size;
  osr_iovec_t iov = osr_iov(f->buf, (size_t)n);
  if (osr_http_write(f->req, &iov, 1, end, end ? NULL : dl_written, f) != 0)
    osr_http_abort(f->req);
}

static void dl_read(files_t *f)
{
  int64_t left = f->size - f->off;
  uv_buf_t b = uv_buf_init(f->buf, (unsigned)(left < FILE_BUF ? left : FILE_BUF));
  f->busy = 1;
  f->fsr.data = f;
  if (uv_fs_read(f->a->loop, &f->fsr, f->fd, &b, 1, f->off, dl_on_read) != 0) {
    f->busy = 0;
    osr_http_abort(f->req);
  }
}

static void dl_work(uv_work_t *w)
{
  files_t *f = osr_container_of(w, files_t, w);
  osr__agent_resolve_user(f->a, f->username, &f->user);
  if (osr__agent_abs_path(f->qpath, f->user.home, f->path, sizeof(f->path)) != 0) {
    f->err = UV_EINVAL;
    return;
  }
  f->fd = open(f->path, O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) {
    f->err = -errno;
    return;
  }
  struct stat st;
  if (fstat(f->fd, &st) != 0) {
    f->err = -errno;
    return;
  }
  f->is_dir = S_ISDIR(st.st_mode);
  f->size = st.st_size;
}

/* Content-Disposition with an ASCII fallback and the RFC 5987 UTF-8 name. */
static void content_disposition(const char *path, char *out, size_t outsz)
{
  const char *base = strrchr(path, '/');
  base = base != NULL ? base + 1 : path;
  char ascii[1024], enc[3 * 1024];
  size_t a = 0, e = 0;
  for (const unsigned char *p = (const unsigned char *)base; *p != '\0'; p++) {
    if (a + 2 < sizeof(ascii))
      ascii[a++] = (*p < 0x20 || *p >= 0x7f || *p == '"' || *p == '\\') ? '_' : (char)*p;
    if (e + 4 < sizeof(enc)) {
      if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
          strchr("!#$&+-.^_`|~", *p) != NULL)
        enc[e++] = (char)*p;
      else
        e += (size_t)snprintf(enc + e, 4, "%%%02X", *p);
    }
  }
  ascii[a] = enc[e] = '\0';
  if (snprintf(out, outsz, "attachment; filename=\"%s\"; filename*=UTF-8''%s", ascii, enc) >=
      (int)outsz)
    snprintf(out, outsz, "attachment");
}

static void dl_after(uv_work_t *w, int status)
{
  files_t *f = osr_container_of(w, files_t, w);
  (void)status;
  if (settle(f))
    return;
  if (f->err != 0) {
    fail(f, errno_status(f->err), f->err == UV_ENOENT ? "file not found: %s" : "cannot open %s",
         f->qpath);
    return;
  }
  if (f->is_dir) {
    fail(f, 400, "path is a directory: %s", f->path);
    return;
  }
  char cd[5000];
  content_disposition(f->path, cd, sizeof(cd));
  osr_http_header_t h[2] = {
      {OSR_IOV_LIT("content-type"), OSR_IOV_LIT("application/octet-stream")},
      {OSR_IOV_LIT("content-disposition"), osr_iov(cd, strlen(cd))},
  };
  if (osr_http_respond(f->req, 200, h, 2, f->size) != 0) {
    osr_http_abort(f->req);
    return;
  }
  int is_head = f->req->method.len == 4 && memcmp(f->req->method.base, "HEAD", 4) == 0;
  if (f->size == 0 || is_head) {
    osr_http_write(f->req, NULL, 0, 1, NULL, NULL);
    return;
  }
  f->buf = osr_xmalloc(FILE_BUF);
  dl_read(f);
}

/* ---- upload --------------------------------------------------------------------------------- */

static void up_continue(files_t *f);

/* Open (creating parents) the target in the thread pool. */
static void up_open_work(uv_work_t *w)
{
  files_t *f = osr_container_of(w, files_t, w);
  osr__agent_resolve_user(f->a, f->username, &f->user);
  f->err = 0;
  char tmp[4096];
  if (osr__agent_abs_path(f->path, f->user.home, tmp, sizeof(tmp)) != 0) {
    f->err = UV_EINVAL;
    return;
  }
  memcpy(f->path, tmp, sizeof(tmp));
  /* mkdir -p of the parent. */
  for (char *s = strchr(f->path + 1, '/'); s != NULL; s = strchr(s + 1, '/')) {
    *s = '\0';
    struct stat st;
    if (stat(f->path, &st) != 0) {
      if (mkdir(f->path, 0755) != 0 && errno != EEXIST) {
        f->err = -errno;
        *s = '/';
        return;
      }
      if (f->user.switch_ids && chown(f->path, f->user.uid, f->user.gid) != 0) {
        f->err = -errno;
        *s = '/';
        return;
      }
    } else if (!S_ISDIR(st.st_mode)) {
      f->err = UV_ENOTDIR;
      *s = '/';
      return;
    }
    *s = '/';
  }
  f->fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    f->err = -errno;
    return;
  }
  if (f->user.switch_ids && fchown(f->fd, f->user.uid, f->user.gid) != 0)
    f->err = -errno;
  f->off = 0;
}

static void up_opened(uv_work_t *w, int status)
{
  files_t *f = osr_container_of(w, files_t, w);
  (void)status;
  if (settle(f))
    return;
  if (f->err != 0) {
    fail(f, errno_status(f->err), "cannot write %s", f->path);
    return;
  }
  if (f->nfiles < MAX_UPLOAD_FILES) {
    f->files = osr_xrealloc(f->files, (f->nfiles + 1) * sizeof(char *));
    f->files[f->nfiles++] = osr_xstrdup(f->path);
  }
  up_continue(f);
}

static void start_open(files_t *f, const char *target)
{
  snprintf(f->path, sizeof(f->path), "%s", target);
  f->busy = 1;
  if (uv_queue_work(f->a->loop, &f->w, up_open_work, up_opened) != 0) {
    f->busy = 0;
    fail(f, 500, "cannot queue work");
  }
}

static void up_closed(uv_fs_t *r)
{
  files_t *f = r->data;
  int rv = (int)r->result;
  uv_fs_req_cleanup(r);
  f->fd = -1;
  if (settle(f))
    return;
  if (rv < 0) {
    fail(f, errno_status(rv), "close %s failed", f->path);
    return;
  }
  up_continue(f);
}

static void start_close(files_t *f)
{
  f->busy = 1;
  f->fsr.data = f;
  int fd = f->fd;
  if (uv_fs_close(f->a->loop, &f->fsr, fd, up_closed) != 0) {
    f->busy = 0;
    fail(f, 500, "close failed");
  }
}

static void up_written(uv_fs_t *r)
{
  files_t *f = r->data;
  ssize_t n = r->result;
  uv_fs_req_cleanup(r);
  if (settle(f))
    return;
  if (n < 0) {
    fail(f, errno_status((int)n), "write %s failed", f->path);
    return;
  }
  f->off += n;
  if (f->multipart) {
    /* Short writes on regular files are rare: keep the rest staged. */
    memmove(f->buf, f->buf + n, f->buf_len - (size_t)n);
    f->buf_len -= (size_t)n;
    if (f->buf_len > 0) {
      uv_buf_t b = uv_buf_init(f->buf, (unsigned)f->buf_len);
      f->busy = 1;
      if (uv_fs_write(f->a->loop, &f->fsr, f->fd, &b, 1, f->off, up_written) != 0) {
        f->busy = 0;
        fail(f, 500, "write failed");
      }
      return;
    }
  } else {
    f->held_pos += (size_t)n;
  }
  up_continue(f);
}

static void start_write(files_t *f, const char *p, size_t n)
{
  uv_buf_t b = uv_buf_init((char *)p, (unsigned)n);
  f->busy = 1;
  f->fsr.data = f;
  if (uv_fs_write(f->a->loop, &f->fsr, f->fd, &b, 1, f->off, up_written) != 0) {
    f->busy = 0;
    fail(f, 500, "write failed");
  }
}

static void up_respond(files_t *f)
{
  json_t *arr = json_array();
  for (size_t i = 0; i < f->nfiles; i++) {
    const char *p = f->files[i];
    const char *base = strrchr(p, '/');
    json_array_append_new(arr, json_pack("{s:s,s:s,s:s}", "name", base != NULL ? base + 1 : p,
                                         "type", "file", "path", p));
  }
  char *s = json_dumps(arr, JSON_COMPACT);
  json_decref(arr);
  osr_http_send(f->req, 200, "application/json", s, strlen(s));
  osr_json_free(s);
}

/* Multipart callbacks: each one that starts I/O pauses the parser. */
static int mp_on_part(osr_mp_t *mp, const char *name, const char *filename)
{
  files_t *f = mp->data;
  (void)name;
  if (filename[0] == '\0') {
    f->in_part = 0; /* a plain form field: ignored */
    return 0;
  }
  f->in_part = 1;
  f->buf_len = 0;
  /* envd prefers ?path= for a single-file write; otherwise the part's
   * filename is the full target path (contract §6). */
  start_open(f, f->has_qpath ? f->qpath : filename);
  return 1;
}

static int mp_on_data(osr_mp_t *mp, const char *d, size_t n)
{
  files_t *f = mp->data;
  if (!f->in_part)
    return 0;
  memcpy(f->buf + f->buf_len, d, n);
  f->buf_len += n;
  if (f->buf_len >= FILE_BUF - OSR_MP_MAX_SPAN) {
    start_write(f, f->buf, f->buf_len);
    return 1;
  }
  return 0;
}

static int mp_on_part_end(osr_mp_t *mp)
{
  files_t *f = mp->data;
  if (!f->in_part)
    return 0;
  if (f->buf_len > 0) {
    start_write(f, f->buf, f->buf_len);
    /* The close follows from up_continue once the staging buffer drained. */
    return 1;
  }
  f->in_part = 0;
  start_close(f);
  return 1;
}

static const osr_mp_events_t mp_events = {mp_on_part, mp_on_data, mp_on_part_end};

/* Drive the upload forward after any completed step. */
static void up_continue(files_t *f)
{
  if (f->failed || f->busy || f->req == NULL)
    return;
  if (f->multipart) {
    /* A part ended with data staged: it was written, now close it. */
    if (f->in_part && f->buf_len == 0 && !f->mp._in_part && f->fd >= 0) {
      f->in_part = 0;
      start_close(f);
      return;
    }
    while (f->held.base != NULL && f->held_pos < f->held.len) {
      long n = osr_mp_feed(&f->mp, f->held.base + f->held_pos, f->held.len - f->held_pos);
      if (n < 0) {
        fail(f, n == OSR_ETOOLARGE ? 413 : 400, "malformed multipart body");
        return;
      }
      f->held_pos += (size_t)n;
      if (f->busy || f->failed)
        return;
    }
  } else if (f->fd >= 0 && f->held.base != NULL && f->held_pos < f->held.len) {
    /* Zero-copy: write straight from the held receive buffer. */
    start_write(f, f->held.base + f->held_pos, f->held.len - f->held_pos);
    return;
  }
  if (f->held.base != NULL && f->held_pos >= f->held.len) {
    int was_held = f->is_held;
    release_held(f);
    if (was_held)
      return; /* the rest of the body arrives through up_on_body */
  }
  if (f->body_eof && f->held.base == NULL) {
    if (!f->multipart && f->fd >= 0) {
      start_close(f);
      return;
    }
    if (f->multipart && !f->mp.done) {
      fail(f, 400, "multipart body ended early");
      return;
    }
    if (f->nfiles == 0) {
      fail(f, 400, "no file in the request");
      return;
    }
    up_respond(f);
  }
}

static void up_on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  files_t *f = req->data;
  if (f->failed)
    return;
  if (status == OSR_EOF) {
    f->body_eof = 1;
    up_continue(f);
    return;
  }
  if (status != 0) {
    if (status == OSR_ETOOLARGE)
      fail(f, 413, "upload too large");
    else
      osr_http_abort(req);
    return;
  }
  if (chunk->len == 0)
    return;
  f->received += chunk->len;
  f->held_pos = 0;
  int last = req->content_length >= 0 && f->received >= (uint64_t)req->content_length;
  if (last) {
    /* The last chunk of a Content-Length body is copied rather than held:
     * the HTTP/1.1 layer delivers the end of such a body only when more
     * input arrives after a release, and none will (reported to the lead;
     * src/net/http1.c h1_release). Bounded by the socket input cap. */
    f->held_copy = osr_try_malloc(chunk->len);
    if (f->held_copy == NULL) {
      fail(f, 507, "out of memory");
      return;
    }
    memcpy(f->held_copy, chunk->base, chunk->len);
    f->held = osr_iov(f->held_copy, chunk->len);
  } else {
    f->held = *chunk;
  }
  up_continue(f);
  /* Hold only a chunk still needed after this callback: holding and
   * releasing within one callback leaves the HTTP/1.1 socket stopped
   * (src/net/http1.c h1_release returns early while in the body callback;
   * reported to the lead). */
  if (!last && !f->failed && f->held.base != NULL) {
    osr_http_req_hold(req);
    f->is_held = 1;
  }
}

/* ---- entry -------------------------------------------------------------------------------- */

void osr__agent_files(agent_t *a, osr_http_req_t *req)
{
  int is_get = (req->method.len == 3 && memcmp(req->method.base, "GET", 3) == 0) ||
               (req->method.len == 4 && memcmp(req->method.base, "HEAD", 4) == 0);
  int is_post = (req->method.len == 4 && memcmp(req->method.base, "POST", 4) == 0) ||
                (req->method.len == 3 && memcmp(req->method.base, "PUT", 3) == 0);
  if (!is_get && !is_post) {
    osr__agent_send_http_error(req, 405, "method not allowed");
    return;
  }
  files_t *f = osr_xcalloc(1, sizeof(*f));
  f->a = a;
  f->req = req;
  f->fd = -1;
  f->is_get = is_get;
  f->has_qpath = query_param(req, "path", f->qpath, sizeof(f->qpath)) && f->qpath[0] != '\0';
  char qu[64];
  if (query_param(req, "username", qu, sizeof(qu)) && qu[0] != '\0')
    snprintf(f->username, sizeof(f->username), "%s", qu);
  else
    osr__agent_req_username(req, f->username, sizeof(f->username));
  req->data = f;
  req->on_done = files_on_done;

  if (is_get) {
    if (!f->has_qpath) {
      osr__agent_send_http_error(req, 400, "path is required");
      return;
    }
    f->busy = 1;
    if (uv_queue_work(a->loop, &f->w, dl_work, dl_after) != 0) {
      f->busy = 0;
      osr__agent_send_http_error(req, 500, "cannot queue work");
    }
    return;
  }

  const osr_iovec_t *ct = osr_http_req_header(req, "content-type");
  const osr_iovec_t *ce = osr_http_req_header(req, "content-encoding");
  if (ce != NULL && !(ce->len == 8 && strncasecmp(ce->base, "identity", 8) == 0)) {
    /* gzip uploads are an envd >= 0.5.7 option the SDK uses only when asked
     * to; not implemented (docs/agent.md). */
    f->failed = 1;
    osr__agent_send_http_error(req, 415, "content-encoding not supported");
    return;
  }
  req->on_body = up_on_body;
  if (ct != NULL && ct->len >= 19 && strncasecmp(ct->base, "multipart/form-data", 19) == 0) {
    if (osr_mp_init(&f->mp, ct->base, ct->len, &mp_events, f) != 0) {
      f->failed = 1;
      osr__agent_send_http_error(req, 400, "bad multipart content-type");
      return;
    }
    f->multipart = 1;
    f->buf = osr_xmalloc(FILE_BUF);
    return;
  }
  if (!f->has_qpath) {
    f->failed = 1;
    osr__agent_send_http_error(req, 400, "path is required for an octet-stream upload");
    return;
  }
  start_open(f, f->qpath);
}
