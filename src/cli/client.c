/*
 * The CLI's side of the gateway API: one blocking request per call on a
 * private libuv loop with the OSR HTTP client (HTTP/1.1, h2c with --h2c,
 * HTTP/2 or HTTP/1.1 over TLS by ALPN), the error conventions every client
 * command shares, and the small output helpers.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "net/http.h"
#include "net/tls.h"
#include "util/mem.h"

/* ========================================================================== */
/* One request                                                                 */

typedef struct xfer_s {
  uv_loop_t loop;
  uv_timer_t timer;
  osr_http_client_t *client;
  osr_http_client_req_t req;
  osr_http_header_t hdrs[6];
  const char *body;
  size_t bodylen;
  int status; /* HTTP status, 0 until the head arrived */
  int err;    /* first failure */
  char *buf;
  size_t len, cap;
} xfer_t;

static void xfer_finish(xfer_t *x)
{
  if (x->client != NULL) {
    /* NULL first: closing fails the request, whose on_body comes back here. */
    osr_http_client_t *c = x->client;
    x->client = NULL;
    osr_http_client_close(c);
  }
  if (!uv_is_closing((uv_handle_t *)&x->timer))
    uv_close((uv_handle_t *)&x->timer, NULL);
}

static void on_timeout(uv_timer_t *t)
{
  xfer_t *x = t->data;
  if (x->err == 0)
    x->err = OSR_ETIMEDOUT;
  xfer_finish(x);
}

static void on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t n,
                        void *data)
{
  xfer_t *x = data;
  (void)r;
  (void)h;
  (void)n;
  x->status = status;
}

static void on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  xfer_t *x = data;
  (void)r;
  if (status == 0) {
    if (x->len + chunk->len + 1 > CLI_MAX_RESPONSE) {
      if (x->err == 0)
        x->err = OSR_ETOOLARGE;
      xfer_finish(x);
      return;
    }
    if (x->len + chunk->len + 1 > x->cap) {
      size_t ncap = x->cap ? x->cap : 4096;
      while (ncap < x->len + chunk->len + 1)
        ncap *= 2;
      char *nb = osr_try_realloc(x->buf, ncap);
      if (nb == NULL) {
        if (x->err == 0)
          x->err = OSR_ENOMEM;
        xfer_finish(x);
        return;
      }
      x->buf = nb;
      x->cap = ncap;
    }
    memcpy(x->buf + x->len, chunk->base, chunk->len);
    x->len += chunk->len;
    return;
  }
  if (status != OSR_EOF && x->err == 0)
    x->err = status;
  xfer_finish(x);
}

static void on_written(osr_http_creq_t *r, int status, void *arg)
{
  /* A failed body write also fails the request: on_body reports it. */
  (void)r;
  (void)status;
  (void)arg;
}

static const osr_http_client_events_t xfer_events = {on_response, on_body};

static void on_connect(osr_http_client_t *c, int status, void *data)
{
  xfer_t *x = data;
  if (status != 0) {
    if (x->err == 0)
      x->err = status;
    xfer_finish(x);
    return;
  }
  if (x->err != 0) { /* timed out meanwhile */
    osr_http_client_close(c);
    return;
  }
  x->client = c;
  osr_http_creq_t *cr;
  int rv = osr_http_client_request(c, &x->req, &xfer_events, x, &cr);
  if (rv != 0) {
    x->err = rv;
    xfer_finish(x);
    return;
  }
  if (x->bodylen > 0) {
    osr_iovec_t iov = osr_iov(x->body, x->bodylen);
    rv = osr_http_creq_write(cr, &iov, 1, 1, on_written, x);
    if (rv != 0) {
      x->err = rv;
      xfer_finish(x);
    }
  }
}

