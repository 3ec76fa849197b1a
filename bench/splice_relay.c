/*
 * splice_relay: the floor of the 1 GiB download row (bench/dataplane_bench.py
 * path "splice-relay", --only-big). The least a user-space TCP proxy can do:
 * per accepted connection, a connection to the backend and two blocking
 * threads, each moving one direction socket -> pipe -> socket with
 * splice(2) (1 MiB pipes, no parsing, no event loop, no copy). What it costs
 * the proxy's CPU is the kernel's loopback TCP work of a second hop, which
 * every proxy pays; so no proxy in that layout is faster than this.
 *
 *   splice_relay LISTEN_PORT BACKEND_PORT|unix:PATH
 *
 * With unix:PATH (osr-agent's socket) it is the same floor for the exec
 * stdout row (path "splice-relay proto"): the agent's Connect stream passed
 * through byte for byte.
 *
 * Bench tool: libc + pthreads, 127.0.0.1 only, runs until killed.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

typedef struct dir_s {
  int from, to;
} dir_t;

static int unix_to(const char *path)
{
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  if (fd < 0 || strlen(path) >= sizeof(a.sun_path)) {
    if (fd >= 0)
      close(fd);
    return -1;
  }
  strcpy(a.sun_path, path);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    perror("connect");
    close(fd);
    return -1;
  }
  return fd;
}

static int tcp_to(int port)
{
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    perror("connect");
    if (fd >= 0)
      close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd;
}

/* One direction until EOF or an error, then the peer's write half is shut. */
static void *pump(void *arg)
{
  dir_t *d = arg;
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    perror("pipe2");
    return NULL;
  }
  (void)fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
  for (;;) {
    ssize_t n = splice(d->from, NULL, p[1], NULL, 1 << 20, SPLICE_F_MOVE);
    if (n <= 0)
      break;
    while (n > 0) {
      ssize_t w = splice(p[0], NULL, d->to, NULL, (size_t)n, SPLICE_F_MOVE);
      if (w <= 0)
        goto out;
      n -= w;
    }
  }
out:
  shutdown(d->to, SHUT_WR);
  close(p[0]);
  close(p[1]);
  return NULL;
}

typedef struct conn_s {
  int c, b;
} conn_t;

static void *serve(void *arg)
{
  conn_t *k = arg;
  dir_t up = {k->c, k->b}, down = {k->b, k->c};
  pthread_t t;
  if (pthread_create(&t, NULL, pump, &up) == 0) {
    pump(&down);
    pthread_join(t, NULL);
  }
  close(k->c);
  close(k->b);
  free(k);
  return NULL;
}

int main(int argc, char **argv)
{
  if (argc != 3) {
    fprintf(stderr, "usage: splice_relay LISTEN_PORT BACKEND_PORT|unix:PATH\n");
    return 2;
  }
  const char *upath = strncmp(argv[2], "unix:", 5) == 0 ? argv[2] + 5 : NULL;
  int bport = upath != NULL ? 0 : atoi(argv[2]);
  int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1]))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 128) != 0) {
    perror("listen");
    return 1;
  }
  for (;;) {
    int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0)
      continue;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    int b = upath != NULL ? unix_to(upath) : tcp_to(bport);
    if (b < 0) {
      close(c);
      continue;
    }
    conn_t *k = malloc(sizeof(*k));
    pthread_t t;
    if (k == NULL) {
      close(c);
      close(b);
      continue;
    }
    k->c = c;
    k->b = b;
    if (pthread_create(&t, NULL, serve, k) != 0) {
      close(c);
      close(b);
      free(k);
      continue;
    }
    pthread_detach(t);
  }
}
