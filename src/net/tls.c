/*
 * TLS on osr_sock_t. See tls.h for the contract; this comment explains the
 * mechanics. The same code builds against BoringSSL (OSR_TLS_BORINGSSL) and
 * OpenSSL 3 (OSR_TLS_OPENSSL): only API both share is used, plus two small
 * #ifdefs (record overhead estimate, options one library lacks).
 *
 * One custom BIO per connection serves as both read and write BIO:
 *
 *  - Reading hands the SSL ciphertext straight out of c->raw, starting
 *    `fed` bytes in. Bytes the SSL has taken are removed from raw only when
 *    the SSL holds no decrypted plaintext (SSL_pending() == 0, see settle()).
 *    Plaintext is written into sock->input only while the owner is reading
 *    and never beyond input.max; when the input is full (or the owner
 *    paused) the SSL keeps the rest of the current record, and because that
 *    record's bytes still count in raw, sock.c's osr_sock_read_start() sees
 *    `raw.len != 0` and kicks osr__tls_on_raw() again. Neither library reads
 *    ahead of the record it is working on (OpenSSL's read_ahead stays off),
 *    so nothing can be stranded inside the SSL where sock.c cannot see it.
 *
 *  - Writing appends to c->out; flush_out() hands the whole buffer to
 *    osr__sock_raw_write() as one write (handshake flights, alerts, tickets,
 *    and for osr__tls_write every record of the call together).
 *
 * The read side ends once: the first error or close_notify is returned to
 * sock.c (OSR_EOF for a clean close_notify), later calls return 0 and drop
 * whatever else arrives.
 */
#include "net/tls.h"

#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "util/log.h"
#include "util/mem.h"

#if !defined(OSR_TLS_BORINGSSL) && !defined(OSR_TLS_OPENSSL)
#error "build with -DOSR_TLS_BORINGSSL or -DOSR_TLS_OPENSSL (see meson.build)"
#endif
#if defined(OSR_TLS_BORINGSSL) && !defined(OPENSSL_IS_BORINGSSL)
#error "OSR_TLS_BORINGSSL set but the OpenSSL headers were found first"
#endif

/* Plaintext per TLS record (RFC 8446 5.1). */
#define TLS_RECORD_MAX 16384
/* ALPN protocol names and host names are at most 255 bytes on the wire. */
#define NAME_MAX_LEN 255

struct osr_tls_ctx_s {
  SSL_CTX *ssl;
  int refs; /* atomic */
  int is_server;
  int insecure; /* client: insecure_skip_verify */
  /* ALPN list: NUL-terminated copies (returned by osr__tls_alpn) and the
   * wire form (length-prefixed, for SSL_CTX_set_alpn_protos / selection). */
  char **alpn;
  size_t nalpn;
  unsigned char *alpn_wire;
  size_t alpn_wire_len;
};

typedef struct out_buf_s {
  char *base;
  size_t len;
  size_t cap;
} out_buf_t;

struct osr_tls_conn_s {
  SSL *ssl;
  osr_sock_t *sock;
  osr_tls_ctx_t *ctx; /* one reference */
  /* Ciphertext read and not yet decrypted. Lives here rather than in the
   * socket so that a cleartext socket does not carry it; sock.c fills it
   * (on_alloc) and gives its memory back (pooled blocks) before
   * osr__tls_free(). */
  osr_buf_t raw;
  size_t fed;         /* bytes at the front of raw the SSL already took */
  out_buf_t out;      /* ciphertext produced and not yet written */
  const char *alpn;   /* negotiated, points into ctx->alpn */
  char *sni;          /* server: the client's SNI */
  unsigned is_server : 1;
  unsigned established : 1;
  unsigned read_done : 1;  /* EOF or error already returned */
  unsigned fatal : 1;      /* the SSL object is unusable */
  unsigned sent_close : 1; /* close_notify queued */
  unsigned nomem : 1;      /* the write BIO could not grow */
};

/* ---- errors and logging ------------------------------------------------ */

/* Drain the thread's error queue, logging every entry at debug level, and
 * report whether a certificate verification failure was among them. */
static int drain_errors(const char *what, const void *who)
{
  unsigned long e;
  int cert = 0;
  char buf[256];

  while ((e = ERR_get_error()) != 0) {
    if (ERR_GET_LIB(e) == ERR_LIB_SSL && ERR_GET_REASON(e) == SSL_R_CERTIFICATE_VERIFY_FAILED)
      cert = 1;
    if (osr__log_level <= OSR_LOG_DEBUG) {
      ERR_error_string_n(e, buf, sizeof(buf));
      OSR_LOG_DEBUG("tls", "%p %s: %s", who, what, buf);
    }
  }
  return cert;
}

/* -errno of fopen(path) or 0: distinguishes a missing/unreadable file
 * (-ENOENT, -EACCES) from a file the TLS library cannot parse (OSR_ETLS). */
