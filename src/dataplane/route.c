/*
 * Request routing for the data plane: which sandbox and port a request is
 * for, where its token is, which scope it needs and what target goes
 * upstream. Pure functions over the parsed request (no I/O, no logging),
 * bounded by the request's own caps, so they are easy to test and fuzz.
 */
#include <string.h>
#include <strings.h>

#include "dataplane/dp_int.h"
#include "net/addr.h"

static int sid_char(char c)
{
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

/* A sandbox id: 1..39 of [A-Za-z0-9_-] (fits the token's claim field). */
static int set_sid(dp_route_t *r, const char *p, size_t n)
{
  if (n == 0 || n >= sizeof(r->sandbox_id))
    return OSR_EINVAL;
  for (size_t i = 0; i < n; i++)
    if (!sid_char(p[i]))
      return OSR_EINVAL;
  memcpy(r->sandbox_id, p, n);
  r->sandbox_id[n] = '\0';
  return 0;
}

static int parse_port(const char *p, size_t n, uint16_t *out)
{
  unsigned v = 0;
  if (n == 0 || n > 5)
    return OSR_EINVAL;
  for (size_t i = 0; i < n; i++) {
    if (p[i] < '0' || p[i] > '9')
      return OSR_EINVAL;
    v = v * 10 + (unsigned)(p[i] - '0');
  }
  if (v == 0 || v > 65535)
    return OSR_EINVAL;
  *out = (uint16_t)v;
  return 0;
}

/* Host without its port: "a.b:80" -> "a.b", "[::1]:80" -> "::1". */
static osr_iovec_t host_only(osr_iovec_t h)
{
  if (h.len > 0 && h.base[0] == '[') {
    const char *e = memchr(h.base, ']', h.len);
    return e != NULL ? osr_iov(h.base + 1, (size_t)(e - h.base - 1)) : osr_iov(h.base, 0);
  }
  const char *c = memchr(h.base, ':', h.len);
  return c != NULL ? osr_iov(h.base, (size_t)(c - h.base)) : h;
}

/* /sbx/<id>/<port>[/<rest>] */
static int route_path(const osr_http_req_t *req, dp_route_t *r)
{
  const char *p = req->path.base + 5;
  size_t n = req->path.len - 5;
  const char *s1 = memchr(p, '/', n);
  if (s1 == NULL)
    return OSR_EINVAL;
  int rv = set_sid(r, p, (size_t)(s1 - p));
  if (rv != 0)
    return rv;
  const char *q = s1 + 1;
  size_t qn = n - (size_t)(q - p);
  const char *s2 = memchr(q, '/', qn);
  size_t pn = s2 != NULL ? (size_t)(s2 - q) : qn;
  if ((rv = parse_port(q, pn, &r->port)) != 0)
    return rv;
  r->via = DP_VIA_PATH;
  r->path = s2 != NULL ? osr_iov(s2, qn - pn) : OSR_IOV_LIT("/");
  r->query = req->query;
  return 0;
}

/* <port>-<id>.<domain> */
static int route_host(osr_iovec_t host, const char *domain, dp_route_t *r)
{
  size_t dl = strlen(domain);
  if (host.len < dl + 4 || host.base[host.len - dl - 1] != '.' ||
      strncasecmp(host.base + host.len - dl, domain, dl) != 0)
    return OSR_ENOENT;
  size_t ll = host.len - dl - 1; /* the label(s) before the domain */
  const char *dash = memchr(host.base, '-', ll);
  if (dash == NULL || memchr(host.base, '.', ll) != NULL)
    return OSR_ENOENT;
  if (parse_port(host.base, (size_t)(dash - host.base), &r->port) != 0)
    return OSR_ENOENT; /* e.g. sandbox.<domain>: not this form */
  int rv = set_sid(r, dash + 1, ll - (size_t)(dash + 1 - host.base));
  if (rv != 0)
    return rv;
  r->via = DP_VIA_HOST;
  return 0;
}

int osr__dp_route(const osr_http_req_t *req, const char *domain, dp_route_t *out)
{
  memset(out, 0, sizeof(*out));
  out->path = req->path;
  out->query = req->query;
  if (req->path.len >= 5 && memcmp(req->path.base, "/sbx/", 5) == 0)
    return route_path(req, out);
  osr_iovec_t host = host_only(req->authority);
  if (domain != NULL && domain[0] != '\0') {
    int rv = route_host(host, domain, out);
    if (rv != OSR_ENOENT)
      return rv;
  }
  /* E2B's proxy routes by these headers when the Host is localhost, an IP
   * literal or sandbox.<domain>; we accept them on any Host that is not
   * the Host form (a token for the named sandbox is required anyway), so a
   * custom E2B_SANDBOX_URL host works too. */
  const osr_iovec_t *id = osr_http_req_header(req, "e2b-sandbox-id");
  const osr_iovec_t *port = osr_http_req_header(req, "e2b-sandbox-port");
  if (id == NULL && port == NULL)
    return OSR_ENOENT;
  if (id == NULL || port == NULL)
    return OSR_EINVAL;
  int rv = set_sid(out, id->base, id->len);
  if (rv == 0)
    rv = parse_port(port->base, port->len, &out->port);
  if (rv == 0)
    out->via = DP_VIA_HEADERS;
  return rv;
}

/* Next "k=v" parameter of a query; returns 0 at the end. */
static int next_param(osr_iovec_t *q, osr_iovec_t *param)
{
  if (q->len == 0)
    return 0;
  const char *amp = memchr(q->base, '&', q->len);
  size_t n = amp != NULL ? (size_t)(amp - q->base) : q->len;
  *param = osr_iov(q->base, n);
  q->base += amp != NULL ? n + 1 : n;
  q->len -= amp != NULL ? n + 1 : n;
  return 1;
}

static int is_token_param(osr_iovec_t p)
{
  return (p.len >= 13 && memcmp(p.base, "access_token=", 13) == 0) ||
         (p.len == 12 && memcmp(p.base, "access_token", 12) == 0);
}

dp_tok_src_t osr__dp_token(const osr_http_req_t *req, osr_iovec_t *tok)
{
  const osr_iovec_t *v = osr_http_req_header(req, "x-access-token");
  if (v != NULL && v->len > 0) {
    *tok = *v;
    return DP_TOK_HEADER;
  }
  v = osr_http_req_header(req, "authorization");
  if (v != NULL && v->len > 7 && strncasecmp(v->base, "bearer ", 7) == 0) {
    *tok = osr_iov(v->base + 7, v->len - 7);
    while (tok->len > 0 && tok->base[0] == ' ')
      tok->base++, tok->len--;
    return DP_TOK_BEARER;
  }
  osr_iovec_t q = req->query, p;
  while (next_param(&q, &p)) {
    if (p.len > 13 && memcmp(p.base, "access_token=", 13) == 0) {
      *tok = osr_iov(p.base + 13, p.len - 13);
      return DP_TOK_QUERY;
    }
  }
  *tok = osr_iov(NULL, 0);
  return DP_TOK_NONE;
}

static int path_has_prefix(osr_iovec_t path, const char *pfx)
{
  size_t n = strlen(pfx);
  return path.len >= n && memcmp(path.base, pfx, n) == 0;
}

int osr__dp_scope(uint16_t port, osr_iovec_t path, unsigned *scope)
{
  if (port != OSR_DP_ENVD_PORT) {
    *scope = OSR_SCOPE_PORTS;
    return 0;
  }
  if (path_has_prefix(path, "/_osr/"))
    return OSR_EACCES; /* the agent's port tunnels must go through the ports scope */
  if (path.len == 7 && memcmp(path.base, "/health", 7) == 0) {
    *scope = 0;
    return 0;
  }
  if (path_has_prefix(path, "/process.Process/")) {
    *scope = OSR_SCOPE_EXEC;
    return 0;
  }
  if ((path.len == 6 && memcmp(path.base, "/files", 6) == 0) || path_has_prefix(path, "/files?") ||
      path_has_prefix(path, "/filesystem.Filesystem/")) {
    *scope = OSR_SCOPE_FILES;
    return 0;
  }
  /* Anything else envd may grow: the widest scope, so a narrow token
   * never reaches an API it was not meant for. */
  *scope = OSR_SCOPE_EXEC | OSR_SCOPE_FILES;
  return 0;
}

int osr__dp_target(osr_iovec_t path, osr_iovec_t query, char *out, size_t outlen)
{
  size_t n = 0;
  if (path.len + 1 > outlen)
    return OSR_E2BIG;
  memcpy(out, path.base, path.len);
  n = path.len;
  osr_iovec_t q = query, p;
  int first = 1;
  while (next_param(&q, &p)) {
    if (is_token_param(p) || p.len == 0)
      continue;
    if (n + p.len + 2 > outlen)
      return OSR_E2BIG;
    out[n++] = first ? '?' : '&';
    memcpy(out + n, p.base, p.len);
    n += p.len;
    first = 0;
  }
  out[n] = '\0';
  return (int)n;
}

int osr__dp_endpoint(const char *ep, char *addr, size_t addrlen, int *tls)
{
  size_t skip = 0;
  int is_unix = strncmp(ep, "unix:", 5) == 0;
  *tls = 0;
  if (strncmp(ep, "http://", 7) == 0) {
    skip = 7;
  } else if (strncmp(ep, "https://", 8) == 0) {
    skip = 8;
    *tls = 1;
  }
  /* host:port up to a trailing path (unix paths are taken whole), never
   * into a sealed upstream credential (token.h, OSR_UPSTREAM_FRAG). */
  const char *frag = strstr(ep + skip, OSR_UPSTREAM_FRAG);
  size_t end = frag != NULL ? (size_t)(frag - ep) : strlen(ep);
  size_t n = 0;
  while (skip + n < end && (is_unix || ep[skip + n] != '/'))
    n++;
  if (n == 0 || n + 5 >= addrlen)
    return OSR_EINVAL;
  memcpy(addr, ep + skip, n);
  addr[n] = '\0';
  osr_addr_t a;
  if (osr_addr_parse(addr, &a) != 0) {
    if (!*tls)
      return OSR_EINVAL;
    memcpy(addr + n, ":443", 5); /* https://host without a port */
    if (osr_addr_parse(addr, &a) != 0)
      return OSR_EINVAL;
  }
  return 0;
}
