/*
 * TLS contexts (src/net/tls.c): creation errors, reference counting and the
 * asynchronous loaders. A second group runs real connections over loopback
 * (listener + connector, both sides ours) to pin down what the integration
 * tests cannot reach deterministically: an input cap smaller than one TLS
 * record combined with paused reading (nothing may be stranded inside the
 * SSL), coalesced writes, close_notify -> OSR_EOF, certificate failures and
 * hostile first bytes. Runs with either backend.
 *
 * The certificates below are test-only (EC P-256, valid 2000..2099, CA
 * "OSR Unit Test ca", server "localhost" + 127.0.0.1 + ::1); they are
 * written to a temporary directory because the API takes file names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "net/connect.h"
#include "net/listener.h"
#include "net/sock.h"
#include "net/tls.h"
#include "util/buf.h"
#include "util/log.h"
#include "util/mem.h"

static const char PEM_CA[] = "-----BEGIN CERTIFICATE-----\n"
                             "MIIBajCCARCgAwIBAgICEAAwCgYIKoZIzj0EAwIwGzEZMBcGA1UEAwwQT1NSIFVu\n"
                             "aXQgVGVzdCBjYTAgFw0wMDAxMDEwMDAwMDBaGA8yMDk5MTIzMTIzNTk1OVowGzEZ\n"
                             "MBcGA1UEAwwQT1NSIFVuaXQgVGVzdCBjYTBZMBMGByqGSM49AgEGCCqGSM49AwEH\n"
                             "A0IABPs+b6mD3P9z60zwXpotSdtXLtdacqNSSCusVsDSGx3o08m2+3CgO2vGfGYw\n"
                             "LqELjMAgLh0oRX8JQdwOIc0JuPSjQjBAMA8GA1UdEwEB/wQFMAMBAf8wDgYDVR0P\n"
                             "AQH/BAQDAgEGMB0GA1UdDgQWBBSd1JeLSoND0TWmZlmzG1IuX+ONszAKBggqhkjO\n"
                             "PQQDAgNIADBFAiEA0b8QECbJ9RdoFh1nIGiCeuIPmnGoobDWmnZw6QbtKKECIFuV\n"
                             "e9bmIXfec5ZR8zX2gf2ZtYT6JpubHQB6E5K/OqKu\n"
                             "-----END CERTIFICATE-----\n";

static const char PEM_CA2[] = "-----BEGIN CERTIFICATE-----\n"
                              "MIIBbDCCARKgAwIBAgICEAEwCgYIKoZIzj0EAwIwHDEaMBgGA1UEAwwRT1NSIFVu\n"
                              "aXQgVGVzdCBjYTIwIBcNMDAwMTAxMDAwMDAwWhgPMjA5OTEyMzEyMzU5NTlaMBwx\n"
                              "GjAYBgNVBAMMEU9TUiBVbml0IFRlc3QgY2EyMFkwEwYHKoZIzj0CAQYIKoZIzj0D\n"
                              "AQcDQgAEO995CT5j4J7tXZFfKBb3hy+rceU2lS2CuF4A4JX4uzkX7BwSbhXVtsix\n"
                              "oK4PQnozyKoifajO4KmOb+LZ6bHPyKNCMEAwDwYDVR0TAQH/BAUwAwEB/zAOBgNV\n"
                              "HQ8BAf8EBAMCAQYwHQYDVR0OBBYEFExOCt2iQ8KyUq/Yh00fAARD1Cf2MAoGCCqG\n"
                              "SM49BAMCA0gAMEUCIDJ4a5hpm+xPV6liWwZhk6lwcyONdEWJqwJ+Eh0xnYk3AiEA\n"
                              "m+89bNiL4HcJCMTzZI8MzuAhVnDxg5cKV3nE+PElr5A=\n"
                              "-----END CERTIFICATE-----\n";

static const char PEM_SERVER_CERT[] =
    "-----BEGIN CERTIFICATE-----\n"
    "MIIBzTCCAXOgAwIBAgICEAIwCgYIKoZIzj0EAwIwGzEZMBcGA1UEAwwQT1NSIFVu\n"
    "aXQgVGVzdCBjYTAgFw0wMDAxMDEwMDAwMDBaGA8yMDk5MTIzMTIzNTk1OVowFDES\n"
    "MBAGA1UEAwwJbG9jYWxob3N0MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEA6WK\n"
    "MEjsztVhNZ4qmefJvxv4fZ4yhKXe4Xj2JQvMRSEa27Dc7Ut9sjMD7MTCUzaObTfX\n"
    "X5byhWJfV4844pZpxaOBqzCBqDAJBgNVHRMEAjAAMA4GA1UdDwEB/wQEAwIHgDAd\n"
    "BgNVHSUEFjAUBggrBgEFBQcDAQYIKwYBBQUHAwIwLAYDVR0RBCUwI4IJbG9jYWxo\n"
    "b3N0hwR/AAABhxAAAAAAAAAAAAAAAAAAAAABMB0GA1UdDgQWBBSHm6vp5svdYAA3\n"
    "cDwbHeXrM7ph+zAfBgNVHSMEGDAWgBSd1JeLSoND0TWmZlmzG1IuX+ONszAKBggq\n"
    "hkjOPQQDAgNIADBFAiEA4i49CusDMT/eMEKi7KohoXB0rXFdhqr8AiV00Mr/rlsC\n"
    "IDx/BJbpTX+W1WPJS2cfO3SZthjediA10pKvxi/pK3Xj\n"
    "-----END CERTIFICATE-----\n";

static const char PEM_SERVER_KEY[] =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgsqk1Fa1/kTk4xUYu\n"
    "J5OJnI8trTi6Wu744xjuuxKGbWehRANCAAQDpYowSOzO1WE1niqZ58m/G/h9njKE\n"
    "pd7hePYlC8xFIRrbsNztS32yMwPsxMJTNo5tN9dflvKFYl9XjzjilmnF\n"
    "-----END PRIVATE KEY-----\n";

static const char PEM_OTHER_KEY[] =
    "-----BEGIN PRIVATE KEY-----\n"
    "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgp1EeAY4W/b1WSObT\n"
    "eNkq9ghWYSqY8lOCqcdSfyDl9r6hRANCAATMaeYvXesVhVIeT4Pob6J26linRrHN\n"
    "TQGWJPRgqCWpIacV/HMNOBFb3mZdDXdmIIcFBZ8NP8TSz09Y+8uCZEiA\n"
    "-----END PRIVATE KEY-----\n";

/* ---- files ------------------------------------------------------------------ */