static int check_readable(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return errno != 0 ? -errno : OSR_ENOENT;
  fclose(f);
  return 0;
}

/* ---- contexts ------------------------------------------------------------- */

static void ctx_free(osr_tls_ctx_t *ctx)
{
  if (ctx->ssl != NULL)
    SSL_CTX_free(ctx->ssl);
  for (size_t i = 0; i < ctx->nalpn; i++)
    osr_free(ctx->alpn[i]);
  osr_free(ctx->alpn);
  osr_free(ctx->alpn_wire);
  osr_free(ctx);
}

void osr_tls_ctx_ref(osr_tls_ctx_t *ctx)
{
  __atomic_add_fetch(&ctx->refs, 1, __ATOMIC_RELAXED);
}

void osr_tls_ctx_unref(osr_tls_ctx_t *ctx)
{
  if (ctx != NULL && __atomic_sub_fetch(&ctx->refs, 1, __ATOMIC_ACQ_REL) == 0)
    ctx_free(ctx);
}

static int check_alpn(const char *const *alpn, size_t nalpn)
{
  if (nalpn != 0 && alpn == NULL)
    return OSR_EINVAL;
  for (size_t i = 0; i < nalpn; i++) {
    if (alpn[i] == NULL || alpn[i][0] == '\0' || strlen(alpn[i]) > NAME_MAX_LEN)
      return OSR_EINVAL;
  }
  return 0;
}

static int set_alpn(osr_tls_ctx_t *ctx, const char *const *alpn, size_t nalpn)
{
  size_t wire = 0;
  int rv = check_alpn(alpn, nalpn);
  if (rv != 0)
    return rv;
  if (nalpn == 0)
    return 0;
  ctx->alpn = osr_xcalloc(nalpn, sizeof(char *));
  for (size_t i = 0; i < nalpn; i++) {
    ctx->alpn[i] = osr_xstrdup(alpn[i]);
    ctx->nalpn++;
    wire += 1 + strlen(alpn[i]);
  }
  if (wire > 65535)
    return OSR_EINVAL;
  ctx->alpn_wire = osr_xmalloc(wire);
  ctx->alpn_wire_len = wire;
  unsigned char *p = ctx->alpn_wire;
  for (size_t i = 0; i < nalpn; i++) {
    size_t n = strlen(alpn[i]);
    *p++ = (unsigned char)n;
    memcpy(p, alpn[i], n);
    p += n;
  }
  return 0;
}

/* Server: the first protocol of the server's list that the client offers. */
static int on_alpn_select(SSL *ssl, const unsigned char **out, unsigned char *outlen,
                          const unsigned char *in, unsigned int inlen, void *arg)
{
  const osr_tls_ctx_t *ctx = arg;
  (void)ssl;

  for (size_t i = 0; i < ctx->alpn_wire_len; i += 1 + ctx->alpn_wire[i]) {
    const unsigned char *want = ctx->alpn_wire + i + 1;
    unsigned int wlen = ctx->alpn_wire[i];
    for (unsigned int j = 0; j < inlen;) {
      unsigned int l = in[j];
      if (l == 0 || l > inlen - j - 1)
        break; /* malformed; the library has validated it already */
      if (l == wlen && memcmp(in + j + 1, want, l) == 0) {
        *out = in + j + 1;
        *outlen = (unsigned char)l;
        return SSL_TLSEXT_ERR_OK;
      }
      j += 1 + l;
    }
  }
  /* No overlap: continue without ALPN; the owner sees osr_sock_alpn() NULL. */
  return SSL_TLSEXT_ERR_NOACK;
}

/* Server: record the SNI host name (one certificate per context for now, so
 * there is nothing to select). */
static int on_servername(SSL *ssl, int *alert, void *arg)
{
  osr_tls_conn_t *c = SSL_get_app_data(ssl);
  const char *name = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  (void)alert;
  (void)arg;

  if (c != NULL && name != NULL && c->sni == NULL) {
    size_t n = strnlen(name, NAME_MAX_LEN + 1);
    if (n > NAME_MAX_LEN)
      return SSL_TLSEXT_ERR_ALERT_FATAL; /* the libraries refuse these first */
    c->sni = osr_xstrndup(name, n);
  }
  return SSL_TLSEXT_ERR_OK;
}

static SSL_CTX *ctx_base(int is_server)
{
  SSL_CTX *ssl = SSL_CTX_new(TLS_method());
  if (ssl == NULL)
    return NULL;
  if (!SSL_CTX_set_min_proto_version(ssl, TLS1_2_VERSION)) {
    SSL_CTX_free(ssl);
    return NULL;
  }
  /* BoringSSL never renegotiates and never compresses; these are 0 there. */
  SSL_CTX_set_options(ssl, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION |
                               (is_server ? SSL_OP_CIPHER_SERVER_PREFERENCE : 0));
  /* Free the record buffers of idle connections (OpenSSL; BoringSSL always does). */
  SSL_CTX_set_mode(ssl, SSL_MODE_RELEASE_BUFFERS);
  return ssl;
}

