/*
 * osr-agent: the in-sandbox agent speaking E2B's envd contract
 * (docs/agent.md, ../shared/reference/e2b-contract.md §3-§7).
 *
 * One libuv loop, one HTTP server (src/net/http.h: HTTP/1.1 and h2c) on
 * every --listen address. Modules:
 *   main.c       flags, listeners, routing, the access token, shutdown
 *   rpc.c        Connect unary calls and server streams on the HTTP API
 *   process.c    process.Process (spawn, output ring, re-attach, signals)
 *   fs.c         filesystem.Filesystem (thread-pool jobs) and WatchDir
 *   files.c      GET/POST /files (streamed through uv_fs_*)
 *   ports.c      GET /_osr/ports/{port}: raw TCP forwarding (OSR extension)
 *   connect.c, ring.c, multipart.c: pure parsers/buffers (unit-tested, fuzzed)
 */
#ifndef OSR_AGENT_AGENT_H
#define OSR_AGENT_AGENT_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "agent/connect.h"
#include "net/http.h"

/** The envd API version osr-agent implements, advertised to E2B SDKs as
 *  `envdVersion` (contract §7): octet-stream uploads and CloseStdin exist,
 *  so 0.5.7; the 0.6.x gates (metadata, includeEntry, network-mount
 *  watches) stay off. The local provider reads it from here (or from
 *  `osr-agent --version`). */
#define OSR_AGENT_ENVD_VERSION "0.5.7"

#define OSR_AGENT_DEFAULT_RING      (1024 * 1024)
#define OSR_AGENT_DEFAULT_MAX_PROCS 256
/** Largest unary request body or stream request message. */
#define OSR_AGENT_MAX_RPC_BODY (8 * 1024 * 1024)
/** Output chunks (data events) are at most this large, as envd's. */
#define OSR_AGENT_CHUNK (32 * 1024)
/** ... except in the binary codec (procpb.h), whose clients (the data plane)
 *  take larger frames: fewer frames and system calls per byte. */
#define OSR_AGENT_BIN_CHUNK (256 * 1024)
/** Largest read from a process's output (bounded by half the ring too). */
#define OSR_AGENT_READ (256 * 1024)
/** How long an exited process's end event is kept for Connect (envd: 30 s). */
#define OSR_AGENT_RETAIN_MS 30000

typedef struct agent_s agent_t;
typedef struct agent_proc_s agent_proc_t;

/** A Linux user the agent acts as (resolved in the thread pool). */
typedef struct agent_user_s {
  char name[64];
  char home[1024];
  uid_t uid;
  gid_t gid;
  int switch_ids; /**< 1 if children must setuid/setgid to uid/gid */
} agent_user_t;

struct agent_s {
  uv_loop_t *loop;
  osr_http_server_t *server;
  char *token; /**< NULL: no access token (open) */
  size_t ring_bytes;
  size_t max_procs;
  char *workdir;         /**< default cwd (owned), NULL = the user's home; set by --workdir
                              or POST /init defaultWorkdir. Loop thread only: jobs copy it. */
  char default_user[64]; /**< user for requests that name none ("" = the agent's own);
                              --default-user, POST /init defaultUser, or "user" when the
                              agent runs as root and that user exists (envd's default) */
  char **envs;           /**< --env K=V (sandbox env vars), NULL-terminated */
  size_t nenvs;
  int64_t init_ts_ns; /**< newest POST /init timestamp applied (envd's lastSetTime) */
  agent_user_t self;  /**< who the agent runs as */
  int is_root;
  int shutting_down;
  /* process table */
  agent_proc_t *procs; /* doubly linked */
  size_t nprocs;
};

extern agent_t osr__agent;

/* ---- users (main.c) --------------------------------------------------------- */

/** Resolve `name` (NULL or "" = the agent's own user) into *out. Blocking
 *  (getpwnam_r): call only from the thread pool. Falls back to the agent's
 *  own user when the agent is not root or the user does not exist. */
void osr__agent_resolve_user(const agent_t *a, const char *name, agent_user_t *out);

/** Whether osr__agent_resolve_user(a, name) is the agent's own user
 *  without a lookup (NULL, "" or its own name, or an agent that is not
 *  root): then it does no I/O and may run on the loop thread. */
int osr__agent_user_is_self(const agent_t *a, const char *name);

/** The username from "Authorization: Basic base64(user:)" into out; the
 *  agent's default user (a->default_user, possibly "") if absent or
 *  malformed. Loop thread only. */
void osr__agent_req_username(const osr_http_req_t *req, char *out, size_t outsz);

/** Resolve `path` against `home` (relative paths, "~" and "~/..."), into
 *  out. Returns 0 or OSR_EINVAL (empty or too long). */
int osr__agent_abs_path(const char *path, const char *home, char *out, size_t outsz);

/* ---- Connect RPC glue (rpc.c) ------------------------------------------------ */

typedef struct agent_call_s agent_call_t;
typedef struct agent_stream_s agent_stream_t;

/** A unary or server-streaming call whose request message was parsed.
 *  Handlers reply exactly once (agent_call_reply / agent_call_error), now
 *  or later; `req` becomes NULL if the client went away meanwhile (the
 *  reply is then dropped). */
