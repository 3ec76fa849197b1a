/*
 * osr: the OSR command line. `osr serve` runs the embedded default (the
 * gateway on this machine); further subcommands arrive with the control-plane
 * API.
 */
#include <stdio.h>
#include <string.h>

#include "gateway/gateway.h"
#include "osr_config.h"

static void usage(FILE *f)
{
  fprintf(f, "usage: osr <command> [options]\n"
             "commands:\n"
             "  serve      run OSR on this machine (gateway; see `osr serve --help`)\n"
             "  version    print the version\n"
             "  help       this text\n");
}

int main(int argc, char **argv)
{
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "serve") == 0) {
    osr_gateway_config_t cfg;
    int rv = osr_gateway_parse_args(argc - 2, argv + 2, &cfg, "osr serve");
    if (rv != 0)
      return rv > 0 ? 0 : 2;
    return osr_gateway_run(&cfg);
  }
  if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0) {
    printf("osr %s (tls %s)\n", OSR_VERSION, OSR_TLS_BACKEND);
    return 0;
  }
  if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
    usage(stdout);
    return 0;
  }
  fprintf(stderr, "osr: unknown command '%s'\n", cmd);
  usage(stderr);
  return 2;
}