static int load_cert_key(osr_tls_ctx_t *ctx, const char *cert_file, const char *key_file)
{
  int rv;
  if ((rv = check_readable(cert_file)) != 0 || (rv = check_readable(key_file)) != 0)
    return rv;
  if (SSL_CTX_use_certificate_chain_file(ctx->ssl, cert_file) != 1) {
    drain_errors(cert_file, ctx);
    return OSR_ETLS;
  }
  if (SSL_CTX_use_PrivateKey_file(ctx->ssl, key_file, SSL_FILETYPE_PEM) != 1) {
    drain_errors(key_file, ctx);
    return OSR_ETLS;
  }
  if (SSL_CTX_check_private_key(ctx->ssl) != 1) {
    drain_errors("key does not match certificate", ctx);
    return OSR_ETLS;
  }
  return 0;
}

int osr_tls_ctx_new_server(const osr_tls_server_opts_t *opts, osr_tls_ctx_t **out)
{
  int rv;
  if (opts == NULL || opts->cert_file == NULL || opts->key_file == NULL || out == NULL)
    return OSR_EINVAL;
  if ((rv = check_alpn(opts->alpn, opts->nalpn)) != 0)
    return rv;

  ERR_clear_error();
  osr_tls_ctx_t *ctx = osr_xcalloc(1, sizeof(*ctx));
  ctx->refs = 1;
  ctx->is_server = 1;
  ctx->ssl = ctx_base(1);
  if (ctx->ssl == NULL) {
    drain_errors("SSL_CTX_new", ctx);
    ctx_free(ctx);
    return OSR_ETLS;
  }
  if ((rv = set_alpn(ctx, opts->alpn, opts->nalpn)) != 0 ||
      (rv = load_cert_key(ctx, opts->cert_file, opts->key_file)) != 0) {
    OSR_LOG_DEBUG("tls", "server context (%s, %s): %s", opts->cert_file, opts->key_file,
                  osr_strerror(rv));
    ctx_free(ctx);
    ERR_clear_error();
    return rv;
  }
  static const unsigned char sid_ctx[] = "osr";
  SSL_CTX_set_session_id_context(ctx->ssl, sid_ctx, sizeof(sid_ctx) - 1);
  if (ctx->nalpn != 0)
    SSL_CTX_set_alpn_select_cb(ctx->ssl, on_alpn_select, ctx);
  SSL_CTX_set_tlsext_servername_callback(ctx->ssl, on_servername);
  ERR_clear_error();
  *out = ctx;
  return 0;
}

/* The system trust store. SSL_CTX_set_default_verify_paths() honours
 * SSL_CERT_FILE / SSL_CERT_DIR; the Debian bundle is loaded explicitly as
 * well when the library's default file is absent, so that verification
 * rarely has to open files in the hashed directory on the loop thread. */
static int load_system_store(SSL_CTX *ssl)
{
  static const char *const bundles[] = {
      "/etc/ssl/certs/ca-certificates.crt", /* Debian, Ubuntu */
      "/etc/pki/tls/certs/ca-bundle.crt",   /* Fedora, RHEL */
  };
  if (SSL_CTX_set_default_verify_paths(ssl) != 1)
    return OSR_ETLS;
  const char *env = getenv(X509_get_default_cert_file_env());
  if (env != NULL && env[0] != '\0')
    return 0;
  if (check_readable(X509_get_default_cert_file()) == 0)
    return 0;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(bundles); i++) {
    if (check_readable(bundles[i]) == 0) {
      if (SSL_CTX_load_verify_locations(ssl, bundles[i], NULL) != 1)
        return OSR_ETLS;
      break;
    }
  }
  return 0;
}

