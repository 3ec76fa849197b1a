/*
 * osr: the OSR command line. `osr serve` runs OSR on this machine (the
 * embedded default); the other commands are clients of a running gateway's
 * HTTP API (docs/cli.md). Exit codes are a contract with scripts: see
 * cli.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "osr_config.h"
#include "util/mem.h"

static const char global_help[] =
    "global options (before or after the command):\n"
    "  --url URL        gateway API (default " CLI_DEFAULT_URL "; env OSR_URL)\n"
    "  --key KEY        API key (env OSR_KEY; for a local URL, default: <data dir>/admin.key)\n"
    "  --json           print the API's JSON answer exactly (for scripts)\n"
    "  --ca FILE        PEM CA bundle to verify an https:// gateway\n"
    "  --h2c            speak HTTP/2 with prior knowledge on http:// URLs\n"
    "  --timeout S      request timeout in seconds (default 30; env OSR_TIMEOUT). For create\n"
    "                   and plan, --timeout after the command is the sandbox TTL: put this\n"
    "                   one before the command or use --request-timeout\n"
    "exit codes: 0 ok, 1 API error, 2 usage error, 3 gateway unreachable, 4 not found,\n"
    "            5 unauthorized/forbidden\n";

static const char sandbox_flags[] =
    "  --template T          template (image) id\n"
    "  --gpu N[:TYPE]        GPUs, optionally of one type (e.g. 1:a100)\n"
    "  --snapshot            needs filesystem snapshot/restore\n"
    "  --port P              a port to expose (repeatable)\n"
    "  --memory MIB          minimum memory in MiB\n"
    "  --vcpus N             vCPUs\n"
    "  --region R            region\n"
    "  --isolation I         isolation floor: container | gvisor | firecracker\n"
    "  --strategy S          cost | latency | balanced | order | pin:<provider>\n"
    "  --allow P / --deny P  only / never these providers (repeatable)\n"
    "  --max-cost X          budget in USD per hour\n"
    "  --timeout S           absolute lifetime in seconds\n"
    "  --idle-timeout S      end after S seconds without data-plane traffic\n"
    "  --env K=V             environment variable for the sandbox (repeatable)\n"
    "  --meta K=V            metadata (repeatable; `osr ls --meta` filters on it)\n";

typedef struct cmd_s {
  const char *name;
  const char *usage;
  const char *help;
  int (*run)(cli_t *c, int argc, char **argv);
  int sandbox_flags; /* append sandbox_flags to help */
} cmd_t;

static const cmd_t cmds[] = {
    {"create", "osr create [flags]",
     "Create a sandbox and print it (id, binding, data-plane URL, token).\n", cli_cmd_create, 1},
    {"plan", "osr plan [flags]",
     "Dry run of placement: every provider, whether it passed each filter and why not,\n"
     "its score and the order in which providers would be tried. Nothing is created.\n",
     cli_cmd_plan, 1},
    {"ls", "osr ls [--state S] [--meta K=V]... [--limit N] [--all-pages] [--tenant T]",
     "List sandboxes, newest page first (--all-pages follows every page).\n"
     "  --state S        creating | running | paused | ended | failed | lost (comma list)\n"
     "  --meta K=V       only sandboxes whose metadata has K=V (repeatable)\n"
     "  --limit N        page size (1..1000, default 100)\n"
     "  --all-pages      fetch every page\n"
     "  --tenant T       (admin key) another tenant's sandboxes\n",
     cli_cmd_ls, 0},
    {"get", "osr get ID", "Show one sandbox.\n", cli_cmd_get, 0},
    {"kill", "osr kill ID...",
     "Destroy sandboxes. Exit code is the worst of the individual results.\n", cli_cmd_kill, 0},
    {"providers", "osr providers",
     "Configured providers: capabilities, prices, health and circuit-breaker state.\n",
     cli_cmd_providers, 0},
    {"keys", "osr keys create --tenant T [--name N] [--admin] | ls [--tenant T] | revoke ID",
     "Manage API keys (admin key required to create and revoke).\n"
     "  create   prints the new key once: store it, it cannot be shown again\n"
     "  ls       lists key ids, tenants and roles (never secrets)\n"
     "  revoke   revokes a key by its id (k_...)\n",
     cli_cmd_keys, 0},
    {"doctor", "osr doctor [--config FILE] [config flags]",
     "Check this machine's OSR setup; each check prints OK, WARN or FAIL and how to fix it:\n"
     "configuration, data directory, store, Redis, provider adapters, local runtimes\n"
     "(runsc, bwrap, crun) and the gateway at --url. Exits 1 if any check FAILs.\n"
     "Takes the same configuration flags as `osr serve` (see osr serve --help).\n",
     cli_cmd_doctor, 0},
};

static void usage(FILE *f)
{
  fprintf(f, "usage: osr <command> [options]\n"
             "commands:\n"
             "  serve      run OSR on this machine (see `osr serve --help`)\n"
             "  create     create a sandbox\n"
             "  plan       show where a sandbox would be placed, and why\n"
             "  ls         list sandboxes\n"
             "  get        show a sandbox\n"
             "  kill       destroy sandboxes\n"
             "  providers  show providers, health and breaker state\n"
             "  keys       manage API keys\n"
             "  doctor     check the setup and say how to fix what is missing\n"
             "  version    print the version\n"
             "Run `osr <command> --help` for its options.\n\n");
  fputs(global_help, f);
}

