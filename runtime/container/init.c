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
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
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

int main(int argc, char **argv) {
  close(3);
  prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);

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
