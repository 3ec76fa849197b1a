/*
 * `osr serve`: the embedded default, the gateway on this machine. It takes
 * the gateway's flags (gw.h osr_gw_config_load) plus --print-config, which
 * prints the effective configuration with secrets redacted and exits, so
 * the precedence of file, environment and flags can be checked without
 * starting anything.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "gateway/gateway.h"
#include "gateway/gw.h"
#include "util/mem.h"

int cli_cmd_serve(int argc, char **argv)
{
  int print = 0, rv;
  char err[1024];
  char **args = osr_xcalloc((size_t)argc + 1, sizeof(char *));
  int n = 0;

  for (int i = 0; i < argc; i++) {
    if (strcmp(argv[i], "--print-config") == 0)
      print = 1;
    else
      args[n++] = argv[i];
  }
  for (int i = 0; i < n; i++) {
    if (strcmp(args[i], "--help") == 0 || strcmp(args[i], "-h") == 0) {
      osr_gw_config_usage(stdout, "osr serve");
      printf("  --print-config           print the effective configuration (secrets redacted) as\n"
             "                           JSON and exit\n");
      osr_free(args);
      return CLI_OK;
    }
  }
  if (!print) {
    rv = osr_gateway_main(n, args, "osr serve");
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