int osr_tls_ctx_new_client(const osr_tls_client_opts_t *opts, osr_tls_ctx_t **out)
{
  osr_tls_client_opts_t none;
  int rv;
  if (out == NULL)
    return OSR_EINVAL;
  if (opts == NULL) {
    memset(&none, 0, sizeof(none));
    opts = &none;
  }
  if ((opts->cert_file == NULL) != (opts->key_file == NULL))
    return OSR_EINVAL;
  if ((rv = check_alpn(opts->alpn, opts->nalpn)) != 0)
    return rv;

  ERR_clear_error();
  osr_tls_ctx_t *ctx = osr_xcalloc(1, sizeof(*ctx));
  ctx->refs = 1;
  ctx->insecure = opts->insecure_skip_verify != 0;
  ctx->ssl = ctx_base(0);
  if (ctx->ssl == NULL) {
    drain_errors("SSL_CTX_new", ctx);
    ctx_free(ctx);
    return OSR_ETLS;
  }
  rv = set_alpn(ctx, opts->alpn, opts->nalpn);
  if (rv == 0 && ctx->nalpn != 0 &&
      SSL_CTX_set_alpn_protos(ctx->ssl, ctx->alpn_wire, (unsigned)ctx->alpn_wire_len) != 0)
    rv = OSR_ETLS; /* note: 0 is success for this one */
  if (rv == 0 && ctx->insecure) {
    SSL_CTX_set_verify(ctx->ssl, SSL_VERIFY_NONE, NULL);
  } else if (rv == 0) {
    SSL_CTX_set_verify(ctx->ssl, SSL_VERIFY_PEER, NULL);
    if (opts->ca_file != NULL) {
      rv = check_readable(opts->ca_file);
      if (rv == 0 && SSL_CTX_load_verify_locations(ctx->ssl, opts->ca_file, NULL) != 1) {
        drain_errors(opts->ca_file, ctx);
        rv = OSR_ETLS;
      }
    } else {
      rv = load_system_store(ctx->ssl);
      if (rv != 0)
        drain_errors("system trust store", ctx);
    }
  }
  if (rv == 0 && opts->cert_file != NULL)
    rv = load_cert_key(ctx, opts->cert_file, opts->key_file);
  if (rv != 0) {
    OSR_LOG_DEBUG("tls", "client context: %s", osr_strerror(rv));
    ctx_free(ctx);
    ERR_clear_error();
    return rv;
  }
  ERR_clear_error();
  *out = ctx;
  return 0;
}

/* ---- loading on the thread pool ------------------------------------------ */

typedef struct load_job_s {
  uv_work_t req;
  int is_server;
  osr_tls_server_opts_t sopts;
  osr_tls_client_opts_t copts;
  char *cert_file;
  char *key_file;
  char *ca_file;
  char **alpn;
  size_t nalpn;
  osr_tls_ctx_t *ctx;
  int status;
  osr_tls_ctx_cb cb;
  void *data;
} load_job_t;

static char *dup_or_null(const char *s)
{
  return s != NULL ? osr_xstrdup(s) : NULL;
}

static void job_free(load_job_t *job)
{
  osr_free(job->cert_file);
  osr_free(job->key_file);
  osr_free(job->ca_file);
  for (size_t i = 0; i < job->nalpn; i++)
    osr_free(job->alpn[i]);
  osr_free(job->alpn);
  osr_free(job);
}

static load_job_t *job_new(const char *cert, const char *key, const char *const *alpn, size_t nalpn,
                           osr_tls_ctx_cb cb, void *data)
{
  load_job_t *job = osr_xcalloc(1, sizeof(*job));
  job->cert_file = dup_or_null(cert);
  job->key_file = dup_or_null(key);
  if (nalpn != 0) {
    job->alpn = osr_xcalloc(nalpn, sizeof(char *));
    for (size_t i = 0; i < nalpn; i++)
      job->alpn[i] = osr_xstrdup(alpn[i]);
    job->nalpn = nalpn;
  }
  job->cb = cb;
  job->data = data;
  return job;
}

static void load_work(uv_work_t *req)
{
  load_job_t *job = osr_container_of(req, load_job_t, req);
  if (job->is_server)
    job->status = osr_tls_ctx_new_server(&job->sopts, &job->ctx);
  else
    job->status = osr_tls_ctx_new_client(&job->copts, &job->ctx);
  ERR_clear_error(); /* the pool thread's queue stays empty */
}

static void load_done(uv_work_t *req, int status)
{
  load_job_t *job = osr_container_of(req, load_job_t, req);
  if (status != 0) { /* canceled before it ran */
    job->status = status == UV_ECANCELED ? OSR_ECANCELED : status;
    job->ctx = NULL;
  }
  job->cb(job->status == 0 ? job->ctx : NULL, job->status, job->data);
  job_free(job);
}

int osr_tls_ctx_load_server(uv_loop_t *loop, const osr_tls_server_opts_t *opts, osr_tls_ctx_cb cb,
                            void *data)
{
  int rv;
  if (loop == NULL || cb == NULL || opts == NULL || opts->cert_file == NULL ||
      opts->key_file == NULL)
    return OSR_EINVAL;
  if ((rv = check_alpn(opts->alpn, opts->nalpn)) != 0)
    return rv;
  load_job_t *job = job_new(opts->cert_file, opts->key_file, opts->alpn, opts->nalpn, cb, data);
  job->is_server = 1;
  job->sopts.cert_file = job->cert_file;
  job->sopts.key_file = job->key_file;
  job->sopts.alpn = (const char *const *)job->alpn;
  job->sopts.nalpn = job->nalpn;
  rv = uv_queue_work(loop, &job->req, load_work, load_done);
  if (rv != 0)
    job_free(job);
  return rv;
}

