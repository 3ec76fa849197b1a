/*
 * SCM_RIGHTS descriptor passing (fdpass.h). The sender is one sendmsg() of
 * one byte; the receiver is a uv_poll_t on a dup() of the unix socket and a
 * recvmsg() per readable event, with the hostile-sender rules of the header
 * checked on every read.
 */
#include "net/fdpass.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/mem.h"

/* Bytes read per recvmsg(): the handshake is one short HTTP head plus a
 * tag byte; the input buffer's cap bounds the total. */
#define FDPASS_READ 4096

int osr_fdpass_fileno(const osr_sock_t *s)
{
  uv_os_fd_t fd = -1;
  if (uv_fileno(&s->_h.handle, &fd) != 0)
    return -1;
  return fd;
}

int osr_fdpass_is_unix(const osr_sock_t *s)
{
  int fd = osr_fdpass_fileno(s);
  struct sockaddr_storage ss;
  socklen_t l = sizeof(ss);
  if (fd < 0 || getsockname(fd, (struct sockaddr *)&ss, &l) != 0)
    return 0;
  return ss.ss_family == AF_UNIX;
}

int osr_fdpass_send(osr_sock_t *s, int fd, uint8_t tag)
{
  int sfd = osr_fdpass_fileno(s);
  if (sfd < 0 || osr_sock_is_closing(s))
    return OSR_ECLOSED;
  /* The tag must follow every byte written before it: only with nothing
   * queued in libuv or waiting for a deferred callback is that certain. */
  if (osr_sock_write_queue_size(s) != 0 || uv_stream_get_write_queue_size(&s->_h.stream) != 0)
    return OSR_EBUSY;
  union {
    struct cmsghdr h;
    char space[CMSG_SPACE(sizeof(int))];
  } u;
  memset(&u, 0, sizeof(u));
  struct iovec iov = {&tag, 1};
  struct msghdr m;
  memset(&m, 0, sizeof(m));
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = u.space;
  m.msg_controllen = sizeof(u.space);
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t n;
  do
    n = sendmsg(sfd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n == 1)
    return 0;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    return OSR_EAGAIN;
  return n < 0 ? -errno : OSR_EPROTO;
}

/* ---- receiving ------------------------------------------------------------ */

struct osr_fdpass_recv_s {
  uv_poll_t poll;
  osr_sock_t *s;
  osr_fdpass_recv_cb cb;
  void *data;
  int dupfd;
  int fd;      /* the descriptor received, -1 = none */
  int in_cb;   /* the owner's callback is running */
  int stopped; /* osr_fdpass_recv_stop was called */
};

static void on_poll_closed(uv_handle_t *h)
{
  osr_fdpass_recv_t *r = h->data;
  if (r->dupfd >= 0)
    close(r->dupfd);
  osr_free(r);
}

/* Close every descriptor carried by the control messages of `m` (the
 * hostile-sender paths: nothing received may stay open). */
static void close_all(struct msghdr *m)
{
  for (struct cmsghdr *c = CMSG_FIRSTHDR(m); c != NULL; c = CMSG_NXTHDR(m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
      continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fd >= 0)
        close(fd);
    }
  }
}

/* One recvmsg(). Returns 0 (bytes appended), OSR_EAGAIN (nothing yet),
 * OSR_EOF or an error. */
static int read_once(osr_fdpass_recv_t *r)
{
  osr_iovec_t tail;
  int rv = osr_buf_reserve(&r->s->input, 1, &tail);
  if (rv != 0)
    return rv;
  if (tail.len > FDPASS_READ)
    tail.len = FDPASS_READ;
  /* Room for two descriptors: one more than allowed, so a second one is
   * seen (and closed) rather than silently truncated away by the kernel;
   * more than that sets MSG_CTRUNC, which fails the read as well. */
  union {
    struct cmsghdr h;
    char space[CMSG_SPACE(2 * sizeof(int))];
  } u;
  struct iovec iov = {tail.base, tail.len};
  struct msghdr m;
  memset(&m, 0, sizeof(m));
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = u.space;
  m.msg_controllen = sizeof(u.space);
  ssize_t n;
  do
    n = recvmsg(r->dupfd, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return errno == EAGAIN || errno == EWOULDBLOCK ? OSR_EAGAIN : -errno;
  if (m.msg_flags & MSG_CTRUNC) {
    close_all(&m);
    return OSR_EPROTO;
  }
  int bad = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      bad = 1; /* credentials etc.: nothing we asked for */
      continue;
    }
    size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    if (k != 1 || r->fd >= 0)
      bad = 1;
  }
  if (bad) {
    close_all(&m);
    if (r->fd >= 0) {
      close(r->fd);
      r->fd = -1;
    }
    return OSR_EPROTO;
  }
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c))
    memcpy(&r->fd, CMSG_DATA(c), sizeof(int));
  if (n == 0)
    return OSR_EOF; /* a descriptor with no byte cannot happen on a stream */
  osr_buf_commit(&r->s->input, (size_t)n);
  return 0;
}

