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

int main(int argc, char **argv) {
  close(3);

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
  prctl(PR_SET_NAME, "init", 0, 0, 0);

  for (;;) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    sigwaitinfo(&chld, NULL);
  }
}