int osr_tls_ctx_load_client(uv_loop_t *loop, const osr_tls_client_opts_t *opts, osr_tls_ctx_cb cb,
                            void *data)
{
  osr_tls_client_opts_t none;
  int rv;
  if (loop == NULL || cb == NULL)
    return OSR_EINVAL;
  if (opts == NULL) {
    memset(&none, 0, sizeof(none));
    opts = &none;
  }
  if ((opts->cert_file == NULL) != (opts->key_file == NULL))
    return OSR_EINVAL;
  if ((rv = check_alpn(opts->alpn, opts->nalpn)) != 0)
    return rv;
  load_job_t *job = job_new(opts->cert_file, opts->key_file, opts->alpn, opts->nalpn, cb, data);
  job->ca_file = dup_or_null(opts->ca_file);
  job->copts.ca_file = job->ca_file;
  job->copts.insecure_skip_verify = opts->insecure_skip_verify;
  job->copts.cert_file = job->cert_file;
  job->copts.key_file = job->key_file;
  job->copts.alpn = (const char *const *)job->alpn;
  job->copts.nalpn = job->nalpn;
  rv = uv_queue_work(loop, &job->req, load_work, load_done);
  if (rv != 0)
    job_free(job);
  return rv;
}

/* ---- the BIO between the SSL and the socket ------------------------------ */

static int out_reserve(out_buf_t *o, size_t need)
{
  if (o->cap - o->len >= need)
    return 0;
  if (need > SIZE_MAX - o->len)
    return OSR_ENOMEM;
  size_t want = o->len + need;
  if (o->cap != 0 && want < o->cap + o->cap / 2 && o->cap + o->cap / 2 > o->cap)
    want = o->cap + o->cap / 2; /* growing an existing buffer: amortise */
  char *p = osr_try_realloc(o->base, want);
  if (p == NULL)
    return OSR_ENOMEM;
  o->base = p;
  o->cap = want;
  return 0;
}

static int bio_read(BIO *b, char *buf, int len)
{
  osr_tls_conn_t *c = BIO_get_data(b);
  osr_buf_t *raw = &c->raw;
  size_t avail = raw->len - c->fed;

  BIO_clear_retry_flags(b);
  if (len <= 0)
    return 0;
  if (avail == 0) {
    BIO_set_retry_read(b);
    return -1;
  }
  size_t n = avail < (size_t)len ? avail : (size_t)len;
  memcpy(buf, osr_buf_data(raw) + c->fed, n);
  c->fed += n;
  return (int)n;
}

static int bio_write(BIO *b, const char *buf, int len)
{
  osr_tls_conn_t *c = BIO_get_data(b);

  BIO_clear_retry_flags(b);
  if (len <= 0)
    return 0;
  if (out_reserve(&c->out, (size_t)len) != 0) {
    c->nomem = 1;
    return -1;
  }
  memcpy(c->out.base + c->out.len, buf, (size_t)len);
  c->out.len += (size_t)len;
  return len;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
  (void)b;
  (void)num;
  (void)ptr;
  /* The SSL flushes after each flight; everything else is unsupported. */
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

static BIO_METHOD *bio_method;
static pthread_once_t bio_once = PTHREAD_ONCE_INIT;

static void bio_method_init(void)
{
  BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "osr_sock");
  if (m == NULL)
    return;
  if (!BIO_meth_set_read(m, bio_read) || !BIO_meth_set_write(m, bio_write) ||
      !BIO_meth_set_ctrl(m, bio_ctrl)) {
    BIO_meth_free(m);
    return;
  }
  bio_method = m; /* lives for the process */
}

/* ---- connections ----------------------------------------------------------- */

/* Release the ciphertext the SSL has consumed, unless the SSL still holds
 * decrypted bytes of it (see the file comment). */
static void settle(osr_sock_t *s, osr_tls_conn_t *c)
{
  if (c->fed != 0 && SSL_pending(c->ssl) == 0) {
    osr_buf_consume(&c->raw, c->fed);
    c->fed = 0;
  }
}

/* After the read side ended: drop the rest of the ciphertext. */
static void discard_raw(osr_sock_t *s, osr_tls_conn_t *c)
{
  osr_buf_consume(&c->raw, c->raw.len);
  c->fed = 0;
}

typedef struct tls_write_s {
  char *buf;
  osr_sock_write_cb cb;
  void *arg;
} tls_write_t;

static void on_raw_written(osr_sock_t *s, int status, void *arg)
{
  tls_write_t *w = arg;
  osr_sock_write_cb cb = w->cb;
  void *cbarg = w->arg;
  osr_free(w->buf);
  osr_free(w);
  if (cb != NULL)
    cb(s, status, cbarg);
}

/* Write everything in c->out as one raw write; cb (optional) fires when it
 * is written (or fails). With cb set an empty buffer is still written, so the
 * callback is asynchronous as osr_sock_write promises. */
