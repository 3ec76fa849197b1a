/*
 * Port forwarding (OSR extension, docs/agent.md):
 *
 *   GET /_osr/ports/{port}   Upgrade: osr-tcp, Connection: Upgrade
 *   -> 101 Switching Protocols, then raw bytes both ways to
 *      127.0.0.1:{port} inside the sandbox.
 *
 * The upstream is connected first, so a closed port answers 502 instead of
 * a 101 followed by a dead stream. Then net/splice.c relays the bytes both
 * ways (zero-copy, backpressure, half-close).
 *
 * Descriptor passing (docs/agent.md, "Descriptor passing"): a client on a
 * unix socket that sends `osr-fd: 1` (the data plane on the same host) is
 * offered the connected socket itself. The 101 then carries `osr-fd: 1` and
 * is followed by one tag byte: 'F' with the socket attached (SCM_RIGHTS;
 * the agent closes its copy and the connection, and is out of the data
 * path), or 'T' without one when the kernel refused to pass it (gVisor:
 * the socket lives in gVisor's netstack and the unix socket is a host
 * one), after which the connection is the usual byte tunnel. Deciding by
 * trying the sendmsg() means no configuration can get it wrong; OSR_FDPASS=0
 * in the agent's environment turns the offer off (tests of the tunnel).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agent/agent.h"
#include "net/connect.h"
#include "net/fdpass.h"
#include "net/splice.h"
#include "util/log.h"
#include "util/mem.h"

typedef struct fwd_s {
  osr_http_req_t *req;   /* NULL once the exchange is over */
  osr_connect_t *conn;   /* the upstream connect in flight */
  int want_fd;           /* offer the socket itself (osr-fd: 1) */
} fwd_t;

static int fdpass_enabled(void)
{
  static int on = -1;
  if (on < 0) {
    const char *e = getenv("OSR_FDPASS");
    on = !(e != NULL && strcmp(e, "0") == 0);
  }
  return on;
}

static void noop_read(osr_sock_t *s, int status)
{
  (void)s;
  (void)status;
}
static void noop_close(osr_sock_t *s)
{
  (void)s;
}
static const osr_sock_events_t noop_events = {noop_read, noop_close, NULL, NULL};

static void on_splice_closed(osr_splice_t *sp, void *data)
{
  (void)sp;
  (void)data;
}

/* The 101 with osr-fd: 1 is written and the client socket is ours: pass the
 * upstream socket ('F'), or fall back to the tunnel ('T'). */
static void on_fd_upgraded(osr_sock_t *client, int status, void *arg)
{
  osr_sock_t *up = arg;
  if (status != 0 || client == NULL) {
    osr_sock_close(up);
    return;
  }
  int rv = osr_fdpass_send(client, osr_fdpass_fileno(up), 'F');
  if (rv == 0) {
    /* The data plane holds its own reference now: closing ours does not
     * end the connection (no shutdown(), only close()). */
    osr_sock_close(up);
    osr_sock_set_events(client, &noop_events, NULL);
    osr_sock_close(client);
    return;
  }
  OSR_LOG_DEBUG("agent", "cannot pass the port's socket (%s): tunnelling", osr_strerror(rv));
  static const char tag = 'T';
  osr_iovec_t iov = osr_iov(&tag, 1);
  osr_splice_t *sp = osr_splice_new(up, on_splice_closed, NULL);
  if (osr_sock_write(client, &iov, 1, NULL, NULL) != 0) {
    osr_splice_attach(NULL, OSR_ECANCELED, sp);
    osr_sock_set_events(client, &noop_events, NULL);
    osr_sock_close(client);
    return;
  }
  osr_splice_attach(client, 0, sp);
}

static void fwd_req_done(osr_http_req_t *req, int status)
{
  fwd_t *f = req->data;
  (void)status;
  f->req = NULL;
  if (f->conn != NULL) {
    osr_connect_t *c = f->conn;
    f->conn = NULL;
    osr_connect_cancel(c); /* fires on_connected with OSR_ECANCELED */
  }
}