static char dir[64];
static char f_ca[128], f_ca2[128], f_cert[128], f_key[128], f_other_key[128], f_garbage[128],
    f_empty[128], f_missing[128], f_chain_key[128];

static void write_file(const char *path, const char *text)
{
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
  assert_int_equal(fclose(f), 0);
}

static int group_setup(void **state)
{
  (void)state;
  snprintf(dir, sizeof(dir), "/tmp/osr-tls-unit-XXXXXX");
  if (mkdtemp(dir) == NULL)
    return -1;
  snprintf(f_ca, sizeof(f_ca), "%s/ca.pem", dir);
  snprintf(f_ca2, sizeof(f_ca2), "%s/ca2.pem", dir);
  snprintf(f_cert, sizeof(f_cert), "%s/server.pem", dir);
  snprintf(f_key, sizeof(f_key), "%s/server.key", dir);
  snprintf(f_other_key, sizeof(f_other_key), "%s/other.key", dir);
  snprintf(f_garbage, sizeof(f_garbage), "%s/garbage.pem", dir);
  snprintf(f_empty, sizeof(f_empty), "%s/empty.pem", dir);
  snprintf(f_missing, sizeof(f_missing), "%s/does-not-exist.pem", dir);
  snprintf(f_chain_key, sizeof(f_chain_key), "%s/chain+key.pem", dir);
  write_file(f_ca, PEM_CA);
  write_file(f_ca2, PEM_CA2);
  write_file(f_cert, PEM_SERVER_CERT);
  write_file(f_key, PEM_SERVER_KEY);
  write_file(f_other_key, PEM_OTHER_KEY);
  write_file(f_garbage,
             "-----BEGIN CERTIFICATE-----\nnot base64 at all !!!\n-----END CERTIFICATE-----\n");
  write_file(f_empty, "");
  /* A certificate chain with the key in the same file also loads. */
  char both[4096];
  snprintf(both, sizeof(both), "%s%s%s", PEM_SERVER_CERT, PEM_CA, PEM_SERVER_KEY);
  write_file(f_chain_key, both);
  if (getenv("OSR_TEST_DEBUG") != NULL)
    osr_log_set_level(OSR_LOG_DEBUG);
  return 0;
}

static int group_teardown(void **state)
{
  const char *files[] = {f_ca, f_ca2, f_cert, f_key, f_other_key, f_garbage, f_empty, f_chain_key};
  (void)state;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(files); i++)
    unlink(files[i]);
  rmdir(dir);
  return 0;
}

/* ---- contexts --------------------------------------------------------------- */

static const char *const ALPN_BOTH[] = {"h2", "http/1.1"};

static int new_server(const char *cert, const char *key, osr_tls_ctx_t **out)
{
  osr_tls_server_opts_t o = {cert, key, ALPN_BOTH, 2};
  return osr_tls_ctx_new_server(&o, out);
}

static void test_server_ok_and_refs(void **state)
{
  osr_tls_ctx_t *ctx = NULL;
  (void)state;
  assert_int_equal(new_server(f_cert, f_key, &ctx), 0);
  assert_non_null(ctx);
  osr_tls_ctx_ref(ctx);
  osr_tls_ctx_ref(ctx);
  osr_tls_ctx_unref(ctx);
  osr_tls_ctx_unref(ctx);
  osr_tls_ctx_unref(ctx); /* last one frees; ASan/LSan would report otherwise */
  osr_tls_ctx_unref(NULL);

  ctx = NULL;
  assert_int_equal(new_server(f_chain_key, f_chain_key, &ctx), 0);
  osr_tls_ctx_unref(ctx);
}

static void test_server_missing_files(void **state)
{
  osr_tls_ctx_t *ctx = NULL;
  (void)state;
  assert_int_equal(new_server(f_missing, f_key, &ctx), OSR_ENOENT);
  assert_int_equal(new_server(f_cert, f_missing, &ctx), OSR_ENOENT);
  assert_null(ctx);
}

static void test_server_bad_pem(void **state)
{
  osr_tls_ctx_t *ctx = NULL;
  (void)state;
  assert_int_equal(new_server(f_garbage, f_key, &ctx), OSR_ETLS);
  assert_int_equal(new_server(f_empty, f_key, &ctx), OSR_ETLS);
  assert_int_equal(new_server(f_cert, f_garbage, &ctx), OSR_ETLS);
  assert_int_equal(new_server(f_cert, f_empty, &ctx), OSR_ETLS);
  assert_int_equal(new_server(f_key, f_cert, &ctx), OSR_ETLS); /* swapped */
  assert_null(ctx);
}

static void test_server_key_mismatch(void **state)
{
  osr_tls_ctx_t *ctx = NULL;
  (void)state;
  assert_int_equal(new_server(f_cert, f_other_key, &ctx), OSR_ETLS);
  assert_null(ctx);
}

