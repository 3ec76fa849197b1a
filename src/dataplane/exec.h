/*
 * The exec console of the data plane (docs/dataplane.md "Exec console"):
 * a WebSocket speaking the Kubernetes channel protocol (v5.channel.k8s.io,
 * v4.channel.k8s.io) in front of the agent's envd process API.
 *
 * One session joins:
 *   - the client's WebSocket (binary messages, first byte = channel:
 *     0 stdin, 1 stdout, 2 stderr, 3 status, 4 resize, 255 close);
 *   - an output stream to the agent, process.Process/Start (a new process)
 *     or process.Process/Connect (re-attach by pid or tag, from an output
 *     offset), whose data events become channel 1/2 messages and whose end
 *     event becomes the channel 3 metav1.Status;
 *   - the unary calls the client causes: SendInput (channel 0), CloseStdin
 *     (channel 255, v5), Update (channel 4 resize of a pty). One call in
 *     flight at a time.
 * The output stream and the calls are HTTP/2 streams on a connection to
 * the agent shared with other sessions (exec_mux.h); where h2c is not
 * possible they get one HTTP/1.1 connection each (the stream connection
 * and the control connection). A shared connection lost under a started
 * session is replaced by a Connect from the session's output offset.
 *
 * The same session also runs over HTTP (POST to the same paths, HTTP/2 or
 * HTTP/1.1 with a chunked body): the request body carries input frames and
 * the response body output frames, each a 4-byte big-endian length of the
 * channel byte + payload, then the channel byte, then the payload (a
 * WebSocket message with a length prefix). The end of the request body
 * closes stdin. Channel 5 carries the osrInfo JSON there.
 *
 * Backpressure: output is parsed and sent one Connect frame at a time; when
 * the WebSocket's outgoing queue is full the upstream chunk is held (its
 * HTTP/2 stream gets no WINDOW_UPDATE, or the HTTP/1.1 socket stops reading;
 * the agent's ring fills, the process blocks in write()) until
 * on_writable. Input is buffered up to a cap and the WebSocket stops
 * reading above a watermark until SendInput drained it. Memory per session
 * is therefore bounded by the WebSocket queue cap, one Connect frame and
 * the stdin cap (exec.c, DP_EXEC_*).
 */
#ifndef OSR_DATAPLANE_EXEC_H
#define OSR_DATAPLANE_EXEC_H

#include "dataplane/dp_int.h"

/** Does this request name the exec console? Recognised paths:
 *  /v1/sandboxes/{id}/exec, /api/v1/namespaces/{ns}/pods/{id}/exec and the
 *  older /sbx/{id}/exec. Returns 1 and fills rt (sandbox id, port envd, path
 *  and query of the request), 0 when it is not an exec path, or OSR_EINVAL
 *  for an exec path with a malformed sandbox id. Pure. */
int osr__dp_exec_route(const osr_http_req_t *req, dp_route_t *rt);

/** Serve an authorised exec request: validate the query (400 on errors,
 *  nothing sent to the agent), accept the WebSocket (GET + Upgrade) or
 *  answer 200 to a POST stream, and start the session (any other request:
 *  400).
 *  `addr`/`tls` reach the agent (osr__dp_endpoint), `sid` names the sandbox
 *  (for the agent token). Answers the request in every case. */
void osr__dp_exec(osr_dataplane_t *dp, osr_http_req_t *req, const char *addr, int tls,
                  const char *sid);

/** End every exec session (called when the data plane starts to stop, so
 *  the status goes out before the WebSocket layer's own "going away"
 *  close): each gets a Failure status (503, ServiceUnavailable) if none was
 *  sent and the client can take it, then the close (1000 after a status,
 *  else 1001) or the end of its HTTP stream. Processes keep running. */
void osr__dp_execs_close(osr_dataplane_t *dp);

#endif