static int flush_out(osr_sock_t *s, osr_tls_conn_t *c, osr_sock_write_cb cb, void *arg)
{
  if (c->out.len == 0 && cb == NULL)
    return 0;
  tls_write_t *w = osr_xmalloc(sizeof(*w));
  w->buf = c->out.base;
  w->cb = cb;
  w->arg = arg;
  osr_iovec_t iov = osr_iov(c->out.base, c->out.len);
  c->out.base = NULL;
  c->out.len = c->out.cap = 0;
  int rv = osr__sock_raw_write(s, &iov, 1, on_raw_written, w);
  if (rv != 0) {
    osr_free(w->buf);
    osr_free(w);
  }
  return rv;
}

static int ssl_failure(osr_sock_t *s, osr_tls_conn_t *c, int r, const char *what)
{
  int e = SSL_get_error(c->ssl, r);
  int cert = drain_errors(what, s);
  c->fatal = 1;
  if (c->nomem)
    return OSR_ENOMEM;
  if (cert) {
    long vr = SSL_get_verify_result(c->ssl);
    OSR_LOG_DEBUG("tls", "%p certificate verification failed: %s", (void *)s,
                  X509_verify_cert_error_string(vr));
    return OSR_ECERT;
  }
  OSR_LOG_DEBUG("tls", "%p %s failed (SSL_get_error %d)", (void *)s, what, e);
  return OSR_ETLS;
}

static void record_alpn(osr_tls_conn_t *c)
{
  const unsigned char *p = NULL;
  unsigned int n = 0;
  SSL_get0_alpn_selected(c->ssl, &p, &n);
  c->alpn = NULL;
  for (size_t i = 0; p != NULL && i < c->ctx->nalpn; i++) {
    if (strlen(c->ctx->alpn[i]) == n && memcmp(c->ctx->alpn[i], p, n) == 0) {
      c->alpn = c->ctx->alpn[i];
      break;
    }
  }
}

/* Run the handshake as far as the ciphertext allows. Returns 0 (done or
 * waiting for more) or an error; output is flushed either way. */
static int handshake(osr_sock_t *s, osr_tls_conn_t *c)
{
  int rv = 0;
  ERR_clear_error();
  int r = SSL_do_handshake(c->ssl);
  if (r == 1) {
    c->established = 1;
    record_alpn(c);
    OSR_LOG_DEBUG("tls", "%p handshake done: %s %s alpn=%s sni=%s", (void *)s,
                  SSL_get_version(c->ssl), SSL_CIPHER_get_name(SSL_get_current_cipher(c->ssl)),
                  c->alpn != NULL ? c->alpn : "-", c->sni != NULL ? c->sni : "-");
  } else if (SSL_get_error(c->ssl, r) != SSL_ERROR_WANT_READ) {
    rv = ssl_failure(s, c, r, "handshake");
  }
  ERR_clear_error();
  /* Send the next flight, or the alert that explains a failure. */
  int fr = flush_out(s, c, NULL, NULL);
  if (rv == 0 && fr != 0) {
    OSR_LOG_DEBUG("tls", "%p handshake write: %s", (void *)s, osr_strerror(fr));
    rv = fr;
  }
  return rv;
}

int osr__tls_start(osr_sock_t *s, osr_tls_ctx_t *ctx, int is_server, const char *sni)
{
  char name[NAME_MAX_LEN + 1];
  int rv = 0;

  if (s == NULL || ctx == NULL || s->_tls != NULL || (is_server != 0) != (ctx->is_server != 0))
    return OSR_EINVAL;
  pthread_once(&bio_once, bio_method_init);
  if (bio_method == NULL) {
    drain_errors("BIO_meth_new", s);
    return OSR_ETLS;
  }

  /* Client: the name to send and verify, without [] or a trailing dot. */
  name[0] = '\0';
  int is_ip = 0;
  if (!is_server && sni != NULL) {
    size_t n = strlen(sni);
    if (n >= 2 && sni[0] == '[' && sni[n - 1] == ']') {
      sni++;
      n -= 2;
    }
    if (n > 1 && sni[n - 1] == '.')
      n--;
    if (n > NAME_MAX_LEN)
      return OSR_EINVAL;
    memcpy(name, sni, n);
    name[n] = '\0';
    unsigned char a[16];
    is_ip = inet_pton(AF_INET, name, a) == 1 || inet_pton(AF_INET6, name, a) == 1;
  }
  if (!is_server && !ctx->insecure && name[0] == '\0') {
    OSR_LOG_DEBUG("tls", "%p no server name to verify the certificate against", (void *)s);
    return OSR_EINVAL;
  }

  ERR_clear_error();
  osr_tls_conn_t *c = osr_xcalloc(1, sizeof(*c));
  c->sock = s;
  c->ctx = ctx;
  /* TLS records are at most ~16 KiB; keep a few of them. */
  osr_buf_init(&c->raw, 256 * 1024);
  c->is_server = is_server != 0;
  osr_tls_ctx_ref(ctx);
  c->ssl = SSL_new(ctx->ssl);
  BIO *bio = c->ssl != NULL ? BIO_new(bio_method) : NULL;
  if (bio == NULL) {
    drain_errors("SSL_new", s);
    osr__tls_free(c);
    return OSR_ETLS;
  }
  BIO_set_data(bio, c);
  BIO_set_init(bio, 1);
  SSL_set_bio(c->ssl, bio, bio); /* one reference, owned by the SSL */
  SSL_set_app_data(c->ssl, c);

  if (is_server) {
    SSL_set_accept_state(c->ssl);
  } else {
    SSL_set_connect_state(c->ssl);
    if (name[0] != '\0' && !is_ip && SSL_set_tlsext_host_name(c->ssl, name) != 1)
      rv = OSR_ETLS;
    if (rv == 0 && !ctx->insecure) {
      X509_VERIFY_PARAM *param = SSL_get0_param(c->ssl);
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      if ((is_ip ? X509_VERIFY_PARAM_set1_ip_asc(param, name)
                 : X509_VERIFY_PARAM_set1_host(param, name, strlen(name))) != 1)
        rv = OSR_ETLS;
    }
    if (rv != 0) {
      drain_errors("server name", s);
      OSR_LOG_DEBUG("tls", "%p cannot use server name '%s'", (void *)s, name);
    }
  }
  if (rv == 0) {
    s->_tls = c;
    if (!is_server)
      rv = handshake(s, c); /* sends the ClientHello */
  }
  if (rv != 0) {
    OSR_LOG_DEBUG("tls", "%p start: %s", (void *)s, osr_strerror(rv));
    s->_tls = NULL;
    osr__tls_free(c);
    return rv;
  }
  return 0;
}