static void cmd_help(const cmd_t *cmd)
{
  printf("usage: %s\n\n%s", cmd->usage, cmd->help);
  if (cmd->sandbox_flags) {
    fputs(sandbox_flags, stdout);
    if (strcmp(cmd->name, "create") == 0)
      fputs("  --idempotency-key K   retrying with the same key returns the same sandbox\n",
            stdout);
  }
  fputc('\n', stdout);
  fputs(global_help, stdout);
}

int main(int argc, char **argv)
{
  if (osr_mem_install_deps() != 0)
    fprintf(stderr, "osr: allocator hooks not installed\n");
  if (argc < 2) {
    usage(stderr);
    return CLI_EUSAGE;
  }

  /* `osr serve` takes the gateway's flags as they are. */
  if (strcmp(argv[1], "serve") == 0)
    return cli_cmd_serve(argc - 2, argv + 2);

  cli_t c;
  memset(&c, 0, sizeof(c));
  c.url = getenv("OSR_URL");
  if (c.url == NULL || c.url[0] == '\0')
    c.url = CLI_DEFAULT_URL;
  c.timeout_ms = 30000;
  const char *env_to = getenv("OSR_TIMEOUT");
  uint64_t secs;
  if (env_to != NULL && env_to[0] != '\0') {
    if (cli_parse_u64(env_to, 86400, &secs) != 0 || secs == 0) {
      fprintf(stderr, "osr: OSR_TIMEOUT=%s is not a number of seconds (1..86400)\n", env_to);
      return CLI_EUSAGE;
    }
    c.timeout_ms = secs * 1000;
  }

  /* Split the global options off; the rest goes to the command. */
  const cmd_t *cmd = NULL;
  const char *cmdname = NULL;
  char **rest = osr_xcalloc((size_t)argc + 1, sizeof(char *));
  int nrest = 0, help = 0, rv = CLI_OK, dashdash = 0;
  for (int i = 1; i < argc; i++) {
    const char *v;
    int m;
    if (dashdash) {
      rest[nrest++] = argv[i];
      continue;
    }
    if (strcmp(argv[i], "--") == 0) {
      dashdash = 1;
      rest[nrest++] = argv[i];
      continue;
    }
    if ((m = cli_opt(argc, argv, &i, "--url", &v)) != 0) {
      if (m < 0)
        goto usage_err;
      c.url = v;
    } else if ((m = cli_opt(argc, argv, &i, "--key", &v)) != 0) {
      if (m < 0)
        goto usage_err;
      c.key = v;
    } else if ((m = cli_opt(argc, argv, &i, "--ca", &v)) != 0) {
      if (m < 0)
        goto usage_err;
      c.ca = v;
    } else if (strcmp(argv[i], "--json") == 0) {
      c.json = 1;
    } else if (strcmp(argv[i], "--h2c") == 0) {
      c.h2c = 1;
    } else if ((cmdname == NULL ||
                (strcmp(cmdname, "create") != 0 && strcmp(cmdname, "plan") != 0)) &&
               (m = cli_opt(argc, argv, &i, "--timeout", &v)) != 0) {
      goto timeout;
    } else if ((m = cli_opt(argc, argv, &i, "--request-timeout", &v)) != 0) {
    timeout:
      if (m < 0)
        goto usage_err;
      if (cli_parse_u64(v, 86400, &secs) != 0 || secs == 0) {
        fprintf(stderr, "osr: --timeout wants seconds (1..86400), got '%s'\n", v);
        goto usage_err;
      }
      c.timeout_ms = secs * 1000;
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      help = 1;
    } else if (cmdname == NULL && argv[i][0] != '-') {
      cmdname = argv[i];
    } else if (cmdname == NULL) {
      fprintf(stderr, "osr: unknown option %s before the command\n", argv[i]);
      goto usage_err;
    } else {
      rest[nrest++] = argv[i];
    }
  }

  if (cmdname == NULL) {
    usage(help ? stdout : stderr);
    rv = help ? CLI_OK : CLI_EUSAGE;
    goto out;
  }
  if (strcmp(cmdname, "version") == 0) {
    printf("osr %s (tls %s)\n", OSR_VERSION, OSR_TLS_BACKEND);
    goto out;
  }
  if (strcmp(cmdname, "help") == 0) {
    const cmd_t *hc = NULL;
    for (size_t k = 0; nrest > 0 && k < OSR_ARRAY_SIZE(cmds); k++)
      if (strcmp(cmds[k].name, rest[0]) == 0)
        hc = &cmds[k];
    if (hc != NULL)
      cmd_help(hc);
    else
      usage(stdout);
    goto out;
  }
  for (size_t k = 0; k < OSR_ARRAY_SIZE(cmds); k++)
    if (strcmp(cmds[k].name, cmdname) == 0)
      cmd = &cmds[k];
  if (cmd == NULL) {
    fprintf(stderr, "osr: unknown command '%s'\n", cmdname);
    usage(stderr);
    goto usage_err;
  }
  if (help) {
    cmd_help(cmd);
    goto out;
  }
  cli_resolve_key(&c);
  rv = cmd->run(&c, nrest, rest);
  goto out;

usage_err:
  rv = CLI_EUSAGE;
out:
  osr_free(rest);
  osr_free(c.key_owned);
  fflush(stdout);
  return rv;
}