static void test_server_bad_args(void **state)
{
  osr_tls_ctx_t *ctx = NULL;
  char long_name[300];
  (void)state;
  memset(long_name, 'a', sizeof(long_name) - 1);
  long_name[sizeof(long_name) - 1] = '\0';
  const char *empty_alpn[] = {"h2", ""};
  const char *long_alpn[] = {long_name};
  const char *null_alpn[] = {NULL};
  osr_tls_server_opts_t o = {f_cert, f_key, NULL, 0};

  assert_int_equal(osr_tls_ctx_new_server(NULL, &ctx), OSR_EINVAL);
  o.cert_file = NULL;
  assert_int_equal(osr_tls_ctx_new_server(&o, &ctx), OSR_EINVAL);
  o.cert_file = f_cert;
  o.alpn = empty_alpn;
  o.nalpn = 2;
  assert_int_equal(osr_tls_ctx_new_server(&o, &ctx), OSR_EINVAL);
  o.alpn = long_alpn;
  o.nalpn = 1;
  assert_int_equal(osr_tls_ctx_new_server(&o, &ctx), OSR_EINVAL);
  o.alpn = null_alpn;
  assert_int_equal(osr_tls_ctx_new_server(&o, &ctx), OSR_EINVAL);
  o.alpn = NULL;
  assert_int_equal(osr_tls_ctx_new_server(&o, &ctx), OSR_EINVAL);
  assert_null(ctx);
}

static void test_client_contexts(void **state)
{
  osr_tls_ctx_t *ctx = NULL;
  (void)state;
  osr_tls_client_opts_t o;

  memset(&o, 0, sizeof(o));
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), 0); /* system store */
  osr_tls_ctx_unref(ctx);
  assert_int_equal(osr_tls_ctx_new_client(NULL, &ctx), 0);
  osr_tls_ctx_unref(ctx);

  o.ca_file = f_ca;
  o.alpn = ALPN_BOTH;
  o.nalpn = 2;
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), 0);
  osr_tls_ctx_unref(ctx);

  o.insecure_skip_verify = 1;
  o.ca_file = NULL;
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), 0);
  osr_tls_ctx_unref(ctx);
  o.insecure_skip_verify = 0;

  /* A client certificate. */
  o.cert_file = f_cert;
  o.key_file = f_key;
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), 0);
  osr_tls_ctx_unref(ctx);

  ctx = NULL;
  o.key_file = f_other_key;
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), OSR_ETLS);
  o.key_file = NULL;
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), OSR_EINVAL);
  o.cert_file = NULL;

  o.ca_file = f_missing;
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), OSR_ENOENT);
  o.ca_file = f_garbage;
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), OSR_ETLS);
  o.ca_file = f_empty;
  assert_int_equal(osr_tls_ctx_new_client(&o, &ctx), OSR_ETLS);
  assert_null(ctx);
}

/* ---- asynchronous loading ---------------------------------------------------- */

typedef struct load_result_s {
  int calls;
  int status;
  osr_tls_ctx_t *ctx;
  uv_thread_t thread;
} load_result_t;

static void on_loaded(osr_tls_ctx_t *ctx, int status, void *data)
{
  load_result_t *r = data;
  r->calls++;
  r->status = status;
  r->ctx = ctx;
  r->thread = uv_thread_self();
}

static void test_load_async(void **state)
{
  uv_loop_t loop;
  load_result_t ok = {0}, missing = {0}, mismatch = {0}, client = {0}, badca = {0}, never = {0};
  char cert[128], key[128];
  char alpn0[8] = "h2";
  const char *alpn[] = {alpn0};
  (void)state;

  assert_int_equal(uv_loop_init(&loop), 0);
  uv_thread_t self = uv_thread_self();

  /* Options are copied: scribble over ours right after the call. */
  snprintf(cert, sizeof(cert), "%s", f_cert);
  snprintf(key, sizeof(key), "%s", f_key);
  osr_tls_server_opts_t so = {cert, key, alpn, 1};
  assert_int_equal(osr_tls_ctx_load_server(&loop, &so, on_loaded, &ok), 0);
  memset(cert, 'x', sizeof(cert) - 1);
  memset(key, 'x', sizeof(key) - 1);
  memset(alpn0, 'x', sizeof(alpn0) - 1);

  osr_tls_server_opts_t so2 = {f_missing, f_key, NULL, 0};
  assert_int_equal(osr_tls_ctx_load_server(&loop, &so2, on_loaded, &missing), 0);
  osr_tls_server_opts_t so3 = {f_cert, f_other_key, NULL, 0};
  assert_int_equal(osr_tls_ctx_load_server(&loop, &so3, on_loaded, &mismatch), 0);

  osr_tls_client_opts_t co;
  memset(&co, 0, sizeof(co));
  co.ca_file = f_ca;
  co.alpn = ALPN_BOTH;
  co.nalpn = 2;
  assert_int_equal(osr_tls_ctx_load_client(&loop, &co, on_loaded, &client), 0);
  co.ca_file = f_garbage;
  assert_int_equal(osr_tls_ctx_load_client(&loop, &co, on_loaded, &badca), 0);

  /* Invalid options fail at once and the callback never fires. */
  osr_tls_server_opts_t bad = {NULL, f_key, NULL, 0};
  assert_int_equal(osr_tls_ctx_load_server(&loop, &bad, on_loaded, &never), OSR_EINVAL);
  const char *empty[] = {""};
  osr_tls_server_opts_t bad2 = {f_cert, f_key, empty, 1};
  assert_int_equal(osr_tls_ctx_load_server(&loop, &bad2, on_loaded, &never), OSR_EINVAL);
  co.ca_file = NULL;
  co.cert_file = f_cert; /* without key_file */
  assert_int_equal(osr_tls_ctx_load_client(&loop, &co, on_loaded, &never), OSR_EINVAL);
  assert_int_equal(osr_tls_ctx_load_server(&loop, NULL, on_loaded, &never), OSR_EINVAL);

  /* Nothing fires before the loop runs. */
  assert_int_equal(ok.calls + missing.calls + mismatch.calls + client.calls + badca.calls, 0);
  assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0);

  assert_int_equal(ok.calls, 1);
  assert_int_equal(ok.status, 0);
  assert_non_null(ok.ctx);
  assert_true(uv_thread_equal(&ok.thread, &self));
  assert_int_equal(missing.calls, 1);
  assert_int_equal(missing.status, OSR_ENOENT);
  assert_null(missing.ctx);
  assert_int_equal(mismatch.calls, 1);
  assert_int_equal(mismatch.status, OSR_ETLS);
  assert_null(mismatch.ctx);
  assert_int_equal(client.calls, 1);
  assert_int_equal(client.status, 0);
  assert_non_null(client.ctx);
  assert_int_equal(badca.calls, 1);
  assert_int_equal(badca.status, OSR_ETLS);
  assert_int_equal(never.calls, 0);

  osr_tls_ctx_unref(ok.ctx);
  osr_tls_ctx_unref(client.ctx);
  assert_int_equal(uv_loop_close(&loop), 0);
}