/* Decrypt into s->input while the owner reads and there is room. */
static int read_records(osr_sock_t *s, osr_tls_conn_t *c)
{
  for (;;) {
    size_t added = 0;
    int rv = 0;

    while ((s->_flags & (OSR_SOCK_F_READING | OSR_SOCK_F_CLOSING)) == OSR_SOCK_F_READING) {
      if (s->input.len >= s->input.max)
        break; /* full: the rest waits in raw / the SSL, see settle() */
      size_t room = s->input.max - s->input.len;
      osr_iovec_t tail;
      osr__sock_buf_adopt(&s->input);
      rv = osr_buf_reserve(&s->input, room < TLS_RECORD_MAX ? room : TLS_RECORD_MAX, &tail);
      if (rv != 0)
        break;
      size_t want = tail.len < room ? tail.len : room;
      if (want > INT_MAX)
        want = INT_MAX;
      ERR_clear_error();
      int n = SSL_read(c->ssl, tail.base, (int)want);
      if (n > 0) {
        osr_buf_commit(&s->input, (size_t)n);
        added += (size_t)n;
        continue;
      }
      int e = SSL_get_error(c->ssl, n);
      if (e == SSL_ERROR_WANT_READ)
        break;
      if (e == SSL_ERROR_ZERO_RETURN) {
        OSR_LOG_DEBUG("tls", "%p close_notify received", (void *)s);
        rv = OSR_EOF;
      } else {
        rv = ssl_failure(s, c, n, "read");
      }
      break;
    }
    ERR_clear_error();
    /* Alerts, KeyUpdate replies. After our own shutdown they are dropped. */
    int fr = flush_out(s, c, NULL, NULL);
    if (fr != 0 && !(s->_flags & OSR_SOCK_F_SHUT) && rv == 0)
      rv = fr;
    if (c->nomem && rv == 0)
      rv = OSR_ENOMEM;
    settle(s, c);
    if (added != 0)
      osr__sock_deliver(s, 0);
    if (rv != 0) {
      c->read_done = 1;
      discard_raw(s, c);
      return rv;
    }
    /* Stop when nothing new came or the owner paused or closed; otherwise
     * the owner may have made room, so go again. */
    if (added == 0 || (s->_flags & (OSR_SOCK_F_READING | OSR_SOCK_F_CLOSING)) != OSR_SOCK_F_READING)
      return 0;
  }
}

int osr__tls_on_raw(osr_sock_t *s)
{
  osr_tls_conn_t *c = s->_tls;

  if (c == NULL)
    return 0;
  if (c->read_done) {
    discard_raw(s, c);
    return 0;
  }
  if (c->fatal) { /* a write failed: report it on the read side once */
    c->read_done = 1;
    discard_raw(s, c);
    return OSR_ETLS; /* sock.c ends the read side */
  }
  if (!c->established) {
    int rv = handshake(s, c);
    if (rv != 0) {
      c->read_done = 1;
      discard_raw(s, c);
      return rv;
    }
    settle(s, c);
    if (c->established)
      osr__sock_handshake_done(s, 0);
    /* Records that followed the handshake stay in raw: the new owner's
     * osr_sock_read_start() kicks us for them. */
    return 0;
  }
  /* On error sock.c stops reading and reports it to the owner once. */
  return read_records(s, c);
}

/* Encrypt one run of plaintext; whole records go straight from the caller's
 * buffer. */
