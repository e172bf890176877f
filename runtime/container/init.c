/*
 * A sandbox's pid 1: it reaps every process that ends in the sandbox, orphans included, at once,
 * and otherwise sleeps. With arguments it first starts them as its child (an image's own init);
 * if they cannot be run it says why on stderr (crun's error file) and exits, so the create fails.
 * It takes the name `init` only once that child runs: the node waits for the name.
 *
 * The node hands it to crun as an open fd (`/proc/self/fd/3`), so it is never a file inside the
 * sandbox; it closes that fd first. Static: it needs nothing from the image.
 *
 * Signals: a pid 1 gets only the signals it handles from inside its namespace, and this one
 * handles none but SIGCHLD, so nothing inside can end the sandbox by signalling it. The node ends
 * it with SIGKILL from outside.
 *
 * Nothing else inside can reach it either, once it runs:
 * - its stdio, inherited from crun, is crun's error file on the node's run tmpfs: once the image
 *   init has started (or there is none), 0-2 become /dev/null, in the child before its exec too,
 *   so no process of the sandbox holds a node file (through /proc/1/fd/2 a sandbox filled the
 *   node's run tmpfs, and the path named the node's home, id and the sandbox's id);
 * - it is not dumpable: /proc/1/mem, /proc/1/fd, /proc/1/exe, /proc/1/root then need
 *   CAP_SYS_PTRACE, which the sandbox's root lacks, so pid 1 can be neither written nor traced;
 * - its oom_score_adj stays 0 (read-only, oci.ts READONLY_PATHS) while every exec runs at 500
 *   (the spawner's `o`) and the image's init, started here, at 500 too: in the sandbox's memory
 *   cgroup the OOM killer always finds a process of the agent before this one.
 *
 * The same binary is the sandbox's terminal relay when it is not pid 1 (`crun exec` of
 * /proc/self/fd/3 with the arguments `pty <cols> <rows> <argv...>`): see pty_main. It lives here
 * because this is the one program the node already hands to crun as an fd, so a terminal needs no
 * file inside the sandbox either.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <poll.h>
#include <pty.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

/* The same as the execs' (spawner.c, flag o). */
#define EXEC_OOM_SCORE_ADJ "500"

/* 0, 1 and 2 on /dev/null (the container's own: crun makes it). */
static void quiet_stdio(void) {
  int n = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (n < 0) return;
  for (int fd = 0; fd < 3; fd++) dup2(n, fd);
  if (n > 2) close(n);
}

/*
 * The terminal relay. Why a relay of our own rather than `crun exec --tty`: crun hands the
 * terminal's master over a unix socket (--console-socket) as an SCM_RIGHTS fd, which Node cannot
 * receive without a native module, and the node's exec path (the spawner, its relayed pipes, the
 * pid file, the verdicts) would all have to change for one kind of process. Here a terminal is an
 * exec like any other: stdin a FIFO the node writes, stdout the relayed pipe.
 *
 * It opens a pseudo-terminal of <cols>x<rows> in the sandbox's own devpts, starts <argv> on its
 * slave as a session leader with it as the controlling terminal (no argv: /bin/bash, else
 * /bin/sh, as a login shell), copies what the terminal prints to stdout, and reads frames from
 * stdin: a type byte and a u32 little-endian length, then the payload; 'd' = bytes typed,
 * 'r' = u16 cols, u16 rows (TIOCSWINSZ on the master: the kernel sends SIGWINCH to the terminal's
 * foreground group). SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 go on to the shell's
 * process group. It exits as the shell did (128 + signal when one ended it), once the terminal
 * has printed everything.
 */
static volatile pid_t pty_child;

static void pty_forward(int sig) {
  if (pty_child > 0) kill(-pty_child, sig);
}

static void pty_nothing(int sig) { (void)sig; }

static int write_all(int fd, const char *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) {
      struct pollfd p = {fd, POLLOUT, 0};
      poll(&p, 1, 1000);
      continue;
    }
    if (w <= 0) return -1;
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