/* ---- connections over loopback ------------------------------------------------- */

/* Allocation failures for sizes in [fail_lo, fail_hi] (osr_try_realloc and
 * osr_buf growth go through realloc_fn); everything else is libc. */
static size_t fail_lo = 1, fail_hi = 0;

static void *t_malloc(size_t n, void *ud)
{
  (void)ud;
  return malloc(n); /* checksrc: test allocator */
}

static void *t_realloc(void *p, size_t n, void *ud)
{
  (void)ud;
  if (n >= fail_lo && n <= fail_hi)
    return NULL;
  return realloc(p, n); /* checksrc: test allocator */
}

static void t_free(void *p, void *ud)
{
  (void)ud;
  free(p); /* checksrc: test allocator */
}

static const osr_mem_t failing_mem = {t_malloc, t_realloc, t_free, NULL};

typedef struct side_s {
  osr_sock_t *sock;
  size_t input_max; /* 0: default */
  int pause;        /* pause reading after every 3rd delivery, resume 1 ms later */
  unsigned reads;
  uv_timer_t resume;
  osr_buf_t got;
  int end;  /* status that ended reading; 1 while open */
  int ends; /* how many times on_read reported an end */
  int closed;
  char alpn[32];
  char sni[64];
  int write_status; /* 1 until the write callback */
  int write_calls;
} side_t;

typedef struct fx_s {
  uv_loop_t loop;
  uv_timer_t deadline;
  int timed_out;
  osr_listener_t *lis;
  osr_tls_ctx_t *sctx;
  osr_tls_ctx_t *cctx;
  side_t srv, cli;
  int conn_status; /* 1 until the connect callback */
  int echo;        /* server: on EOF write everything back, then shut down */
  int request;     /* request/response: the client does not shut down; the
                    * server echoes once payload_len bytes arrived */
  const char *payload;
  size_t payload_len;
  int accepted;
  int write_enomem; /* client: the first write must fail with OSR_ENOMEM */
} fx_t;

static fx_t F;

static void copy_str(char *dst, size_t cap, const char *s)
{
  snprintf(dst, cap, "%s", s != NULL ? s : "");
}

static void on_deadline(uv_timer_t *t)
{
  (void)t;
  F.timed_out = 1;
}

static void on_resume(uv_timer_t *t)
{
  side_t *sd = t->data;
  if (sd->sock != NULL && !osr_sock_is_closing(sd->sock))
    assert_int_equal(osr_sock_read_start(sd->sock), 0);
}

static void side_consume(side_t *sd, osr_sock_t *s)
{
  assert_true(s->input.len <= s->input.max);
  assert_int_equal(osr_buf_append(&sd->got, osr_buf_data(&s->input), s->input.len), 0);
  osr_buf_consume(&s->input, s->input.len);
  if (sd->pause && ++sd->reads % 3 == 0) {
    osr_sock_read_stop(s);
    uv_timer_start(&sd->resume, on_resume, 1, 0);
  }
}

static void srv_shut(osr_sock_t *s, int status, void *arg)
{
  (void)status;
  (void)arg;
  osr_sock_close(s);
}

static void srv_wrote(osr_sock_t *s, int status, void *arg)
{
  (void)arg;
  F.srv.write_status = status;
  F.srv.write_calls = F.srv.write_calls < 0 ? 1 : F.srv.write_calls + 1;
  if (status != 0 || osr_sock_shutdown(s, srv_shut, NULL) != 0)
    osr_sock_close(s);
}

static void srv_on_read(osr_sock_t *s, int status)
{
  if (status == 0) {
    side_consume(&F.srv, s);
    if (F.request && F.srv.got.len == F.payload_len && F.srv.write_calls == 0) {
      F.srv.write_calls = -1; /* written once */
      osr_iovec_t iov = osr_iov(osr_buf_data(&F.srv.got), F.srv.got.len);
      assert_int_equal(osr_sock_write(s, &iov, 1, srv_wrote, NULL), 0);
    }
    return;
  }
  F.srv.end = status;
  F.srv.ends++;
  if (F.echo && status == OSR_EOF) {
    osr_iovec_t iov = osr_iov(osr_buf_data(&F.srv.got), F.srv.got.len);
    if (osr_sock_write(s, &iov, 1, srv_wrote, NULL) == 0)
      return;
  }
  osr_sock_close(s);
}

