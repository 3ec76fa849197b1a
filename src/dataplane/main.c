/*
 * osr-dataplane: flags around osr_dataplane_start/stop (docs/dataplane.md).
 * SIGTERM/SIGINT drain: listeners close, in-flight exchanges get the grace
 * period, then the process exits 0. Exit 2 on bad flags, 1 if start fails.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dataplane/dataplane.h"
#include "token/token.h"
#include "util/log.h"
#include "util/mem.h"

static osr_dataplane_t *g_dp;
static uv_signal_t g_sigterm, g_sigint;
static int g_stopping;

static void usage(FILE *f)
{
  fprintf(f, "usage: osr-dataplane --listen ADDR [--listen ADDR]...\n"
             "                     (--keys-dir DIR | --keys-url URL) [--keys-refresh-ms N]\n"
             "                     [--redis URL] [--domain D] [--tls-cert F --tls-key F]\n"
             "                     [--max-conns N] [--grace-ms N] [--agent-secret-file F]\n"
             "                     [--activity-interval-ms N] [--activity-max N]\n"
             "                     [--gateway-url URL --gateway-key-file F]\n"
             "                     [--endpoint-ttl-ms N] [--metrics-key-file F]\n"
             "                     [--exec-mux on|off] [--exec-mux-conns N]\n"
             "                     [--exec-mux-sessions N] [--exec-mux-idle-ms N]\n"
             "                     [--log-level trace|debug|info|warn|error|off] [--log-json]\n");
}

static void on_stopped(void *data)
{
  (void)data;
  g_dp = NULL;
  uv_close((uv_handle_t *)&g_sigterm, NULL);
  uv_close((uv_handle_t *)&g_sigint, NULL);
}

static uint64_t g_grace_ms = 5000;

static void on_signal(uv_signal_t *s, int sig)
{
  (void)s;
  if (g_stopping || g_dp == NULL)
    return;
  g_stopping = 1;
  OSR_LOG_INFO("dataplane", "signal %d: draining for up to %llu ms", sig,
               (unsigned long long)g_grace_ms);
  osr_dataplane_stop(g_dp, g_grace_ms, on_stopped, NULL);
}

/* A secret from a file (first line, at most 512 bytes): start-up only, so
 * reading synchronously is fine. Returns 0 or -1 with a message printed. */
static int read_secret(const char *path, char *out, size_t outlen)
{
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    fprintf(stderr, "osr-dataplane: cannot read %s\n", path);
    return -1;
  }
  size_t n = fread(out, 1, outlen - 1, f);
  fclose(f);
  out[n] = '\0';
  out[strcspn(out, "\r\n")] = '\0';
  if (out[0] == '\0') {
    fprintf(stderr, "osr-dataplane: %s is empty\n", path);
    return -1;
  }
  return 0;
}

static int num_arg(const char *s, uint64_t *out)
{
  char *end;
  if (s == NULL || *s == '\0')
    return -1;
  unsigned long long v = strtoull(s, &end, 10);
  if (*end != '\0')
    return -1;
  *out = v;
  return 0;
}