/* "http[s]://host[:port][/prefix]" -> scheme, "host:port", prefix. */
static int parse_url(const char *url, int *tls, char *addr, size_t addrlen, char *prefix,
                     size_t prefixlen)
{
  const char *p;
  if (strncmp(url, "http://", 7) == 0) {
    *tls = 0;
    p = url + 7;
  } else if (strncmp(url, "https://", 8) == 0) {
    *tls = 1;
    p = url + 8;
  } else {
    return OSR_EINVAL;
  }
  size_t hl = strcspn(p, "/?#");
  if (hl == 0 || hl >= addrlen - 8)
    return OSR_EINVAL;
  const char *host_end = p + hl;
  /* A port is present if the authority ends in :digits after any ']'. */
  const char *colon = NULL;
  for (const char *q = host_end; q > p; q--) {
    if (q[-1] == ']')
      break;
    if (q[-1] == ':') {
      colon = q - 1;
      break;
    }
  }
  if (colon != NULL && colon + 1 < host_end)
    snprintf(addr, addrlen, "%.*s", (int)hl, p);
  else
    snprintf(addr, addrlen, "%.*s:%s", (int)(colon != NULL ? (size_t)(colon - p) : hl), p,
             *tls ? "443" : "80");
  snprintf(prefix, prefixlen, "%s", host_end);
  size_t pl = strlen(prefix);
  while (pl > 0 && prefix[pl - 1] == '/')
    prefix[--pl] = '\0';
  return 0;
}

int cli_url_is_local(const char *url)
{
  int tls;
  char addr[300], prefix[8];
  if (parse_url(url, &tls, addr, sizeof(addr), prefix, sizeof(prefix)) != 0)
    return 0;
  return strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]:", 6) == 0 ||
         strncmp(addr, "localhost:", 10) == 0;
}

int cli_http(const cli_t *c, const char *method, const char *target, const char *body,
             size_t bodylen, const char *idem_key, cli_resp_t *r, char *err, size_t errlen)
{
  int tls = 0, rv;
  char addr[300], prefix[1024], path[4096], auth[600];
  osr_tls_ctx_t *ctx = NULL;
  osr_http_client_opts_t opts;
  xfer_t *x;

  memset(r, 0, sizeof(*r));
  if (parse_url(c->url, &tls, addr, sizeof(addr), prefix, sizeof(prefix)) != 0) {
    snprintf(err, errlen, "--url %s: expected http://HOST[:PORT] or https://HOST[:PORT]", c->url);
    return OSR_EINVAL;
  }
  snprintf(path, sizeof(path), "%s%s", prefix, target);

  memset(&opts, 0, sizeof(opts));
  if (tls) {
    static const char *const alpn[] = {"h2", "http/1.1"};
    osr_tls_client_opts_t to;
    memset(&to, 0, sizeof(to));
    to.ca_file = c->ca;
    to.alpn = alpn;
    to.nalpn = 2;
    /* A one-shot command: reading the CA file before the loop runs blocks
     * nothing else. */
    rv = osr_tls_ctx_new_client(&to, &ctx);
    if (rv != 0) {
      snprintf(err, errlen, "TLS setup%s%s: %s", c->ca ? " with --ca " : "", c->ca ? c->ca : "",
               osr_strerror(rv));
      /* A CA file that cannot be read is the caller's mistake, not the
       * gateway's: report it as a usage error. */
      return OSR_EINVAL;
    }
    opts.tls = ctx;
  }
  opts.h2_prior_knowledge = !tls && c->h2c;
  opts.connect_timeout_ms = c->timeout_ms;
  opts.idle_timeout_ms = c->timeout_ms;

  x = osr_xcalloc(1, sizeof(*x));
  uv_loop_init(&x->loop);
  uv_timer_init(&x->loop, &x->timer);
  x->timer.data = x;
  x->body = body;
  x->bodylen = body != NULL ? bodylen : 0;
  size_t nh = 0;
  x->hdrs[nh++] = (osr_http_header_t){OSR_IOV_LIT("accept"), OSR_IOV_LIT("application/json")};
  x->hdrs[nh++] = (osr_http_header_t){OSR_IOV_LIT("user-agent"), OSR_IOV_LIT("osr-cli")};
  if (c->key != NULL) {
    snprintf(auth, sizeof(auth), "Bearer %s", c->key);
    x->hdrs[nh++] = (osr_http_header_t){OSR_IOV_LIT("authorization"), osr_iov(auth, strlen(auth))};
  }
  if (x->bodylen > 0)
    x->hdrs[nh++] =
        (osr_http_header_t){OSR_IOV_LIT("content-type"), OSR_IOV_LIT("application/json")};
  if (idem_key != NULL)
    x->hdrs[nh++] =
        (osr_http_header_t){OSR_IOV_LIT("idempotency-key"), osr_iov(idem_key, strlen(idem_key))};
  x->req.method = method;
  x->req.target = path;
  x->req.headers = x->hdrs;
  x->req.nheaders = nh;
  x->req.content_length = (int64_t)x->bodylen;

  rv = osr_http_client_connect(&x->loop, addr, &opts, on_connect, x);
  if (rv != 0) {
    x->err = rv;
    uv_close((uv_handle_t *)&x->timer, NULL);
  } else {
    uv_timer_start(&x->timer, on_timeout, c->timeout_ms, 0);
  }
  uv_run(&x->loop, UV_RUN_DEFAULT);
  uv_loop_close(&x->loop);
  if (ctx != NULL)
    osr_tls_ctx_unref(ctx);

  rv = x->err;
  if (rv == 0 && x->status == 0)
    rv = OSR_EPROTO;
  if (rv != 0) {
    snprintf(err, errlen, "%s %s: %s", method, c->url, osr_strerror(rv));
    osr_free(x->buf);
  } else {
    r->status = x->status;
    r->body = x->buf != NULL ? x->buf : osr_xstrdup("");
    r->len = x->len;
    r->body[r->len] = '\0';
    if (x->buf == NULL)
      r->len = 0;
    r->json = json_loadb(r->body, r->len, JSON_DECODE_ANY, NULL);
  }
  osr_free(x);
  return rv;
}

