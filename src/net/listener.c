/*
 * Listener. The connection limit uses a libuv property: if the connection
 * callback returns without calling uv_accept(), libuv keeps the accepted fd
 * and stops polling the listening socket until uv_accept() is called. So at
 * the limit we simply leave the connection pending and accept it when a live
 * one closes: the kernel backlog absorbs the rest.
 */
#include "net/listener.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/tls.h"
#include "util/log.h"
#include "util/mem.h"

static void accept_one(osr_listener_t *l);

static void list_add(osr_listener_t *l, osr_sock_t *s)
{
  s->_listener = l;
  s->_prev = NULL;
  s->_next = l->_conns;
  if (l->_conns != NULL)
    l->_conns->_prev = s;
  l->_conns = s;
  l->_nconns++;
}

static void on_listener_handle_closed(uv_handle_t *h)
{
  osr_listener_t *l = h->data;
  if (--l->_open_handles != 0)
    return;
  if (l->_on_close != NULL)
    l->_on_close(l);
  if (l->_tls != NULL)
    osr_tls_ctx_unref(l->_tls);
  osr_free(l);
}

void osr__listener_forget(osr_listener_t *l, osr_sock_t *s)
{
  if (s->_prev != NULL)
    s->_prev->_next = s->_next;
  else
    l->_conns = s->_next;
  if (s->_next != NULL)
    s->_next->_prev = s->_prev;
  s->_prev = s->_next = NULL;
  s->_listener = NULL;
  l->_nconns--;

  if (l->_closing) {
    if (l->_nconns == 0 && !uv_is_closing((uv_handle_t *)&l->_grace))
      uv_close((uv_handle_t *)&l->_grace, on_listener_handle_closed);
    return;
  }
  if (l->_accept_pending && (l->_max_conns == 0 || l->_nconns < l->_max_conns)) {
    l->_accept_pending = 0;
    accept_one(l);
  }
}

static void on_handshake(osr_sock_t *s, int status)
{
  osr_listener_t *l = s->_listener;

  if (status != 0) {
    char peer[80] = "?";
    osr_sock_peername(s, peer, sizeof(peer));
    OSR_LOG_DEBUG("listener", "TLS handshake with %s failed: %s", peer, osr_strerror(status));
    if (l != NULL)
      l->tls_failed++;
    osr_sock_close(s);
    return;
  }
  if (l == NULL || l->_closing) {
    osr_sock_close(s);
    return;
  }
  l->_on_accept(l, s);
}

static void accept_one(osr_listener_t *l)
{
  osr_sock_t *s;
  int rv = osr__sock_new(l->loop, l->_is_pipe, &s);
  if (rv != 0) {
    OSR_LOG_ERROR("listener", "socket init: %s", osr_strerror(rv));
    return;
  }
  rv = uv_accept(&l->_h.stream, &s->_h.stream);
  list_add(l, s);
  if (rv != 0) {
    OSR_LOG_WARN("listener", "accept: %s", osr_strerror(rv));
    osr_sock_close(s);
    return;
  }
  l->accepted++;
  if (!l->_is_pipe)
    osr_sock_set_nodelay(s, 1);
  if (l->_tls != NULL) {
    rv = osr__sock_start_tls(s, l->_tls, 1, NULL, l->_handshake_timeout_ms, on_handshake);
    if (rv != 0) {
      OSR_LOG_WARN("listener", "TLS start: %s", osr_strerror(rv));
      osr_sock_close(s);
    }
    return;
  }
  l->_on_accept(l, s);
}

static void on_connection(uv_stream_t *server, int status)
{
  osr_listener_t *l = server->data;

  if (status != 0) {
    OSR_LOG_WARN("listener", "listen error: %s", osr_strerror(status));
    return;
  }
  if (l->_closing)
    return;
  if (l->_max_conns != 0 && l->_nconns >= l->_max_conns) {
    /* Leave it in the backlog; see the file comment. */
    l->_accept_pending = 1;
    return;
  }
  accept_one(l);
}