int main(int argc, char **argv)
{
  osr_dataplane_config_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  uint64_t v;
  const char *secret_file = NULL;
  uint8_t secret[OSR_AGENT_SECRET_LEN];
  static char gw_key[513], metrics_key[513];

  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    if (strcmp(o, "--help") == 0 || strcmp(o, "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(o, "--log-json") == 0) {
      osr_log_set_json(1);
      continue;
    }
    if (i + 1 >= argc) {
      fprintf(stderr, "osr-dataplane: %s needs a value\n", o);
      usage(stderr);
      return 2;
    }
    const char *a = argv[++i];
    if (strcmp(o, "--listen") == 0) {
      if (cfg.nlisten == OSR_DP_MAX_LISTEN) {
        fprintf(stderr, "osr-dataplane: too many --listen\n");
        return 2;
      }
      cfg.listen[cfg.nlisten++] = a;
    } else if (strcmp(o, "--agent-secret-file") == 0) {
      secret_file = a;
    } else if (strcmp(o, "--keys-dir") == 0) {
      cfg.keys_dir = a;
    } else if (strcmp(o, "--keys-url") == 0) {
      if (strncmp(a, "http://", 7) != 0 && strncmp(a, "https://", 8) != 0) {
        fprintf(stderr, "osr-dataplane: --keys-url must be http:// or https://\n");
        return 2;
      }
      cfg.keys_url = a;
    } else if (strcmp(o, "--keys-refresh-ms") == 0) {
      if (num_arg(a, &v) != 0 || v < 100) {
        fprintf(stderr, "osr-dataplane: bad --keys-refresh-ms\n");
        return 2;
      }
      cfg.keys_refresh_ms = v;
    } else if (strcmp(o, "--activity-interval-ms") == 0) {
      if (num_arg(a, &v) != 0 || v < 100 || v > 3600000) {
        fprintf(stderr, "osr-dataplane: bad --activity-interval-ms (100..3600000)\n");
        return 2;
      }
      cfg.activity_interval_ms = v;
    } else if (strcmp(o, "--activity-max") == 0) {
      if (num_arg(a, &v) != 0 || v == 0 || v > 10000000) {
        fprintf(stderr, "osr-dataplane: bad --activity-max\n");
        return 2;
      }
      cfg.activity_max = (size_t)v;
    } else if (strcmp(o, "--gateway-url") == 0) {
      if (strncmp(a, "http://", 7) != 0 && strncmp(a, "https://", 8) != 0) {
        fprintf(stderr, "osr-dataplane: --gateway-url must be http:// or https://\n");
        return 2;
      }
      cfg.gateway_url = a;
    } else if (strcmp(o, "--gateway-key-file") == 0) {
      if (read_secret(a, gw_key, sizeof(gw_key)) != 0)
        return 2;
      cfg.gateway_key = gw_key;
    } else if (strcmp(o, "--endpoint-ttl-ms") == 0) {
      if (num_arg(a, &v) != 0 || v < 10 || v > 3600000) {
        fprintf(stderr, "osr-dataplane: bad --endpoint-ttl-ms (10..3600000)\n");
        return 2;
      }
      cfg.endpoint_ttl_ms = v;
    } else if (strcmp(o, "--metrics-key-file") == 0) {
      if (read_secret(a, metrics_key, sizeof(metrics_key)) != 0)
        return 2;
      cfg.metrics_key = metrics_key;
    } else if (strcmp(o, "--exec-mux") == 0) {
      if (strcmp(a, "on") != 0 && strcmp(a, "off") != 0) {
        fprintf(stderr, "osr-dataplane: --exec-mux is on or off\n");
        return 2;
      }
      cfg.exec_mux_off = strcmp(a, "off") == 0;
    } else if (strcmp(o, "--exec-mux-conns") == 0) {
      if (num_arg(a, &v) != 0 || v == 0 || v > 100000) {
        fprintf(stderr, "osr-dataplane: bad --exec-mux-conns (1..100000)\n");
        return 2;
      }
      cfg.exec_mux_conns = (size_t)v;
    } else if (strcmp(o, "--exec-mux-sessions") == 0) {
      if (num_arg(a, &v) != 0 || v == 0 || v > 100000) {
        fprintf(stderr, "osr-dataplane: bad --exec-mux-sessions (1..100000)\n");
        return 2;
      }
      cfg.exec_mux_sessions = (size_t)v;
    } else if (strcmp(o, "--exec-mux-idle-ms") == 0) {
      if (num_arg(a, &v) != 0 || v < 100 || v > 86400000) {
        fprintf(stderr, "osr-dataplane: bad --exec-mux-idle-ms (100..86400000)\n");
        return 2;
      }
      cfg.exec_mux_idle_ms = v;
    } else if (strcmp(o, "--redis") == 0) {
      cfg.redis_url = a;
    } else if (strcmp(o, "--domain") == 0) {
      cfg.domain = a;
    } else if (strcmp(o, "--tls-cert") == 0) {
      cfg.tls_cert = a;
    } else if (strcmp(o, "--tls-key") == 0) {
      cfg.tls_key = a;
    } else if (strcmp(o, "--max-conns") == 0) {
      if (num_arg(a, &v) != 0 || v == 0 || v > 10000000) {
        fprintf(stderr, "osr-dataplane: bad --max-conns\n");
        return 2;
      }
      cfg.max_conns = (size_t)v;
    } else if (strcmp(o, "--grace-ms") == 0) {
      if (num_arg(a, &v) != 0) {
        fprintf(stderr, "osr-dataplane: bad --grace-ms\n");
        return 2;
      }
      g_grace_ms = v;
    } else if (strcmp(o, "--log-level") == 0) {
      osr_log_level_t l;
      if (osr_log_parse_level(a, &l) != 0) {
        fprintf(stderr, "osr-dataplane: bad --log-level\n");
        return 2;
      }
      osr_log_set_level(l);
    } else {
      fprintf(stderr, "osr-dataplane: unknown flag %s\n", o);
      usage(stderr);
      return 2;
    }
  }
  if ((cfg.gateway_url == NULL) != (cfg.gateway_key == NULL)) {
    fprintf(stderr, "osr-dataplane: --gateway-url and --gateway-key-file go together\n");
    return 2;
  }
  if (cfg.nlisten == 0 || (cfg.keys_dir == NULL && cfg.keys_url == NULL) ||
      (cfg.keys_dir != NULL && cfg.keys_url != NULL) ||
      ((cfg.tls_cert == NULL) != (cfg.tls_key == NULL))) {
    fprintf(stderr, "osr-dataplane: need --listen, exactly one of --keys-dir/--keys-url, "
                    "and --tls-cert together with --tls-key\n");
    usage(stderr);
    return 2;
  }
  /* The agent secret (docs/tokens.md): named, it must load; by default the
   * gateway's <keys_dir>/agent.secret is used when it is there, and without
   * one the agents must be running open. */
  {
    char path[4096], err[512];
    int explicit_file = secret_file != NULL;
    if (!explicit_file && cfg.keys_dir != NULL) {
      snprintf(path, sizeof(path), "%s/%s", cfg.keys_dir, OSR_AGENT_SECRET_FILE);
      secret_file = path;
    }
    if (secret_file != NULL) {
      int rv = osr_agent_secret_load(secret_file, 0, secret, err, sizeof(err));
      if (rv == 0) {
        cfg.agent_secret = secret;
      } else if (explicit_file || rv != OSR_ENOENT) {
        fprintf(stderr, "osr-dataplane: agent secret: %s\n", err);
        return 2;
      } else {
        OSR_LOG_WARN("dataplane", "no agent secret (%s): upstream requests carry no agent token",
                     err);
      }
    }
  }
  signal(SIGPIPE, SIG_IGN);
  uv_loop_t *loop = uv_default_loop();
  int rv = osr_dataplane_start(loop, &cfg, &g_dp);
  memset(secret, 0, sizeof(secret)); /* copied by start */
  memset(gw_key, 0, sizeof(gw_key));
  memset(metrics_key, 0, sizeof(metrics_key));
  if (rv != 0) {
    uv_run(loop, UV_RUN_DEFAULT); /* let a partial start close itself */
    uv_loop_close(loop);
    return 1;
  }
  uv_signal_init(loop, &g_sigterm);
  uv_signal_init(loop, &g_sigint);
  uv_signal_start(&g_sigterm, on_signal, SIGTERM);
  uv_signal_start(&g_sigint, on_signal, SIGINT);
  /* Machine-readable start-up lines on stdout (tests, supervisors). */
  for (size_t i = 0; i < cfg.nlisten; i++)
    printf("listening %s %d\n", cfg.listen[i], osr_dataplane_port(g_dp, i));
  printf("ready\n");
  fflush(stdout);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  return 0;
}