static void on_connected(osr_sock_t *s, int status, void *data)
{
  fwd_t *f = data;
  f->conn = NULL;
  if (status != 0) {
    if (f->req != NULL) {
      char msg[128];
      snprintf(msg, sizeof(msg), "cannot connect to the port: %s", osr_strerror(status));
      f->req->on_done = NULL;
      osr__agent_send_http_error(f->req, 502, msg);
    }
    osr_free(f);
    return;
  }
  if (f->req == NULL) {
    osr_sock_set_events(s, &noop_events, NULL);
    osr_sock_close(s);
    osr_free(f);
    return;
  }
  osr_sock_set_nodelay(s, 1);
  if (f->want_fd) {
    osr_sock_set_events(s, &noop_events, NULL); /* not read until decided */
    osr_http_header_t h[3] = {
        {OSR_IOV_LIT("upgrade"), OSR_IOV_LIT("osr-tcp")},
        {OSR_IOV_LIT("connection"), OSR_IOV_LIT("Upgrade")},
        {OSR_IOV_LIT("osr-fd"), OSR_IOV_LIT("1")},
    };
    osr_http_req_t *req = f->req;
    req->on_done = NULL;
    osr_free(f);
    if (osr_http_upgrade(req, h, 3, on_fd_upgraded, s) != 0) {
      osr__agent_send_http_error(req, 500, "upgrade failed");
      osr_sock_close(s);
    }
    return;
  }
  /* From here the splice owns the upstream socket, and the client socket
   * once the upgrade hands it over. */
  osr_splice_t *sp = osr_splice_new(s, on_splice_closed, NULL);
  osr_http_header_t h[2] = {
      {OSR_IOV_LIT("upgrade"), OSR_IOV_LIT("osr-tcp")},
      {OSR_IOV_LIT("connection"), OSR_IOV_LIT("Upgrade")},
  };
  osr_http_req_t *req = f->req;
  req->on_done = NULL;
  osr_free(f);
  if (osr_http_upgrade(req, h, 2, osr_splice_attach, sp) != 0) {
    osr__agent_send_http_error(req, 500, "upgrade failed");
    osr_splice_attach(NULL, OSR_ECANCELED, sp);
  }
}

void osr__agent_port_forward(agent_t *a, osr_http_req_t *req)
{
  const char *p = req->path.base + 12;
  size_t n = req->path.len - 12;
  unsigned port = 0;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9' || port > 65535) {
      port = 0;
      break;
    }
    port = port * 10 + (unsigned)(p[i] - '0');
  }
  if (n == 0 || n > 5 || port == 0 || port > 65535) {
    osr__agent_send_http_error(req, 400, "bad port");
    return;
  }
  const osr_iovec_t *up = osr_http_req_header(req, "upgrade");
  if (req->method.len != 3 || memcmp(req->method.base, "GET", 3) != 0 || up == NULL ||
      up->len != 7 || strncasecmp(up->base, "osr-tcp", 7) != 0) {
    osr__agent_send_http_error(req, 426, "send GET with Upgrade: osr-tcp");
    return;
  }
  if (req->version != 11) {
    osr__agent_send_http_error(req, 400, "port forwarding needs HTTP/1.1 Upgrade");
    return;
  }
  fwd_t *f = osr_xcalloc(1, sizeof(*f));
  f->req = req;
  const osr_iovec_t *fdh = osr_http_req_header(req, "osr-fd");
  f->want_fd = fdh != NULL && fdh->len == 1 && fdh->base[0] == '1' && fdpass_enabled() &&
               osr_fdpass_is_unix(req->sock);
  req->data = f;
  req->on_done = fwd_req_done;
  char addr[32];
  snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
  osr_connect_opts_t o = {5000, NULL, NULL};
  int rv = osr_connect(a->loop, addr, &o, on_connected, f, &f->conn);
  if (rv != 0) {
    req->on_done = NULL;
    osr_free(f);
    osr__agent_send_http_error(req, 502, "cannot connect to the port");
  }
}