static void srv_on_close(osr_sock_t *s)
{
  (void)s;
  F.srv.sock = NULL;
  F.srv.closed = 1;
}

static const osr_sock_events_t srv_ev = {srv_on_read, srv_on_close, NULL, NULL};

static void on_accept(osr_listener_t *l, osr_sock_t *s)
{
  (void)l;
  F.accepted++;
  F.srv.sock = s;
  osr_sock_set_events(s, &srv_ev, &F);
  if (F.srv.input_max != 0)
    s->input.max = F.srv.input_max;
  copy_str(F.srv.alpn, sizeof(F.srv.alpn), osr_sock_alpn(s));
  copy_str(F.srv.sni, sizeof(F.srv.sni), osr_sock_sni(s));
  assert_true(osr_sock_is_tls(s));
  assert_int_equal(osr_sock_read_start(s), 0);
}

static void cli_on_read(osr_sock_t *s, int status)
{
  if (status == 0) {
    side_consume(&F.cli, s);
    if (F.request && F.cli.got.len == F.payload_len) {
      F.cli.end = OSR_EOF; /* the whole response: done */
      F.cli.ends++;
      osr_sock_close(s);
    }
    return;
  }
  F.cli.end = status;
  F.cli.ends++;
  osr_sock_close(s);
}

static void cli_on_close(osr_sock_t *s)
{
  (void)s;
  F.cli.sock = NULL;
  F.cli.closed = 1;
}

static const osr_sock_events_t cli_ev = {cli_on_read, cli_on_close, NULL, NULL};

static void cli_wrote(osr_sock_t *s, int status, void *arg)
{
  (void)arg;
  F.cli.write_status = status;
  F.cli.write_calls++;
  /* close_notify, then FIN; the server sees OSR_EOF. */
  if (status != 0 || (!F.request && osr_sock_shutdown(s, NULL, NULL) != 0))
    osr_sock_close(s);
}

static void on_connected(osr_sock_t *s, int status, void *data)
{
  (void)data;
  F.conn_status = status;
  if (status != 0)
    return;
  F.cli.sock = s;
  osr_sock_set_events(s, &cli_ev, &F);
  if (F.cli.input_max != 0)
    s->input.max = F.cli.input_max;
  copy_str(F.cli.alpn, sizeof(F.cli.alpn), osr_sock_alpn(s));
  assert_null(osr_sock_sni(s)); /* client side */
  if (F.write_enomem) {
    /* The ciphertext buffer cannot be allocated: the write fails, nothing
     * was sealed, the callback never fires and the connection still works. */
    osr_iovec_t big = osr_iov(F.payload, F.payload_len);
    assert_int_equal(osr_sock_write(s, &big, 1, cli_wrote, NULL), OSR_ENOMEM);
    fail_lo = 1;
    fail_hi = 0;
  }
  if (F.payload != NULL) {
    /* Many iovecs of odd sizes in one write: coalesced into full records. */
    osr_iovec_t iov[8];
    size_t n = 0, off = 0;
    static const size_t sizes[] = {1, 100, 5000, 16383, 16385, 40000, 7};
    for (size_t i = 0; i < OSR_ARRAY_SIZE(sizes) && off < F.payload_len; i++) {
      size_t k = sizes[i] < F.payload_len - off ? sizes[i] : F.payload_len - off;
      iov[n++] = osr_iov(F.payload + off, k);
      off += k;
    }
    if (off < F.payload_len)
      iov[n++] = osr_iov(F.payload + off, F.payload_len - off);
    assert_int_equal(osr_sock_write(s, iov, n, cli_wrote, NULL), 0);
  } else {
    /* Nothing to send: an empty write still calls back, then close. */
    assert_int_equal(osr_sock_write(s, NULL, 0, cli_wrote, NULL), 0);
  }
  assert_int_equal(osr_sock_read_start(s), 0);
}

static void fx_init(void)
{
  memset(&F, 0, sizeof(F));
  assert_int_equal(uv_loop_init(&F.loop), 0);
  uv_timer_init(&F.loop, &F.deadline);
  uv_timer_start(&F.deadline, on_deadline, getenv("OSR_TEST_DEBUG") != NULL ? 3000 : 20000, 0);
  side_t *sides[] = {&F.srv, &F.cli};
  for (size_t i = 0; i < 2; i++) {
    uv_timer_init(&F.loop, &sides[i]->resume);
    sides[i]->resume.data = sides[i];
    osr_buf_init(&sides[i]->got, SIZE_MAX);
    sides[i]->end = 1;
    sides[i]->write_status = 1;
  }
  F.conn_status = 1;
}

static void fx_server(const char *const *alpn, size_t nalpn, uint64_t handshake_timeout_ms)
{
  osr_tls_server_opts_t so = {f_cert, f_key, alpn, nalpn};
  assert_int_equal(osr_tls_ctx_new_server(&so, &F.sctx), 0);
  osr_listener_opts_t lo;
  memset(&lo, 0, sizeof(lo));
  lo.tls = F.sctx;
  lo.handshake_timeout_ms = handshake_timeout_ms;
  assert_int_equal(osr_listener_new(&F.loop, "127.0.0.1:0", &lo, on_accept, &F, &F.lis), 0);
  osr_tls_ctx_unref(F.sctx); /* the listener holds its own reference */
  F.sctx = NULL;
}

static void fx_client(const char *ca, int insecure, const char *const *alpn, size_t nalpn)
{
  osr_tls_client_opts_t co;
  memset(&co, 0, sizeof(co));
  co.ca_file = ca;
  co.insecure_skip_verify = insecure;
  co.alpn = alpn;
  co.nalpn = nalpn;
  assert_int_equal(osr_tls_ctx_new_client(&co, &F.cctx), 0);
}