static int pty_main(int argc, char **argv) {
  if (argc < 2) {
    dprintf(2, "pty: usage: pty <cols> <rows> [argv...]\n");
    return 125;
  }
  struct winsize ws = {.ws_col = (unsigned short)atoi(argv[0]), .ws_row = (unsigned short)atoi(argv[1])};
  int master;
  pid_t child = forkpty(&master, NULL, NULL, &ws);
  if (child < 0) {
    dprintf(2, "pty: %s\n", strerror(errno));
    return 125;
  }
  if (child == 0) {
    if (!getenv("TERM")) setenv("TERM", "xterm-256color", 1);
    if (argc > 2) {
      execvp(argv[2], argv + 2);
      dprintf(2, "pty: cannot run %s: %s\n", argv[2], strerror(errno));
      _exit(127);
    }
    char *bash[] = {"-bash", NULL}, *sh[] = {"-sh", NULL};
    if (access("/bin/bash", X_OK) == 0) execv("/bin/bash", bash);
    execv("/bin/sh", sh);
    dprintf(2, "pty: no /bin/bash or /bin/sh: %s\n", strerror(errno));
    _exit(127);
  }
  pty_child = child;
  struct sigaction fwd = {.sa_handler = pty_forward}, wake = {.sa_handler = pty_nothing};
  int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
  for (size_t i = 0; i < sizeof forwarded / sizeof *forwarded; i++) sigaction(forwarded[i], &fwd, NULL);
  sigaction(SIGCHLD, &wake, NULL);
  signal(SIGPIPE, SIG_IGN);

  /*
   * The master is non-blocking and typed input waits in `pend` until the terminal takes it: a
   * relay that blocked writing a large paste while the shell blocked writing its output would
   * never read that output, and both would wait forever. While input is pending no more is read
   * from stdin, so a shell that does not read holds up the FIFO, and then the node's queue (BUSY).
   */
  fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
  static char in[65536 + 5], out[65536], pend[65536 + 5];
  size_t have = 0, plen = 0, poff = 0;
  int in_open = 1, status = 0, reaped = 0;
  for (;;) {
    if (!reaped && waitpid(child, &status, WNOHANG) == child) reaped = 1;
    struct pollfd p[2] = {{master, (short)(POLLIN | (plen > poff ? POLLOUT : 0)), 0}, {in_open && plen == poff ? 0 : -1, POLLIN, 0}};
    /* Once the shell has ended, whatever its terminal still holds is read without waiting. */
    int n = poll(p, 2, reaped ? 0 : 1000);
    if (n < 0 && errno != EINTR) break;
    if (n <= 0) {
      if (reaped) break;
      continue;
    }
    if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(master, out, sizeof out);
      if (r > 0) {
        if (write_all(1, out, (size_t)r) < 0) break;
      } else if (r < 0 && (errno == EINTR || errno == EAGAIN)) {
        /* nothing yet */
      } else {
        /* EIO: every process holding the terminal's slave has closed it. */
        if (!reaped) waitpid(child, &status, 0);
        reaped = 1;
        break;
      }
    }
    if ((p[0].revents & POLLOUT) && plen > poff) {
      ssize_t w = write(master, pend + poff, plen - poff);
      if (w > 0) poff += (size_t)w;
      else if (w < 0 && errno != EINTR && errno != EAGAIN) poff = plen;
      if (poff == plen) plen = poff = 0;
    }
    if (p[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t r = read(0, in + have, sizeof in - have);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        in_open = 0;
        continue;
      }
      have += (size_t)r;
      for (;;) {
        if (have < 5) break;
        uint32_t len;
        memcpy(&len, in + 1, 4);
        if (len > sizeof in - 5) {
          dprintf(2, "pty: frame of %u bytes\n", len);
          in_open = 0;
          break;
        }
        if (have < 5 + len) break;
        if (in[0] == 'd' && plen + len <= sizeof pend) {
          /* Frames already read go on the pending input together: at most one read's worth. */
          memcpy(pend + plen, in + 5, len);
          plen += len;
        } else if (in[0] == 'r' && len == 4) {
          uint16_t cr[2];
          memcpy(cr, in + 5, 4);
          struct winsize w = {.ws_col = cr[0], .ws_row = cr[1]};
          ioctl(master, TIOCSWINSZ, &w);
        }
        memmove(in, in + 5 + len, have - 5 - len);
        have -= 5 + len;
      }
    }
  }
  if (!reaped) waitpid(child, &status, 0);
  return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
}

int main(int argc, char **argv) {
  close(3);
  /* pid 1 is always the init: anything else is a terminal's relay (crun exec of this binary). */
  if (getpid() != 1 && argc > 1 && strcmp(argv[1], "pty") == 0) return pty_main(argc - 2, argv + 2);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  /* fd 4, when open, is the sandbox's disk, held for the node (spawner.c pass_disk): not the image init's. */
  fcntl(4, F_SETFD, FD_CLOEXEC);

  sigset_t chld, all;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigfillset(&all);
  /* Blocked, SIGCHLD stays pending until sigwaitinfo takes it: no reaping is ever missed. */
  sigprocmask(SIG_BLOCK, &all, NULL);

  if (argc > 1) {
    /* A close-on-exec pipe: end of file once the child has exec'd, its errno if it could not. */
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
      dprintf(2, "init: pipe: %s\n", strerror(errno));
      return 126;
    }
    pid_t child = fork();
    if (child < 0) {
      dprintf(2, "init: fork: %s\n", strerror(errno));
      return 126;
    }
    if (child == 0) {
      close(p[0]);
      sigprocmask(SIG_UNBLOCK, &all, NULL);
      setsid();
      /* The image's init is the agent's code: it gets neither the node's file nor pid 1's OOM rank. */
      int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
      if (adj >= 0) {
        (void)!write(adj, EXEC_OOM_SCORE_ADJ, strlen(EXEC_OOM_SCORE_ADJ));
        close(adj);
      }
      quiet_stdio();
      execvp(argv[1], argv + 1);
      int e = errno;
      (void)!write(p[1], &e, sizeof e);
      _exit(127);
    }
    close(p[1]);
    int e = 0;
    ssize_t n = read(p[0], &e, sizeof e);
    close(p[0]);
    if (n == (ssize_t)sizeof e) {
      dprintf(2, "init: cannot run %s: %s\n", argv[1], strerror(e));
      return 127;
    }
  }
  quiet_stdio();
  prctl(PR_SET_NAME, "init", 0, 0, 0);

  for (;;) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    sigwaitinfo(&chld, NULL);
  }
}