void cli_resp_dispose(cli_resp_t *r)
{
  osr_free(r->body);
  json_decref(r->json);
  memset(r, 0, sizeof(*r));
}

int cli_exit_for_status(int status)
{
  if (status >= 200 && status < 300)
    return CLI_OK;
  if (status == 404)
    return CLI_ENOTFOUND;
  if (status == 401 || status == 403)
    return CLI_EAUTH;
  return CLI_EAPI;
}

void cli_print_raw(const cli_resp_t *r)
{
  fwrite(r->body, 1, r->len, stdout);
  if (r->len == 0 || r->body[r->len - 1] != '\n')
    fputc('\n', stdout);
}

/* Details of an error object: everything but code and message, indented. */
static void print_error_details(const json_t *e)
{
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)e, k, v)
  {
    if (strcmp(k, "code") == 0 || strcmp(k, "message") == 0)
      continue;
    /* no_capable_provider: one line per provider with its failed filters. */
    if (strcmp(k, "providers") == 0 && json_is_array(v)) {
      size_t i;
      json_t *p;
      fprintf(stderr, "  providers:\n");
      json_array_foreach(v, i, p)
      {
        char nb[128];
        fprintf(stderr, "    %s:", cli_field(p, "name", nb, sizeof(nb)));
        json_t *fl = json_object_get(p, "filters");
        int any = 0;
        if (json_is_array(fl)) {
          size_t j;
          json_t *f;
          json_array_foreach(fl, j, f)
          {
            if (json_is_false(json_object_get(f, "passed"))) {
              char fb[64], rb[256];
              fprintf(stderr, "%s %s: %s", any ? ";" : "", cli_field(f, "name", fb, sizeof(fb)),
                      cli_field(f, "reason", rb, sizeof(rb)));
              any = 1;
            }
          }
        }
        if (!any) {
          char *s = json_dumps(p, JSON_COMPACT | JSON_SORT_KEYS);
          fprintf(stderr, " %s", s ? s : "");
          osr_json_free(s);
        }
        fputc('\n', stderr);
      }
      continue;
    }
    if (json_is_string(v)) {
      fprintf(stderr, "  %s: %s\n", k, json_string_value(v));
      continue;
    }
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    fprintf(stderr, "  %s:", k);
    if (s != NULL) {
      /* Indent every line of the pretty JSON under the key. */
      fputs("\n    ", stderr);
      for (const char *p = s; *p; p++) {
        fputc(*p, stderr);
        if (*p == '\n')
          fputs("    ", stderr);
      }
      osr_json_free(s);
    }
    fputc('\n', stderr);
  }
}