static void fx_connect(const char *host, const char *sni)
{
  char addr[64];
  osr_connect_opts_t o;
  memset(&o, 0, sizeof(o));
  o.tls = F.cctx;
  o.sni = sni;
  o.timeout_ms = 10000;
  snprintf(addr, sizeof(addr), "%s:%d", host, osr_listener_port(F.lis));
  assert_int_equal(osr_connect(&F.loop, addr, &o, on_connected, &F, NULL), 0);
}

/* Run until cond() holds or the deadline passes. */
static void fx_run(int (*cond)(void))
{
  while (!cond() && !F.timed_out)
    uv_run(&F.loop, UV_RUN_ONCE);
  if (F.timed_out)
    fprintf(stderr, "timed out: connect %d, server end %d closed %d, client end %d closed %d\n",
            F.conn_status, F.srv.end, F.srv.closed, F.cli.end, F.cli.closed);
  assert_false(F.timed_out);
}

static void on_walk_close(uv_handle_t *h, void *arg)
{
  (void)arg;
  if (!uv_is_closing(h))
    uv_close(h, NULL);
}

static void fx_done(void)
{
  if (F.cli.sock != NULL)
    osr_sock_close(F.cli.sock);
  if (F.srv.sock != NULL)
    osr_sock_close(F.srv.sock);
  if (F.lis != NULL)
    osr_listener_close(F.lis, 0, NULL);
  uv_run(&F.loop, UV_RUN_NOWAIT);
  uv_close((uv_handle_t *)&F.deadline, NULL);
  uv_close((uv_handle_t *)&F.srv.resume, NULL);
  uv_close((uv_handle_t *)&F.cli.resume, NULL);
  uv_run(&F.loop, UV_RUN_DEFAULT);
  uv_walk(&F.loop, on_walk_close, NULL); /* raw test clients */
  uv_run(&F.loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&F.loop), 0);
  if (F.cctx != NULL)
    osr_tls_ctx_unref(F.cctx);
  osr_buf_dispose(&F.srv.got);
  osr_buf_dispose(&F.cli.got);
}

static int both_closed(void)
{
  return F.srv.closed && F.cli.closed;
}

static char *make_payload(size_t n)
{
  char *p = osr_xmalloc(n);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++) {
    x = x * 1103515245u + 12345u;
    p[i] = (char)(x >> 16);
  }
  return p;
}

static void echo_case(size_t n, size_t srv_max, size_t cli_max, int pause, int request)
{
  char *payload = make_payload(n);
  fx_init();
  fx_server(ALPN_BOTH, 2, 0);
  fx_client(f_ca, 0, ALPN_BOTH, 2);
  F.payload = payload;
  F.payload_len = n;
  F.echo = !request;
  F.request = request;
  F.srv.input_max = srv_max;
  F.cli.input_max = cli_max;
  F.srv.pause = F.cli.pause = pause;
  fx_connect("localhost", NULL);
  fx_run(both_closed);
  assert_int_equal(F.conn_status, 0);
  assert_int_equal(F.cli.write_status, 0);
  assert_int_equal(F.cli.write_calls, 1);
  if (!request)
    assert_int_equal(F.srv.end, OSR_EOF);                     /* the client's close_notify */
  assert_int_equal(F.srv.ends, request ? F.srv.ends & 1 : 1); /* never twice */
  assert_int_equal(F.srv.write_status, 0);
  assert_int_equal(F.srv.write_calls, 1);
  assert_int_equal(F.srv.got.len, n);
  assert_memory_equal(osr_buf_data(&F.srv.got), payload, n);
  assert_int_equal(F.cli.end, OSR_EOF);
  assert_int_equal(F.cli.got.len, n);
  assert_memory_equal(osr_buf_data(&F.cli.got), payload, n);
  assert_string_equal(F.srv.sni, "localhost");
  assert_string_equal(F.srv.alpn, "h2");
  assert_string_equal(F.cli.alpn, "h2");
  fx_done();
  osr_free(payload);
}

static void test_echo_default_caps(void **state)
{
  (void)state;
  echo_case(3 * 1024 * 1024 + 17, 0, 0, 0, 0);
  echo_case(3 * 1024 * 1024 + 17, 0, 0, 0, 1);
}

/* Input caps far below one record, and reading paused on both sides every
 * few deliveries: the SSL holds decrypted bytes that do not fit, and they
 * must come out after osr_sock_read_start() even when no more ciphertext
 * arrives (the last records). */
static void test_echo_tiny_caps_paused(void **state)
{
  (void)state;
  echo_case(600 * 1024 + 3, 1000, 777, 1, 0);
  echo_case(5, 1, 1, 1, 0);
  /* Request/response: nothing follows the last record, so only the kick
   * after osr_sock_read_start() can bring its held-back bytes out. */
  echo_case(600 * 1024 + 3, 1000, 777, 1, 1);
  echo_case(16384, 1000, 16383, 1, 1);
  echo_case(70000, 16384 + 1, 4096, 1, 1);
}

static void test_empty_write_and_eof(void **state)
{
  (void)state;
  echo_case(0, 0, 0, 0, 0);
}

static void alpn_case(const char *const *salpn, size_t ns, const char *const *calpn, size_t nc,
                      const char *want)
{
  fx_init();
  fx_server(salpn, ns, 0);
  fx_client(f_ca, 0, calpn, nc);
  fx_connect("127.0.0.1", "localhost");
  fx_run(both_closed);
  assert_int_equal(F.conn_status, 0);
  assert_string_equal(F.srv.alpn, want);
  assert_string_equal(F.cli.alpn, want);
  fx_done();
}

