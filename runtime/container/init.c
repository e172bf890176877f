/*
 * A sandbox's pid 1: it reaps every process that ends in the sandbox, orphans included, at once,
 * and otherwise sleeps. With arguments it first starts them as its child (an image's own init).
 *
 * The node hands it to crun as an open fd (`/proc/self/fd/3`), so it is never a file inside the
 * sandbox; it closes that fd first. Static: it needs nothing from the image.
 *
 * Signals: a pid 1 gets only the signals it handles from inside its namespace, and this one
 * handles none but SIGCHLD, so nothing inside can end the sandbox by signalling it. The node ends
 * it with SIGKILL from outside.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
  close(3);
  prctl(PR_SET_NAME, "init", 0, 0, 0);

  sigset_t chld, all;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigfillset(&all);
  /* Blocked, SIGCHLD stays pending until sigwaitinfo takes it: no reaping is ever missed. */
  sigprocmask(SIG_BLOCK, &all, NULL);

  if (argc > 1) {
    pid_t child = fork();
    if (child == 0) {
      sigprocmask(SIG_UNBLOCK, &all, NULL);
      setsid();
      execvp(argv[1], argv + 1);
      _exit(127);
    }
  }

  for (;;) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    sigwaitinfo(&chld, NULL);
  }
}