int cli_call(const cli_t *c, const char *method, const char *target, const json_t *body,
             const char *idem_key, cli_resp_t *r)
{
  char err[512];
  char *b = NULL;
  if (body != NULL) {
    b = json_dumps(body, JSON_COMPACT);
    if (b == NULL) {
      fprintf(stderr, "osr: cannot encode the request\n");
      return CLI_EAPI;
    }
  }
  int rv = cli_http(c, method, target, b, b ? strlen(b) : 0, idem_key, r, err, sizeof(err));
  osr_json_free(b);
  if (rv == OSR_EINVAL) {
    fprintf(stderr, "osr: %s\n", err);
    return CLI_EUSAGE;
  }
  if (rv != 0) {
    fprintf(stderr, "osr: cannot reach the gateway: %s\n", err);
    if (cli_url_is_local(c->url))
      fprintf(stderr,
              "  is it running? start it with `osr serve`, or point --url / OSR_URL at it\n");
    return CLI_EUNREACH;
  }
  int code = cli_exit_for_status(r->status);
  if (code == CLI_OK)
    return CLI_OK;
  if (c->json)
    cli_print_raw(r);
  json_t *e = json_object_get(r->json, "error");
  if (json_is_object(e)) {
    const char *ec = json_string_value(json_object_get(e, "code"));
    const char *em = json_string_value(json_object_get(e, "message"));
    fprintf(stderr, "error %s: %s\n", ec ? ec : "unknown", em ? em : "(no message)");
    print_error_details(e);
  } else {
    fprintf(stderr, "error http_%d: %.200s\n", r->status, r->len ? r->body : "(empty body)");
  }
  cli_resp_dispose(r);
  return code;
}

void cli_resolve_key(cli_t *c)
{
  if (c->key != NULL) {
    c->key_source = "--key";
    return;
  }
  const char *k = getenv("OSR_KEY");
  if (k != NULL && k[0] != '\0') {
    c->key = k;
    c->key_source = "OSR_KEY";
    return;
  }
  if (!cli_url_is_local(c->url))
    return;
  /* The local default: the admin key the gateway generated at first start. */
  char path[4096];
  const char *dd = getenv("OSR_DATA_DIR");
  const char *home = getenv("HOME");
  if (dd != NULL && dd[0] != '\0')
    snprintf(path, sizeof(path), "%s/admin.key", dd);
  else if (home != NULL && home[0] != '\0')
    snprintf(path, sizeof(path), "%s/.local/share/osr/admin.key", home);
  else
    return;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  char buf[512];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0)
    return;
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
    n--;
  buf[n] = '\0';
  if (n == 0)
    return;
  c->key_owned = osr_xstrdup(buf);
  c->key = c->key_owned;
  c->key_source = "admin.key";
}

/* ========================================================================== */
/* Arguments                                                                   */

int cli_opt(int argc, char **argv, int *i, const char *name, const char **val)
{
  const char *a = argv[*i];
  size_t n = strlen(name);
  if (strncmp(a, name, n) != 0)
    return 0;
  if (a[n] == '=') {
    *val = a + n + 1;
    return 1;
  }
  if (a[n] != '\0')
    return 0;
  if (*i + 1 >= argc) {
    fprintf(stderr, "osr: %s needs a value (see --help)\n", name);
    return -1;
  }
  *val = argv[++*i];
  return 1;
}

int cli_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
  char *end;
  if (s == NULL || !isdigit((unsigned char)s[0]))
    return OSR_EINVAL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno != 0 || *end != '\0' || v > max)
    return OSR_EINVAL;
  *out = v;
  return 0;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
  va_list ap;
  fprintf(stderr, "osr %s: ", cmd);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see osr %s --help)\n", cmd);
  return CLI_EUSAGE;
}

void cli_urlencode(const char *s, char *out, size_t outlen)
{
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  for (; *s != '\0' && o + 4 < outlen; s++) {
    unsigned char ch = (unsigned char)*s;
    if (isalnum(ch) || ch == '-' || ch == '_' || ch == '.' || ch == '~') {
      out[o++] = (char)ch;
    } else {
      out[o++] = '%';
      out[o++] = hex[ch >> 4];
      out[o++] = hex[ch & 15];
    }
  }
  out[o] = '\0';
}