static void test_alpn(void **state)
{
  static const char *const h1_h2[] = {"http/1.1", "h2"};
  static const char *const h1[] = {"http/1.1"};
  static const char *const foo[] = {"foo"};
  (void)state;
  alpn_case(ALPN_BOTH, 2, h1_h2, 2, "h2"); /* the server's preference wins */
  alpn_case(h1_h2, 2, ALPN_BOTH, 2, "http/1.1");
  alpn_case(ALPN_BOTH, 2, h1, 1, "http/1.1");
  alpn_case(ALPN_BOTH, 2, foo, 1, "");  /* no overlap: no ALPN */
  alpn_case(NULL, 0, ALPN_BOTH, 2, ""); /* server without ALPN */
  alpn_case(ALPN_BOTH, 2, NULL, 0, ""); /* client without ALPN */
}

static int failed_handshake_seen(void)
{
  return F.conn_status != 1 && F.lis->tls_failed + F.lis->accepted >= 1 &&
         osr_listener_nconns(F.lis) == 0;
}

static void verify_case(const char *ca, int insecure, const char *host, const char *sni, int want)
{
  fx_init();
  fx_server(ALPN_BOTH, 2, 0);
  fx_client(ca, insecure, ALPN_BOTH, 2);
  fx_connect(host, sni);
  if (want == 0) {
    fx_run(both_closed);
  } else {
    fx_run(failed_handshake_seen);
    assert_int_equal(F.lis->tls_failed, 1);
    assert_int_equal(F.accepted, 0);
  }
  assert_int_equal(F.conn_status, want);
  fx_done();
}

static void test_verify(void **state)
{
  (void)state;
  verify_case(f_ca, 0, "127.0.0.1", NULL, 0);                    /* IP SAN, no SNI sent */
  verify_case(f_ca, 0, "127.0.0.1", "localhost", 0);             /* DNS SAN */
  verify_case(f_ca, 0, "127.0.0.1", "localhost.", 0);            /* trailing dot */
  verify_case(f_ca2, 0, "127.0.0.1", "localhost", OSR_ECERT);    /* unknown CA */
  verify_case(f_ca, 0, "127.0.0.1", "other.example", OSR_ECERT); /* wrong name */
  verify_case(f_ca, 0, "127.0.0.1", "127.0.0.2", OSR_ECERT);     /* wrong IP */
  verify_case(f_ca2, 1, "127.0.0.1", "other.example", 0);        /* insecure */
}

static void test_enomem(void **state)
{
  (void)state;
  osr_mem_set(&failing_mem);

  /* Write side: an 800000-byte write needs a ciphertext buffer a little
   * larger than that. */
  char *payload = make_payload(800000);
  fx_init();
  fx_server(ALPN_BOTH, 2, 0);
  fx_client(f_ca, 0, ALPN_BOTH, 2);
  F.payload = payload;
  F.payload_len = 800000;
  F.echo = 1;
  F.write_enomem = 1;
  fail_lo = 800001;
  fail_hi = 900000;
  fx_connect("localhost", NULL);
  fx_run(both_closed);
  assert_int_equal(F.conn_status, 0);
  assert_int_equal(F.cli.write_calls, 1);
  assert_int_equal(F.srv.got.len, 800000);
  assert_int_equal(F.cli.got.len, 800000);
  assert_memory_equal(osr_buf_data(&F.cli.got), payload, 800000);
  fx_done();

  /* Read side: the server's input buffer (cap 12345, so its first
   * allocation has exactly that size) cannot be allocated. */
  fx_init();
  fx_server(ALPN_BOTH, 2, 0);
  fx_client(f_ca, 0, ALPN_BOTH, 2);
  F.payload = payload;
  F.payload_len = 50000;
  F.srv.input_max = 12345;
  fail_lo = fail_hi = 12345;
  fx_connect("localhost", NULL);
  fx_run(both_closed);
  fail_lo = 1;
  fail_hi = 0;
  assert_int_equal(F.conn_status, 0);
  assert_int_equal(F.srv.end, OSR_ENOMEM);
  assert_int_equal(F.srv.ends, 1);
  assert_int_equal(F.srv.got.len, 0);
  fx_done();

  osr_free(payload);
  osr_mem_set(NULL);
}

/* ---- hostile first bytes: raw TCP clients ------------------------------------ */

typedef struct raw_client_s {
  uv_tcp_t tcp;
  uv_connect_t conn;
  uv_write_t wr;
  const char *send;
  size_t send_len;
  uv_shutdown_t shut;
  int half_close; /* send FIN after the bytes */
  int eof;        /* 1 when the server closed */
  size_t got;
  int got_bytes_before_eof_ok; /* only a TLS alert (type 21) may come back */
  int first_byte;
} raw_client_t;

static void raw_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b)
{
  static char buf[65536];
  (void)h;
  (void)sz;
  b->base = buf;
  b->len = sizeof(buf);
}

static void raw_read(uv_stream_t *st, ssize_t n, const uv_buf_t *b)
{
  raw_client_t *rc = st->data;
  if (n > 0) {
    if (rc->got == 0)
      rc->first_byte = (unsigned char)b->base[0];
    rc->got += (size_t)n;
  } else if (n < 0) {
    rc->eof = 1;
    rc->got_bytes_before_eof_ok = rc->got == 0 || rc->first_byte == 21;
    uv_read_stop(st);
  }
}

static void raw_shut(uv_shutdown_t *r, int status)
{
  (void)r;
  (void)status;
}

static void raw_written(uv_write_t *w, int status)
{
  raw_client_t *rc = w->data;
  if (status == 0 && rc->half_close)
    uv_shutdown(&rc->shut, (uv_stream_t *)&rc->tcp, raw_shut);
}