struct agent_call_s {
  agent_t *agent;
  osr_http_req_t *req; /**< NULL once the exchange is over */
  json_t *msg;         /**< the request message (owned by the call) */
  char username[64];   /**< from Authorization: Basic, "" if none */
  int64_t timeout_ms;  /**< Connect-Timeout-Ms, -1 if absent */
  int64_t keepalive_s; /**< Keepalive-Ping-Interval, default 90 */
  int is_stream;
  int binary; /**< stream in the protobuf codec (application/connect+proto, procpb.h) */
  /* private */
  int _replied;
  int _done; /* on_done fired */
  agent_stream_t *_stream;
};

typedef void (*agent_rpc_fn)(agent_call_t *call);

/** Route a request for /<service>/<method>. Returns 1 if the path is a
 *  known method (the request is then handled), 0 if not. */
int osr__agent_rpc_dispatch(agent_t *a, osr_http_req_t *req);

/** Unary success: send `resp` (stolen) as application/json. */
void agent_call_reply(agent_call_t *call, json_t *resp);
/** Unary or stream error (before the stream began: for a stream, this
 *  answers 200 + an end-of-stream frame carrying the error). */
void agent_call_error(agent_call_t *call, osr_cx_code_t code, const char *fmt, ...)
    OSR_PRINTF(3, 4);

/* Server streams. */
typedef struct agent_stream_events_s {
  /** The frame queue drained below the low watermark: produce more. */
  void (*on_writable)(agent_stream_t *st, void *data);
  /** The exchange is over (end-of-stream written, or the client left).
   *  The stream is freed right after this returns. */
  void (*on_close)(agent_stream_t *st, void *data);
} agent_stream_events_t;

/** Start the streaming response (200, application/connect+json) for a
 *  stream call. After this the call belongs to the stream. `keepalive`
 *  (may be NULL) is the JSON message sent after keepalive_s idle seconds. */
agent_stream_t *agent_stream_begin(agent_call_t *call, const agent_stream_events_t *ev, void *data,
                                   const char *keepalive);
/** Queue one message (stolen). Returns 0, or OSR_ETOOLARGE if the queue is
 *  over its hard cap (the caller ends the stream), OSR_ECLOSED after the
 *  exchange ended. */
int agent_stream_send(agent_stream_t *st, json_t *msg);
/** Queue one message given as JSON text (copied). Same returns. */
int agent_stream_send_raw(agent_stream_t *st, const char *json, size_t len);
/** Queue one message given as pieces (copied, concatenated): how binary
 *  data events go out without first assembling them. Same returns. */
int agent_stream_send_iov(agent_stream_t *st, const osr_iovec_t *iov, size_t n);
/** Bytes queued and not yet written. */
size_t agent_stream_queued(const agent_stream_t *st);
/** Finish: end-of-stream frame with `{}` or the error. No sends after. */
void agent_stream_end(agent_stream_t *st, osr_cx_code_t code, const char *msg);
/** Detach the owner: no more callbacks; the stream is ended (if not yet)
 *  and frees itself. */
void agent_stream_detach(agent_stream_t *st);

/** Low watermark for on_writable / the owner's "produce more" check. */
#define AGENT_STREAM_LOW (64 * 1024)

/* ---- services ------------------------------------------------------------------ */

void osr__agent_process_start(agent_call_t *call);
void osr__agent_process_connect(agent_call_t *call);
void osr__agent_process_list(agent_call_t *call);
void osr__agent_process_send_input(agent_call_t *call);
void osr__agent_process_close_stdin(agent_call_t *call);
void osr__agent_process_send_signal(agent_call_t *call);
void osr__agent_process_update(agent_call_t *call);
/** Kill every child process group (SIGKILL) and free the table. */
void osr__agent_process_shutdown(agent_t *a);

void osr__agent_fs_stat(agent_call_t *call);
void osr__agent_fs_list_dir(agent_call_t *call);
void osr__agent_fs_make_dir(agent_call_t *call);
void osr__agent_fs_move(agent_call_t *call);
void osr__agent_fs_remove(agent_call_t *call);
void osr__agent_fs_watch_dir(agent_call_t *call);

/** GET/POST /files. */
void osr__agent_files(agent_t *a, osr_http_req_t *req);
/** GET /_osr/ports/{port} with Upgrade: osr-tcp. */
void osr__agent_port_forward(agent_t *a, osr_http_req_t *req);

/** POST /init (envd's orchestrator call, docs/agent.md). */
void osr__agent_init(agent_t *a, osr_http_req_t *req);
/** Set (or add) one sandbox env var K=V in a->envs; `kv` is copied. */
void osr__agent_setenv(agent_t *a, const char *kv);
/** Parse an RFC 3339 time ("2024-01-02T03:04:05.123Z", "+01:00" offsets)
 *  into ns since the epoch. Returns 0 or -1. */
int osr__agent_parse_rfc3339(const char *s, int64_t *ns);

/** Send {"code":status,"message":msg} (the envd /files error shape). */
void osr__agent_send_http_error(osr_http_req_t *req, int status, const char *msg);

/** Entry info JSON of `path` (lstat + stat for symlinks, owner/group
 *  names). Blocking: thread pool only. Returns NULL and *err. */
json_t *osr__agent_entry_info(const char *path, int *err);

#endif