/* ========================================================================== */
/* Output                                                                      */

const char *cli_field(const json_t *o, const char *path, char *buf, size_t len)
{
  char key[128];
  const json_t *v = o;
  const char *p = path;
  while (v != NULL && *p != '\0') {
    size_t n = strcspn(p, ".");
    snprintf(key, sizeof(key), "%.*s", (int)n, p);
    v = json_is_object(v) ? json_object_get(v, key) : NULL;
    p += n;
    if (*p == '.')
      p++;
  }
  if (v == NULL || json_is_null(v)) {
    snprintf(buf, len, "-");
  } else if (json_is_string(v)) {
    snprintf(buf, len, "%s", json_string_length(v) ? json_string_value(v) : "-");
  } else if (json_is_integer(v)) {
    snprintf(buf, len, "%lld", (long long)json_integer_value(v));
  } else if (json_is_real(v)) {
    snprintf(buf, len, "%.6g", json_real_value(v));
  } else if (json_is_boolean(v)) {
    snprintf(buf, len, "%s", json_is_true(v) ? "yes" : "no");
  } else if (json_is_array(v)) {
    size_t o2 = 0, i;
    json_t *x;
    buf[0] = '\0';
    json_array_foreach(v, i, x)
    {
      char item[256];
      cli_field(x, "", item, sizeof(item));
      int w = snprintf(buf + o2, len - o2, "%s%s", i ? "," : "", item);
      if (w < 0 || (size_t)w >= len - o2)
        break;
      o2 += (size_t)w;
    }
    if (json_array_size(v) == 0)
      snprintf(buf, len, "-");
  } else { /* object: k=v,k=v */
    size_t o2 = 0;
    const char *k;
    json_t *x;
    int first = 1;
    buf[0] = '\0';
    json_object_foreach((json_t *)v, k, x)
    {
      char item[256];
      cli_field(x, "", item, sizeof(item));
      int w = snprintf(buf + o2, len - o2, "%s%s=%s", first ? "" : ",", k, item);
      if (w < 0 || (size_t)w >= len - o2)
        break;
      o2 += (size_t)w;
      first = 0;
    }
    if (first)
      snprintf(buf, len, "-");
  }
  return buf;
}

void cli_table_init(cli_table_t *t, size_t ncols, const char *const *head)
{
  memset(t, 0, sizeof(*t));
  t->ncols = ncols < CLI_TABLE_COLS ? ncols : CLI_TABLE_COLS;
  for (size_t i = 0; i < t->ncols; i++)
    t->head[i] = head[i];
}

void cli_table_add(cli_table_t *t, const char *const *cells)
{
  if (t->nrows == t->cap) {
    t->cap = t->cap ? t->cap * 2 : 16;
    t->cells = osr_xrealloc(t->cells, t->cap * t->ncols * sizeof(char *));
  }
  for (size_t i = 0; i < t->ncols; i++)
    t->cells[t->nrows * t->ncols + i] = osr_xstrdup(cells[i] != NULL ? cells[i] : "-");
  t->nrows++;
}

void cli_table_print(cli_table_t *t, FILE *f)
{
  size_t w[CLI_TABLE_COLS];
  for (size_t c = 0; c < t->ncols; c++) {
    w[c] = strlen(t->head[c]);
    for (size_t r = 0; r < t->nrows; r++) {
      size_t l = strlen(t->cells[r * t->ncols + c]);
      if (l > w[c])
        w[c] = l;
    }
  }
  for (size_t r = 0; r <= t->nrows; r++) {
    for (size_t c = 0; c < t->ncols; c++) {
      const char *s = r == 0 ? t->head[c] : t->cells[(r - 1) * t->ncols + c];
      if (c + 1 == t->ncols)
        fprintf(f, "%s\n", s);
      else
        fprintf(f, "%-*s  ", (int)w[c], s);
    }
  }
  for (size_t i = 0; i < t->nrows * t->ncols; i++)
    osr_free(t->cells[i]);
  osr_freep(&t->cells);
  t->nrows = t->cap = 0;
}

void cli_kv(FILE *f, int width, const char *label, const char *value)
{
  fprintf(f, "%-*s  %s\n", width, label, value);
}
