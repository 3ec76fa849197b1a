/*
 * Port forwarding (OSR extension, docs/agent.md):
 *
 *   GET /_osr/ports/{port}   Upgrade: osr-tcp, Connection: Upgrade
 *   -> 101 Switching Protocols, then raw bytes both ways to
 *      127.0.0.1:{port} inside the sandbox.
 *
 * The upstream is connected first, so a closed port answers 502 instead of
 * a 101 followed by a dead stream. Then each direction forwards straight
 * from the source socket's input buffer (zero-copy, STYLE 16): the source
 * stops reading while its bytes are being written and resumes from the
 * write callback, so each direction holds at most one input buffer
 * (STYLE 14). A half-close is propagated with shutdown(); the pair closes
 * when both directions ended or either failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "agent/agent.h"
#include "net/connect.h"
#include "util/log.h"
#include "util/mem.h"

typedef struct fwd_s fwd_t;

typedef struct side_s {
  fwd_t *f;
  osr_sock_t *s;
  size_t inflight; /* bytes of s->input being written to the peer */
  int eof;         /* s read EOF */
  int shut;        /* the peer's write side was shut down */
} side_t;

struct fwd_s {
  osr_http_req_t *req;
  osr_connect_t *conn;
  side_t c, u; /* client (upgraded HTTP socket), upstream */
  int open_socks;
  int dead;
};

static void side_on_read(osr_sock_t *s, int status);
static void side_on_close(osr_sock_t *s);
static const osr_sock_events_t side_events = {side_on_read, side_on_close, NULL, NULL};

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

static side_t *peer_of(side_t *sd)
{
  return sd == &sd->f->c ? &sd->f->u : &sd->f->c;
}

static void fwd_kill(fwd_t *f)
{
  f->dead = 1;
  if (f->c.s != NULL)
    osr_sock_close(f->c.s);
  if (f->u.s != NULL)
    osr_sock_close(f->u.s);
}

static void side_on_close(osr_sock_t *s)
{
  side_t *sd = s->data;
  fwd_t *f = sd->f;
  sd->s = NULL;
  fwd_kill(f);
  if (--f->open_socks == 0)
    osr_free(f);
}

static void on_shut(osr_sock_t *s, int status, void *arg)
{
  side_t *sd = arg; /* the side whose EOF we propagated */
  (void)s;
  if (status != 0) {
    fwd_kill(sd->f);
    return;
  }
  side_t *pd = peer_of(sd);
  /* Both directions over: done. */
  if (sd->shut && pd->shut)
    fwd_kill(sd->f);
}

static void propagate_eof(side_t *sd)
{
  side_t *pd = peer_of(sd);
  if (sd->shut || pd->s == NULL)
    return;
  sd->shut = 1;
  if (osr_sock_shutdown(pd->s, on_shut, sd) != 0)
    fwd_kill(sd->f);
}

static void on_forwarded(osr_sock_t *dst, int status, void *arg)
{
  side_t *sd = arg;
  (void)dst;
  if (status != 0 || sd->s == NULL) {
    fwd_kill(sd->f);
    return;
  }
  osr_buf_consume(&sd->s->input, sd->inflight);
  sd->inflight = 0;
  if (sd->eof && sd->s->input.len == 0)
    propagate_eof(sd);
  else
    osr_sock_read_start(sd->s); /* delivers what is left, then new bytes */
}

static void side_on_read(osr_sock_t *s, int status)
{
  side_t *sd = s->data;
  side_t *pd = peer_of(sd);
  if (sd->f->dead)
    return;
  if (status < 0 && status != OSR_EOF) {
    fwd_kill(sd->f);
    return;
  }
  if (status == OSR_EOF)
    sd->eof = 1;
  if (sd->inflight == 0 && s->input.len > 0 && pd->s != NULL) {
    osr_iovec_t iov = osr_iov(osr_buf_data(&s->input), s->input.len);
    sd->inflight = iov.len;
    osr_sock_read_stop(s);
    if (osr_sock_write(pd->s, &iov, 1, on_forwarded, sd) != 0) {
      sd->inflight = 0;
      fwd_kill(sd->f);
    }
    return;
  }
  if (sd->eof && sd->inflight == 0)
    propagate_eof(sd);
}

static void on_upgraded(osr_sock_t *s, int status, void *arg)
{
  fwd_t *f = arg;
  if (status != 0) {
    osr_sock_close(f->u.s);
    return;
  }
  f->c.s = s;
  f->open_socks++;
  osr_sock_set_events(s, &side_events, &f->c);
  osr_sock_set_idle_timeout(s, 0);
  osr_sock_read_start(s); /* bytes sent right after the request are delivered too */
  osr_sock_read_start(f->u.s);
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
  f->u.s = s;
  f->open_socks = 1;
  osr_sock_set_events(s, &side_events, &f->u);
  osr_sock_set_idle_timeout(s, 0);
  osr_sock_set_nodelay(s, 1);
  osr_http_header_t h[2] = {
      {OSR_IOV_LIT("upgrade"), OSR_IOV_LIT("osr-tcp")},
      {OSR_IOV_LIT("connection"), OSR_IOV_LIT("Upgrade")},
  };
  osr_http_req_t *req = f->req;
  req->on_done = NULL; /* from here the socket pair owns f */
  f->req = NULL;
  if (osr_http_upgrade(req, h, 2, on_upgraded, f) != 0) {
    osr__agent_send_http_error(req, 500, "upgrade failed");
    osr_sock_close(s);
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
  f->c.f = f->u.f = f;
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