static void on_poll(uv_poll_t *p, int status, int events)
{
  osr_fdpass_recv_t *r = p->data;
  (void)events;
  int rv = status != 0 ? status : read_once(r);
  if (rv == OSR_EAGAIN)
    return;
  r->in_cb = 1;
  r->cb(r, rv, r->data);
  r->in_cb = 0;
  if (r->stopped) {
    uv_close((uv_handle_t *)&r->poll, on_poll_closed);
    return;
  }
  if (rv != 0) /* the owner must stop after an error; be safe if it did not */
    uv_poll_stop(&r->poll);
}

int osr_fdpass_recv_start(osr_sock_t *s, osr_fdpass_recv_cb cb, void *data, osr_fdpass_recv_t **out)
{
  int sfd = osr_fdpass_fileno(s);
  if (sfd < 0 || osr_sock_is_closing(s))
    return OSR_ECLOSED;
  int d = fcntl(sfd, F_DUPFD_CLOEXEC, 0);
  if (d < 0)
    return -errno;
  osr_fdpass_recv_t *r = osr_xcalloc(1, sizeof(*r));
  r->s = s;
  r->cb = cb;
  r->data = data;
  r->dupfd = d;
  r->fd = -1;
  int rv = uv_poll_init_socket(s->loop, &r->poll, d);
  if (rv != 0) {
    close(d);
    osr_free(r);
    return rv;
  }
  r->poll.data = r;
  rv = uv_poll_start(&r->poll, UV_READABLE | UV_DISCONNECT, on_poll);
  if (rv != 0) {
    uv_close((uv_handle_t *)&r->poll, on_poll_closed);
    return rv;
  }
  *out = r;
  return 0;
}

int osr_fdpass_recv_fd(const osr_fdpass_recv_t *r)
{
  return r->fd;
}

int osr_fdpass_recv_stop(osr_fdpass_recv_t *r, int take)
{
  int fd = r->fd;
  r->fd = -1;
  if (!take && fd >= 0) {
    close(fd);
    fd = -1;
  }
  r->stopped = 1;
  /* uv_poll_stop drops the dup's epoll registration now, so the socket's
   * own handle can be polled again at once. */
  uv_poll_stop(&r->poll);
  if (!r->in_cb)
    uv_close((uv_handle_t *)&r->poll, on_poll_closed);
  return fd;
}

int osr_fdpass_check_stream(int fd, const char **why)
{
  struct stat st;
  int v = 0;
  socklen_t l = sizeof(v);
  const char *w = NULL;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode))
    w = "not a socket";
  else if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &l) != 0 || v != SOCK_STREAM)
    w = "not a stream socket";
  else if ((l = sizeof(v), getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l)) != 0 ||
           (v != AF_INET && v != AF_INET6))
    w = "not an AF_INET/AF_INET6 socket";
  else if ((l = sizeof(v), getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &l)) != 0 || v != 0)
    w = "a listening socket";
  else {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
      w = "not connected";
  }
  if (why != NULL)
    *why = w;
  return w == NULL ? 0 : OSR_EPROTO;
}

int osr_fdpass_sock_open(uv_loop_t *loop, int fd, osr_sock_t **out)
{
  osr_sock_t *s = NULL;
  int rv = osr__sock_new(loop, 0, &s);
  if (rv != 0) {
    close(fd);
    return rv;
  }
  /* uv_tcp_open makes the descriptor non-blocking; the socket then owns it
   * (closed by osr_sock_close). */
  rv = uv_tcp_open(&s->_h.tcp, fd);
  if (rv != 0) {
    close(fd);
    osr_sock_close(s);
    return rv;
  }
  *out = s;
  return 0;
}
