/*
 * `osr serve`: the embedded default, the gateway on this machine. It takes
 * the gateway's flags (gw.h osr_gw_config_load) plus --print-config, which
 * prints the effective configuration with secrets redacted and exits, so
 * the precedence of file, environment and flags can be checked without
 * starting anything.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "dataplane/dataplane.h"
#include "gateway/activity.h"
#include "gateway/gateway.h"
#include "gateway/gw.h"
#include "util/log.h"
#include "util/mem.h"

/* ---- the embedded data plane ---------------------------------------------
 * `osr serve` is the whole product on one machine: the data plane runs in
 * the same process and loop, verifying with the gateway's own keyring (no
 * key files to poll) and revoking through the gateway's Redis channel.
 * `osr-gateway` does not embed it: gateway deployments run osr-dataplane. */

typedef struct serve_dp_s {
  osr_dataplane_t *dp;
  osr_gw_t *gw;                  /* activity reports go straight into its store */
  uint64_t activity_interval_ms; /* --activity-interval-ms / OSR_ACTIVITY_INTERVAL_MS */
  char domain[256];              /* the data plane's Host-form domain (its config points here) */
  void (*done)(void *arg);
  void *arg;
} serve_dp_t;

static void dp_attach(void *data, osr_gw_t *gw)
{
  ((serve_dp_t *)data)->gw = gw;
}

/* In process there is no transport to lose a report: each active sandbox
 * goes straight to osr_store_touch at the end of every interval. */
static void dp_activity(void *data, const char *sandbox_id, int64_t at_ms)
{
  serve_dp_t *s = data;
  if (s->gw != NULL)
    osr_gw_activity_report(s->gw, sandbox_id, at_ms);
}

static int dp_start(void *data, uv_loop_t *loop, const osr_gw_config_t *gcfg,
                    const osr_keyring_t *kr, const uint8_t *agent_secret)
{
  serve_dp_t *s = data;
  osr_dataplane_config_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  /* The Host form <port>-<id>.<domain> for the domain the E2B front door
   * hands out (getHost()); the data plane matches host names, so no port. */
  if (osr_gw_e2b_domain(gcfg, s->domain, sizeof(s->domain)) == 0 && s->domain[0] != '\0') {
    s->domain[strcspn(s->domain, ":")] = '\0';
    cfg.domain = s->domain;
  }
  cfg.listen[0] = gcfg->dataplane_listen != NULL ? gcfg->dataplane_listen : "127.0.0.1:7071";
  cfg.nlisten = 1;
  cfg.keyring = kr;
  cfg.redis_url = gcfg->redis_url != NULL && gcfg->redis_url[0] != '\0' ? gcfg->redis_url : NULL;
  cfg.agent_secret = agent_secret;
  cfg.activity_cb = dp_activity;
  cfg.activity_data = s;
  cfg.activity_interval_ms = s->activity_interval_ms;
  int rv = osr_dataplane_start(loop, &cfg, &s->dp);
  if (rv != 0) {
    s->dp = NULL;
    return rv;
  }
  /* Tests and scripts parse this line (not "listening on": that is the API's). */
  OSR_LOG_INFO("serve", "data plane serving %s (port %d)", cfg.listen[0],
               osr_dataplane_port(s->dp, 0));
  return 0;
}

static void dp_stopped(void *data)
{
  serve_dp_t *s = data;
  s->dp = NULL;
  s->done(s->arg);
}

static void dp_stop(void *data, uint64_t grace_ms, void (*done)(void *arg), void *arg)
{
  serve_dp_t *s = data;
  s->done = done;
  s->arg = arg;
  osr_dataplane_stop(s->dp, grace_ms, dp_stopped, s);
}

static int parse_ms(const char *s, uint64_t *out)
{
  char *end;
  unsigned long long v = strtoull(s, &end, 10);
  if (*s == '\0' || *end != '\0' || v < 100 || v > 3600000)
    return -1;
  *out = v;
  return 0;
}

int cli_cmd_serve(int argc, char **argv)
{
  int print = 0, rv;
  char err[1024];
  char **args = osr_xcalloc((size_t)argc + 1, sizeof(char *));
  int n = 0;

  /* The embedded data plane's report interval (docs/dataplane.md,
   * "Activity"): the gateway's configuration does not know the data plane,
   * so the flag is taken here, before the gateway parses the rest. */
  uint64_t act_ms = 0;
  const char *env = getenv("OSR_ACTIVITY_INTERVAL_MS");
  if (env != NULL && *env != '\0' && (parse_ms(env, &act_ms) != 0)) {
    fprintf(stderr, "osr serve: bad OSR_ACTIVITY_INTERVAL_MS (100..3600000)\n");
    osr_free(args);
    return CLI_EUSAGE;
  }
  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--print-config") == 0) {
      print = 1;
    } else if (strcmp(argv[i], "--activity-interval-ms") == 0) {
      if (i + 1 >= argc || parse_ms(argv[i + 1], &act_ms) != 0) {
        fprintf(stderr, "osr serve: --activity-interval-ms needs 100..3600000\n");
        osr_free(args);
        return CLI_EUSAGE;
      }
      i++;
    } else {
      args[n++] = argv[i];
    }
  }
  for (int i = 0; i < n; i++) {
    if (strcmp(args[i], "--help") == 0 || strcmp(args[i], "-h") == 0) {
      osr_gw_config_usage(stdout, "osr serve");
      printf("  --print-config           print the effective configuration (secrets redacted) as\n"
             "                           JSON and exit\n"
             "  --activity-interval-ms N how often the embedded data plane reports sandbox\n"
             "                           activity for idle timeouts (OSR_ACTIVITY_INTERVAL_MS,\n"
             "                           default 5000)\n");
      osr_free(args);
      return CLI_OK;
    }
  }
  if (!print) {
    serve_dp_t sdp;
    memset(&sdp, 0, sizeof(sdp));
    sdp.activity_interval_ms = act_ms;
    osr_gateway_embed_t embed = {dp_start, dp_stop, &sdp, dp_attach};
    rv = osr_gateway_main_embed(n, args, "osr serve", &embed);
    osr_free(args);
    return rv;
  }

  osr_gw_config_t cfg;
  rv = osr_gw_config_load(&cfg, n, args, err, sizeof(err));
  osr_free(args);
  if (rv == 1) {
    osr_gw_config_usage(stdout, "osr serve");
    return CLI_OK;
  }
  if (rv != 0) {
    fprintf(stderr, "osr serve: %s\n", err);
    return CLI_EUSAGE;
  }
  json_t *j = osr_gw_config_to_json_redacted(&cfg);
  char *s = json_dumps(j, JSON_INDENT(2));
  printf("%s\n", s != NULL ? s : "{}");
  osr_json_free(s);
  json_decref(j);
  osr_gw_config_dispose(&cfg);
  return CLI_OK;
}