static void raw_connected(uv_connect_t *c, int status)
{
  raw_client_t *rc = c->data;
  assert_int_equal(status, 0);
  if (rc->send_len != 0) {
    uv_buf_t b = uv_buf_init((char *)rc->send, (unsigned)rc->send_len);
    rc->wr.data = rc;
    assert_int_equal(uv_write(&rc->wr, (uv_stream_t *)&rc->tcp, &b, 1, raw_written), 0);
  }
  assert_int_equal(uv_read_start((uv_stream_t *)&rc->tcp, raw_alloc, raw_read), 0);
}

static void raw_start(raw_client_t *rc, const char *send, size_t len)
{
  struct sockaddr_in sa;
  memset(rc, 0, sizeof(*rc));
  rc->send = send;
  rc->send_len = len;
  uv_tcp_init(&F.loop, &rc->tcp);
  rc->tcp.data = rc;
  rc->conn.data = rc;
  uv_ip4_addr("127.0.0.1", osr_listener_port(F.lis), &sa);
  assert_int_equal(uv_tcp_connect(&rc->conn, &rc->tcp, (struct sockaddr *)&sa, raw_connected), 0);
}

static raw_client_t *RC;

static int raw_eof(void)
{
  return RC->eof;
}

static void raw_step(raw_client_t *rc, const char *send, size_t len, int half_close,
                     unsigned long want_failed)
{
  raw_start(rc, send, len);
  rc->half_close = half_close;
  fx_run(raw_eof);
  assert_int_equal(rc->got_bytes_before_eof_ok, 1);
  assert_int_equal(F.lis->tls_failed, want_failed);
  assert_int_equal(F.accepted, 0);
  uv_close((uv_handle_t *)&rc->tcp, NULL);
  uv_run(&F.loop, UV_RUN_NOWAIT);
}

static void test_garbage_and_timeout(void **state)
{
  static const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  /* A ClientHello cut short: record header for 512 bytes, 40 bytes given. */
  static const char truncated[] = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"
                                  "0123456789012345678901234567890";
  raw_client_t rc;
  (void)state;
  RC = &rc;

  /* A handshake timeout far beyond the test's deadline: whatever closes
   * these connections, it is not the timer. */
  fx_init();
  fx_server(ALPN_BOTH, 2, 600000);
  raw_step(&rc, garbage, sizeof(garbage) - 1, 0, 1);     /* not TLS at all */
  raw_step(&rc, truncated, sizeof(truncated) - 1, 1, 2); /* cut short, then FIN */
  /* The server still serves a real client. */
  fx_client(f_ca, 0, ALPN_BOTH, 2);
  fx_connect("localhost", NULL);
  fx_run(both_closed);
  assert_int_equal(F.conn_status, 0);
  assert_int_equal(F.accepted, 1);
  fx_done();

  /* A short handshake timeout drops silent and stalled clients. */
  fx_init();
  fx_server(ALPN_BOTH, 2, 200);
  raw_step(&rc, NULL, 0, 0, 1);
  raw_step(&rc, truncated, sizeof(truncated) - 1, 0, 2);
  raw_step(&rc, "\x16\x03\x01\x00\x00", 5, 0, 3); /* an empty record, then nothing */
  fx_done();
}

/* Writes after the close_notify, and before/after errors, fail cleanly. */
static void shut_then_write(osr_sock_t *s, int status, void *arg)
{
  int *calls = arg;
  (*calls)++;
  assert_int_equal(status, 0);
  osr_iovec_t iov = OSR_IOV_LIT("late");
  assert_int_not_equal(osr_sock_write(s, &iov, 1, NULL, NULL), 0);
  osr_sock_close(s);
}

static int shut_calls;

static void on_connected_shut(osr_sock_t *s, int status, void *data)
{
  (void)data;
  F.conn_status = status;
  if (status != 0)
    return;
  F.cli.sock = s;
  osr_sock_set_events(s, &cli_ev, &F);
  assert_int_equal(osr_sock_shutdown(s, shut_then_write, &shut_calls), 0);
  assert_int_not_equal(osr_sock_shutdown(s, shut_then_write, &shut_calls), 0);
}

static void test_shutdown_then_write(void **state)
{
  char addr[64];
  osr_connect_opts_t o;
  (void)state;
  fx_init();
  fx_server(ALPN_BOTH, 2, 0);
  fx_client(f_ca, 0, NULL, 0);
  memset(&o, 0, sizeof(o));
  o.tls = F.cctx;
  snprintf(addr, sizeof(addr), "localhost:%d", osr_listener_port(F.lis));
  shut_calls = 0;
  assert_int_equal(osr_connect(&F.loop, addr, &o, on_connected_shut, &F, NULL), 0);
  fx_run(both_closed);
  assert_int_equal(shut_calls, 1);
  assert_int_equal(F.srv.end, OSR_EOF);
  fx_done();
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_server_ok_and_refs),
      cmocka_unit_test(test_server_missing_files),
      cmocka_unit_test(test_server_bad_pem),
      cmocka_unit_test(test_server_key_mismatch),
      cmocka_unit_test(test_server_bad_args),
      cmocka_unit_test(test_client_contexts),
      cmocka_unit_test(test_load_async),
      cmocka_unit_test(test_echo_default_caps),
      cmocka_unit_test(test_echo_tiny_caps_paused),
      cmocka_unit_test(test_empty_write_and_eof),
      cmocka_unit_test(test_enomem),
      cmocka_unit_test(test_alpn),
      cmocka_unit_test(test_verify),
      cmocka_unit_test(test_garbage_and_timeout),
      cmocka_unit_test(test_shutdown_then_write),
  };
  if (getenv("OSR_TEST_FILTER") != NULL)
    cmocka_set_test_filter(getenv("OSR_TEST_FILTER"));
  return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
