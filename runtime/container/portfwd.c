/*
 * One connection to a TCP port inside a sandbox, for the node: `portfwd <init pid> <port>` joins
 * the network namespace of the sandbox's init, connects to the port on its loopback (127.0.0.1,
 * then ::1), and relays bytes between that socket and its own stdin/stdout until both directions
 * have ended. The sandbox gets no network for it: the connection starts and ends inside its
 * namespace, and the node holds the other side.
 *
 * Why a process: the node (Node.js) cannot enter another network namespace, and a socket made in
 * one can only be passed over SCM_RIGHTS, which Node cannot receive.
 *
 * stderr: "ok\n" once connected; otherwise "refused\n" (nothing listens: exit 3) or
 * "error <what>: <why>\n" (exit 2).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

static void die(const char *what) {
  dprintf(2, "error %s: %s\n", what, strerror(errno));
  _exit(2);
}

static int connect_to(int port) {
  struct sockaddr_in v4 = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  struct sockaddr_in6 v6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  struct {
    int family;
    struct sockaddr *addr;
    socklen_t len;
  } tries[] = {{AF_INET, (struct sockaddr *)&v4, sizeof v4}, {AF_INET6, (struct sockaddr *)&v6, sizeof v6}};
  int refused = 0;
  for (size_t i = 0; i < sizeof tries / sizeof *tries; i++) {
    int s = socket(tries[i].family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    if (connect(s, tries[i].addr, tries[i].len) == 0) return s;
    if (errno == ECONNREFUSED || errno == EADDRNOTAVAIL || errno == ENETUNREACH) refused = 1;
    close(s);
  }
  if (refused) {
    dprintf(2, "refused\n");
    _exit(3);
  }
  die("connect");
  return -1;
}

/* Copies what `from` has now to `to`; 0 at end of file. */
static int pass(int from, int to) {
  char buf[65536];
  ssize_t n = read(from, buf, sizeof buf);
  if (n < 0) return errno == EINTR || errno == EAGAIN ? 1 : 0;
  if (n == 0) return 0;
  for (ssize_t off = 0; off < n;) {
    ssize_t w = write(to, buf + off, (size_t)(n - off));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return 0;
    off += w;
  }
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    dprintf(2, "error usage: portfwd <pid> <port>\n");
    return 2;
  }
  int port = atoi(argv[2]);
  if (port < 1 || port > 65535) {
    dprintf(2, "error port: %s\n", argv[2]);
    return 2;
  }
  /* The node going away ends the connection. */
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  signal(SIGPIPE, SIG_IGN);
  char ns[64];
  snprintf(ns, sizeof ns, "/proc/%d/ns/net", atoi(argv[1]));
  int nsfd = open(ns, O_RDONLY | O_CLOEXEC);
  if (nsfd < 0) die("open the sandbox's network namespace");
  if (setns(nsfd, CLONE_NEWNET) < 0) die("join the sandbox's network namespace");
  close(nsfd);
  int s = connect_to(port);
  dprintf(2, "ok\n");
  int in_open = 1, sock_open = 1;
  while (sock_open) {
    struct pollfd p[2] = {{.fd = in_open ? 0 : -1, .events = POLLIN}, {.fd = s, .events = POLLIN}};
    if (poll(p, 2, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (in_open && p[0].revents && !pass(0, s)) {
      /* The node's side is done sending: the server sees end of file, and may still answer. */
      in_open = 0;
      shutdown(s, SHUT_WR);
    }
    if (p[1].revents && !pass(s, 1)) sock_open = 0;
  }
  return 0;
}