static int seal(osr_tls_conn_t *c, const char *p, size_t n)
{
  while (n > 0) {
    int k = n > (size_t)1 << 30 ? 1 << 30 : (int)n;
    int r = SSL_write(c->ssl, p, k);
    if (r <= 0)
      return r;
    p += r;
    n -= (size_t)r;
  }
  return 1;
}

static size_t record_overhead(const SSL *ssl)
{
#if defined(OSR_TLS_BORINGSSL)
  return SSL_max_seal_overhead(ssl);
#else
  /* TLS 1.3 and 1.2 AEAD: header + type/nonce + tag <= 29; CBC suites carry
   * an IV, a MAC of up to 48 bytes and padding of up to 256. */
  const SSL_CIPHER *cipher = SSL_get_current_cipher(ssl);
  return cipher != NULL && SSL_CIPHER_is_aead(cipher) ? 32 : 5 + 16 + 48 + 256;
#endif
}

int osr__tls_write(osr_sock_t *s, const osr_iovec_t *bufs, size_t nbufs, osr_sock_write_cb cb,
                   void *arg)
{
  osr_tls_conn_t *c = s->_tls;
  char stage[TLS_RECORD_MAX];
  size_t staged = 0;
  size_t total = 0;

  if (c == NULL || !c->established || c->fatal)
    return OSR_ETLS;
  if (c->sent_close)
    return OSR_ECLOSED;
  if (nbufs != 0 && bufs == NULL)
    return OSR_EINVAL;
  for (size_t i = 0; i < nbufs; i++) {
    if (bufs[i].len > SIZE_MAX - total)
      return OSR_EINVAL;
    total += bufs[i].len;
  }
  /* One allocation for the whole write, sized for the records it becomes.
   * Anything already in c->out (never, in practice) goes first. */
  size_t records = total / TLS_RECORD_MAX + 2;
  size_t overhead = record_overhead(c->ssl);
  if (records > (SIZE_MAX - total) / (overhead + 1) ||
      out_reserve(&c->out, total + records * overhead) != 0)
    return OSR_ENOMEM;

  ERR_clear_error();
  int r = 1;
  /* Coalesce small iovecs into full records; never a record per iovec. */
  for (size_t i = 0; i < nbufs && r > 0; i++) {
    const char *p = bufs[i].base;
    size_t n = bufs[i].len;
    while (n > 0 && r > 0) {
      if (staged == 0 && n >= TLS_RECORD_MAX) {
        size_t whole = n - n % TLS_RECORD_MAX;
        r = seal(c, p, whole);
        p += whole;
        n -= whole;
        continue;
      }
      size_t k = TLS_RECORD_MAX - staged < n ? TLS_RECORD_MAX - staged : n;
      memcpy(stage + staged, p, k);
      staged += k;
      p += k;
      n -= k;
      if (staged == TLS_RECORD_MAX) {
        r = seal(c, stage, staged);
        staged = 0;
      }
    }
  }
  if (r > 0 && staged != 0)
    r = seal(c, stage, staged);
  if (r <= 0) {
    /* The record sequence is broken: nothing more can be sent. */
    int rv = ssl_failure(s, c, r, "write");
    osr_free(c->out.base);
    c->out.base = NULL;
    c->out.len = c->out.cap = 0;
    return rv == OSR_ECERT ? OSR_ETLS : rv;
  }
  int rv = flush_out(s, c, cb, arg);
  if (rv != 0)
    c->fatal = 1; /* records were sealed but not sent */
  return rv;
}

int osr__tls_shutdown(osr_sock_t *s, osr_sock_write_cb cb, void *arg)
{
  osr_tls_conn_t *c = s->_tls;

  if (c == NULL || !c->established || c->fatal)
    return OSR_ETLS;
  if (c->sent_close)
    return OSR_ECLOSED;
  ERR_clear_error();
  int r = SSL_shutdown(c->ssl); /* 0: sent; 1: the peer's came first */
  if (r < 0 && c->out.len == 0) {
    drain_errors("shutdown", s);
    return OSR_ETLS;
  }
  ERR_clear_error();
  c->sent_close = 1;
  return flush_out(s, c, cb, arg);
}

void osr__tls_free(osr_tls_conn_t *c)
{
  if (c == NULL)
    return;
  if (c->ssl != NULL)
    SSL_free(c->ssl); /* frees the BIO */
  osr_free(c->out.base);
  osr_free(c->sni);
  osr_tls_ctx_unref(c->ctx);
  osr_free(c);
}

osr_buf_t *osr__tls_raw(osr_tls_conn_t *c)
{
  return &c->raw;
}

const char *osr__tls_alpn(const osr_tls_conn_t *c)
{
  return c != NULL && c->established ? c->alpn : NULL;
}

const char *osr__tls_sni(const osr_tls_conn_t *c)
{
  return c != NULL && c->is_server ? c->sni : NULL;
}
