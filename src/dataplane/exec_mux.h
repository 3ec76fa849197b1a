/*
 * Shared HTTP/2 (h2c, prior knowledge) connections from the data plane to
 * agent endpoints, for the exec console's upstream calls (docs/dataplane.md
 * "How exec upstreams are multiplexed").
 *
 * An exec session needs a long output stream (process.Start/Connect) and,
 * while it runs, unary control calls (SendInput, CloseStdin, Update). Each
 * of those is an HTTP/2 stream on one connection per agent endpoint shared
 * by many sessions, instead of one or two connections per session: a
 * session then costs the data plane one descriptor (its client's) instead
 * of three.
 *
 * A session takes a lease on a connection (osr__dp_mux_acquire) and gives
 * it back once its requests are over (osr__dp_mux_release). A connection
 * carries at most `exec_mux_sessions` leases, and never more than half the
 * agent's SETTINGS_MAX_CONCURRENT_STREAMS (two streams per session at
 * most: the output stream and one control call); past that another
 * connection is opened, up to `exec_mux_conns` per endpoint. Connections
 * without leases close after `exec_mux_idle_ms`.
 *
 * Flow control stays per stream: the client layer sends no WINDOW_UPDATE
 * for a held output chunk (net/http.h BODY FLOW CONTROL), and the
 * connection window is sized to every session's stream window, so a
 * session whose client stops reading stops only its own stream.
 *
 * A connection that dies fails the streams on it, i.e. only the sessions
 * leased to it; the next acquire opens a fresh one. An endpoint whose
 * connection died before its first SETTINGS frame does not speak h2c:
 * osr__dp_mux_refused() marks it, and osr__dp_mux_usable() then sends its
 * sessions down the per-session HTTP/1.1 path for DP_MUX_REFUSED_MS.
 */
#ifndef OSR_DATAPLANE_EXEC_MUX_H
#define OSR_DATAPLANE_EXEC_MUX_H

#include "dataplane/dp_int.h"

typedef struct dp_mux_s dp_mux_t;
typedef struct dp_muxconn_s dp_muxconn_t;
typedef struct dp_mux_lease_s dp_mux_lease_t;

/** Fires once for a lease that was not attached at once: status 0 and
 *  l->client set, or an error (the lease is then already given back). */
typedef void (*dp_mux_cb)(dp_mux_lease_t *l, int status);

/** A session's hold on a shared connection, embedded in the session. */
struct dp_mux_lease_s {
  /** The shared client, valid from attachment until release. Requests on
   *  it belong to the session; the client itself to the mux (never close
   *  it: cancel your own requests). */
  osr_http_client_t *client;
  /* private */
  dp_muxconn_t *_conn;
  dp_mux_lease_t *_next; /* waiting for the connection to come up */
  dp_mux_cb _cb;
};

/** May exec sessions to `addr` use a shared connection? 0 when the
 *  endpoint uses TLS, multiplexing is turned off (exec_mux_conns 0), or
 *  the endpoint refused h2c within DP_MUX_REFUSED_MS. */
int osr__dp_mux_usable(osr_dataplane_t *dp, const char *addr, int tls);

/** Lease a shared connection to `addr`. Returns 1 when attached now
 *  (l->client is set, cb never fires), 0 when a connection is coming up
 *  (cb fires once), or an error and cb never fires: OSR_EBUSY when every
 *  connection is full and the endpoint has exec_mux_conns of them, or
 *  the connect error. */
int osr__dp_mux_acquire(osr_dataplane_t *dp, const char *addr, dp_mux_lease_t *l, dp_mux_cb cb);

/** Give the lease back (attached: every request the session made on it is
 *  over; waiting: cb then never fires). A no-op for an idle lease. */
void osr__dp_mux_release(dp_mux_lease_t *l);

/** Is the lease holding a connection or waiting for one? */
int osr__dp_mux_is_leased(const dp_mux_lease_t *l);

/** `addr` does not speak h2c: its sessions take the HTTP/1.1 path for a
 *  while (see above). */
void osr__dp_mux_refused(osr_dataplane_t *dp, const char *addr);

/** Close connections without leases idle for `max_idle_ms` or dead (0:
 *  every one without leases, and forget refusals: stop), and free the
 *  table once it is empty and the data plane is stopping. */
void osr__dp_mux_sweep(osr_dataplane_t *dp, uint64_t max_idle_ms);

/** Is a connect still to call back? (Stop waits for it: the callback
 *  needs the data plane.) */
int osr__dp_mux_busy(const osr_dataplane_t *dp);

/** Live shared connections (all endpoints), for logs and tests. */
size_t osr__dp_mux_nconns(const osr_dataplane_t *dp);

#endif