int osr_listener_new(uv_loop_t *loop, const char *addr, const osr_listener_opts_t *opts,
                     osr_listener_accept_cb on_accept, void *data, osr_listener_t **out)
{
  osr_addr_t a;
  struct sockaddr_storage ss;
  int rv = osr_addr_parse(addr, &a);
  if (rv != 0)
    return rv;
  if (!a.is_unix && (rv = osr_addr_to_sockaddr(&a, &ss)) != 0)
    return rv; /* listeners take numeric addresses only */

  osr_listener_t *l = osr_xcalloc(1, sizeof(*l));
  l->loop = loop;
  l->data = data;
  l->_on_accept = on_accept;
  l->_is_pipe = a.is_unix;
  l->_max_conns = opts != NULL ? opts->max_conns : 0;
  l->_handshake_timeout_ms =
      opts != NULL && opts->handshake_timeout_ms != 0 ? opts->handshake_timeout_ms : 10000;
  int backlog = opts != NULL && opts->backlog > 0 ? opts->backlog : 511;

  if (a.is_unix) {
    rv = uv_pipe_init(loop, &l->_h.pipe, 0);
    if (rv == 0) {
      struct stat st;
      /* Replace a stale socket file, never any other kind of file. */
      if (lstat(a.path, &st) == 0 && S_ISSOCK(st.st_mode))
        unlink(a.path);
      rv = uv_pipe_bind(&l->_h.pipe, a.path);
      if (rv == 0) {
        snprintf(l->_path, sizeof(l->_path), "%s", a.path);
        int mode = opts != NULL && opts->unix_mode != 0 ? opts->unix_mode : 0600;
        /* Some sandboxed kernels (gVisor's host-UDS bridge) refuse chmod on
         * a socket file. The socket still works, and the directory it lives
         * in is what guards it there, so that case is a warning; any other
         * failure means the permissions we promised are not in place. */
        if (chmod(a.path, (mode_t)mode) != 0) {
          if (errno == EPERM || errno == ENOTSUP)
            OSR_LOG_WARN("listener", "chmod %s: %s (keeping the default mode)", a.path,
                         strerror(errno));
          else
            rv = -errno;
        }
      }
    }
  } else {
    rv = uv_tcp_init(loop, &l->_h.tcp);
    if (rv == 0)
      rv = uv_tcp_bind(&l->_h.tcp, (struct sockaddr *)&ss,
                       ss.ss_family == AF_INET6 ? UV_TCP_IPV6ONLY : 0);
  }
  l->_h.handle.data = l;
  if (rv == 0)
    rv = uv_listen(&l->_h.stream, backlog, on_connection);
  uv_timer_init(loop, &l->_grace);
  l->_grace.data = l;
  l->_open_handles = 2;
  if (rv != 0) {
    /* Handles must still go through uv_close before the memory is freed. */
    l->_closing = 1;
    uv_close(&l->_h.handle, on_listener_handle_closed);
    uv_close((uv_handle_t *)&l->_grace, on_listener_handle_closed);
    return rv;
  }
  if (opts != NULL && opts->tls != NULL) {
    l->_tls = opts->tls;
    osr_tls_ctx_ref(l->_tls);
  }
  *out = l;
  return 0;
}

int osr_listener_port(const osr_listener_t *l)
{
  struct sockaddr_storage ss;
  int len = sizeof(ss);
  if (l->_is_pipe)
    return 0;
  if (uv_tcp_getsockname(&l->_h.tcp, (struct sockaddr *)&ss, &len) != 0)
    return 0;
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

static void on_grace_expired(uv_timer_t *t)
{
  osr_listener_t *l = t->data;
  OSR_LOG_INFO("listener", "grace period over, closing %zu connection(s)", l->_nconns);
  for (osr_sock_t *s = l->_conns; s != NULL; s = s->_next)
    osr_sock_close(s);
}

void osr_listener_close(osr_listener_t *l, uint64_t grace_ms, osr_listener_close_cb cb)
{
  if (l->_closing)
    return;
  l->_closing = 1;
  l->_on_close = cb;
  uv_close(&l->_h.handle, on_listener_handle_closed);
  if (l->_is_pipe && l->_path[0] != '\0')
    unlink(l->_path);

  if (l->_nconns == 0) {
    uv_close((uv_handle_t *)&l->_grace, on_listener_handle_closed);
    return;
  }
  /* Ask each connection to finish. A connection may close itself from
   * on_drain, which unlinks it, so walk with a saved next pointer. */
  osr_sock_t *next;
  for (osr_sock_t *s = l->_conns; s != NULL; s = next) {
    next = s->_next;
    s->_flags |= OSR_SOCK_F_DRAINING;
    if (s->ev != NULL && s->ev->on_drain != NULL)
      s->ev->on_drain(s);
    else
      osr_sock_close(s);
  }
  /* Closing is asynchronous, so connections are still listed here; the
   * last one to go closes the grace timer (osr__listener_forget). */
  uv_timer_start(&l->_grace, on_grace_expired, grace_ms, 0);
}
