/*
 * FnCall's runner: the one long-lived process a warm pool member runs beside its init. The node
 * starts it once per member with `crun exec` (as the sandbox's root, inside every namespace, cgroup
 * and seccomp filter of the container) and then sends it jobs over its stdin; for each job it forks
 * a fresh process tree for the program, as an unprivileged user with no capabilities, relays stdin
 * and output, and answers with the exit status and resource usage. Forking here costs ~0.5 ms of
 * CPU; a `crun exec` per call costs ~5 ms (see runtime/fncall/pool.ts for the measurements).
 *
 * It is never a file inside the sandbox: the node passes this binary as an open descriptor (fd 3)
 * and crun executes /proc/self/fd/3. Built statically on the node (runtime/fncall/runner.ts).
 *
 * It is the child subreaper of everything it starts: the processes a program leaves behind are
 * reparented to it, not to the sandbox's init, and it reaps them (an init that does not reap —
 * `sleep`, or a shell that does not pass an ignored SIGCHLD on to it — would keep their zombies,
 * which count against the pids limit of every later program).
 *
 * Wire (little-endian). Job on stdin:  "FNJB" u32 len, then u32 fields (see JOB_FIELDS below),
 *   cwd\0, argv[i]\0 ..., envp[i]\0 ..., stdin bytes.
 * Answer on stdout:                     "FNRS" u32 len, then i32 status, u32 flags, u32 exec_errno,
 *   u64 utime_us, u64 stime_us, u64 maxrss_kb, u64 wall_us, u32 out_len, u32 err_len, out, err.
 * "FNOK" u32 0 once at start: the runner is up.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <grp.h>

enum { F_STDIN_LEN, F_OUT_CAP, F_UID, F_GID, F_CPU_SEC, F_NOFILE, F_FSIZE_MB, F_STACK_MB, F_ARGC, F_ENVC, JOB_FIELDS };

/* Flags of the answer. */
#define R_TRUNCATED 1u    /* output passed its cap: the program was killed */
#define R_EXEC_FAILED 2u  /* the program could not be started (exec_errno says why) */

static void die(const char *what) {
  fprintf(stderr, "fn-runner: %s: %s\n", what, strerror(errno));
  _exit(70);
}

static int read_full(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static uint32_t u32at(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }

static uint64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

struct buf {
  char *data;
  size_t len, cap;
};

static void buf_add(struct buf *b, const char *d, size_t n) {
  if (b->len + n > b->cap) {
    size_t c = b->cap ? b->cap : 4096;
    while (c < b->len + n) c *= 2;
    char *nd = realloc(b->data, c);
    if (!nd) die("realloc");
    b->data = nd;
    b->cap = c;
  }
  memcpy(b->data + b->len, d, n);
  b->len += n;
}

static void set_limit(int res, uint64_t v) {
  struct rlimit rl = {(rlim_t)v, (rlim_t)v};
  setrlimit(res, &rl);
}

/* In the child, between fork and exec: a new session, the job's user, limits and stdio. */
static void child(const uint32_t *f, const char *cwd, char **argv, char **envp, int in, int out, int err, int report) {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  setsid();
  /* The OOM killer takes the program, never the runner beside it. */
  int oom = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
  if (oom >= 0) {
    (void)!write(oom, "1000", 4);
    close(oom);
  }
  if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) goto fail;
  set_limit(RLIMIT_CORE, 0);
  if (f[F_NOFILE]) set_limit(RLIMIT_NOFILE, f[F_NOFILE]);
  if (f[F_CPU_SEC]) {
    /* A backstop only: the node measures CPU time on the cgroup and stops the program sooner. */
    struct rlimit rl = {(rlim_t)f[F_CPU_SEC], (rlim_t)f[F_CPU_SEC] + 1};
    setrlimit(RLIMIT_CPU, &rl);
  }
  if (f[F_FSIZE_MB]) set_limit(RLIMIT_FSIZE, (uint64_t)f[F_FSIZE_MB] << 20);
  if (f[F_STACK_MB]) set_limit(RLIMIT_STACK, (uint64_t)f[F_STACK_MB] << 20);
  if (setgroups(0, NULL) < 0) goto fail;
  if (setresgid(f[F_GID], f[F_GID], f[F_GID]) < 0) goto fail;
  /* From root to another uid: the kernel clears every capability (no SECBIT_KEEP_CAPS). */
  if (setresuid(f[F_UID], f[F_UID], f[F_UID]) < 0) goto fail;
  if (chdir(cwd) < 0) goto fail;
  umask(022);
  environ = envp;
  execvp(argv[0], argv);
fail:;
  int e = errno;
  (void)!write(report, &e, sizeof e);
  _exit(127);
}

static void set_nonblock(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

/* SIGCHLD arrives here (it is blocked and read from a signalfd, so no handler races the loop). */
static int sigchld_fd = -1;

/*
 * Reaps every child that has ended: orphans left by earlier programs, and `main` (whose status and
 * usage are kept). Returns 1 once `main` has been reaped.
 */
static int reap(pid_t main, int *status, struct rusage *ru) {
  struct signalfd_siginfo si;
  while (read(sigchld_fd, &si, sizeof si) > 0) {
  }
  int got = 0;
  for (;;) {
    int st;
    struct rusage r;
    pid_t p = wait4(-1, &st, WNOHANG | __WALL, &r);
    if (p < 0 && errno == EINTR) continue;
    if (p <= 0) return got;
    if (p == main) {
      *status = st;
      *ru = r;
      got = 1;
    }
  }
}

/* Reads what a pipe has now into `b` (up to `room` bytes); returns 1 at EOF, 0 otherwise. */
static int drain(int fd, struct buf *b, size_t *room, int *over) {
  char tmp[65536];
  for (;;) {
    ssize_t r = read(fd, tmp, sizeof tmp);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno == EAGAIN ? 0 : 1;
    if (r == 0) return 1;
    size_t n = (size_t)r;
    if (n > *room) {
      n = *room;
      *over = 1;
    }
    buf_add(b, tmp, n);
    *room -= n;
    if (*over) return 0;
  }
}

static void run_job(unsigned char *job, uint32_t len) {
  if (len < 4 * JOB_FIELDS) {
    errno = EINVAL;
    die("short job");
  }
  uint32_t f[JOB_FIELDS];
  for (int i = 0; i < JOB_FIELDS; i++) f[i] = u32at(job + 4 * i);
  char *p = (char *)job + 4 * JOB_FIELDS, *end = (char *)job + len;
  char *cwd = p;
  p += strnlen(p, (size_t)(end - p)) + 1;
  char **argv = calloc(f[F_ARGC] + 1, sizeof *argv), **envp = calloc(f[F_ENVC] + 1, sizeof *envp);
  if (!argv || !envp) die("calloc");
  for (uint32_t i = 0; i < f[F_ARGC] && p < end; i++, p += strnlen(p, (size_t)(end - p)) + 1) argv[i] = p;
  for (uint32_t i = 0; i < f[F_ENVC] && p < end; i++, p += strnlen(p, (size_t)(end - p)) + 1) envp[i] = p;
  const char *in_data = p;
  size_t in_left = f[F_STDIN_LEN] <= (uint32_t)(end - p) ? f[F_STDIN_LEN] : (size_t)(end - p);
  if (!argv[0]) {
    errno = EINVAL;
    die("job without argv");
  }

  int pin[2], pout[2], perr[2], prep[2];
  if (pipe2(pin, O_CLOEXEC) || pipe2(pout, O_CLOEXEC) || pipe2(perr, O_CLOEXEC) || pipe2(prep, O_CLOEXEC)) die("pipe");
  uint64_t started = now_us();
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) child(f, cwd, argv, envp, pin[0], pout[1], perr[1], prep[1]);
  close(pin[0]);
  close(pout[1]);
  close(perr[1]);
  close(prep[1]);
  int exec_errno = 0;
  /* Returns 0 bytes once exec succeeded (the pipe is close-on-exec), or the errno if it failed. */
  if (read_full(prep[0], &exec_errno, sizeof exec_errno) < 0) exec_errno = 0;
  close(prep[0]);
  set_nonblock(pin[1]);
  set_nonblock(pout[0]);
  set_nonblock(perr[0]);
  if (in_left == 0) {
    close(pin[1]);
    pin[1] = -1;
  }
  struct buf out = {0}, err = {0};
  size_t room = f[F_OUT_CAP];
  int over = 0, out_open = 1, err_open = 1, status = 0;
  struct rusage ru = {0};
  int exited = reap(pid, &status, &ru);
  while (!exited) {
    struct pollfd pf[5];
    int n = 0, i_in = -1, i_out = -1, i_err = -1;
    pf[n++] = (struct pollfd){.fd = sigchld_fd, .events = POLLIN};
    pf[n++] = (struct pollfd){.fd = 0, .events = POLLIN}; /* the node went away: stop */
    if (pin[1] >= 0) i_in = n, pf[n++] = (struct pollfd){.fd = pin[1], .events = POLLOUT};
    if (out_open && !over) i_out = n, pf[n++] = (struct pollfd){.fd = pout[0], .events = POLLIN};
    if (err_open && !over) i_err = n, pf[n++] = (struct pollfd){.fd = perr[0], .events = POLLIN};
    if (poll(pf, (nfds_t)n, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (pf[1].revents) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      _exit(0);
    }
    if (i_in >= 0 && pf[i_in].revents) {
      ssize_t w = write(pin[1], in_data, in_left);
      if (w > 0) {
        in_data += w;
        in_left -= (size_t)w;
      }
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || in_left == 0 || (pf[i_in].revents & (POLLERR | POLLHUP))) {
        close(pin[1]);
        pin[1] = -1;
      }
    }
    if (i_out >= 0 && pf[i_out].revents && drain(pout[0], &out, &room, &over)) out_open = 0;
    if (i_err >= 0 && pf[i_err].revents && drain(perr[0], &err, &room, &over)) err_open = 0;
    if (over) {
      /* Past the cap: the program is stopped; whatever else it started is the node's to kill. */
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
    }
    if (pf[0].revents) exited = reap(pid, &status, &ru);
  }
  /* The program has ended: take what its pipes hold now, but do not wait for background
   * processes that may keep them open (the node kills those before the next job). */
  if (!over && out_open) drain(pout[0], &out, &room, &over);
  if (!over && err_open) drain(perr[0], &err, &room, &over);
  uint64_t wall = now_us() - started;
  close(pout[0]);
  close(perr[0]);
  if (pin[1] >= 0) close(pin[1]);

  size_t hdr = 8 + 4 * 3 + 8 * 4 + 4 * 2;
  size_t total = hdr + out.len + err.len;
  unsigned char *r = malloc(total);
  if (!r) die("malloc");
  memcpy(r, "FNRS", 4);
  put32(r + 4, (uint32_t)(total - 8));
  put32(r + 8, (uint32_t)status);
  put32(r + 12, (over ? R_TRUNCATED : 0) | (exec_errno ? R_EXEC_FAILED : 0));
  put32(r + 16, (uint32_t)exec_errno);
  put64(r + 20, (uint64_t)ru.ru_utime.tv_sec * 1000000u + (uint64_t)ru.ru_utime.tv_usec);
  put64(r + 28, (uint64_t)ru.ru_stime.tv_sec * 1000000u + (uint64_t)ru.ru_stime.tv_usec);
  put64(r + 36, (uint64_t)ru.ru_maxrss);
  put64(r + 44, wall);
  put32(r + 52, (uint32_t)out.len);
  put32(r + 56, (uint32_t)err.len);
  if (out.len) memcpy(r + hdr, out.data, out.len);
  if (err.len) memcpy(r + hdr + out.len, err.data, err.len);
  if (write_full(1, r, total) < 0) die("write answer");
  free(r);
  free(out.data);
  free(err.data);
  free(argv);
  free(envp);
}

int main(void) {
  /* The node's descriptor of this binary is not needed past exec. */
  close(3);
  signal(SIGPIPE, SIG_IGN);
  /* An ignored SIGCHLD would make the kernel reap children before wait4 sees their status. */
  signal(SIGCHLD, SIG_DFL);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  sigchld_fd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  if (sigchld_fd < 0) die("signalfd");
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0) die("PR_SET_CHILD_SUBREAPER");
  if (write_full(1, "FNOK\0\0\0\0", 8) < 0) die("write");
  for (;;) {
    /* Between jobs: orphans of the last program may still be dying; reap them as they go. */
    struct pollfd idle[2] = {{.fd = 0, .events = POLLIN}, {.fd = sigchld_fd, .events = POLLIN}};
    if (poll(idle, 2, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (idle[1].revents) {
      int st;
      struct rusage r;
      reap(0, &st, &r);
    }
    if (!idle[0].revents) continue;
    unsigned char hdr[8];
    if (read_full(0, hdr, 8) < 0) return 0; /* the node closed the pipe: the member is done */
    if (memcmp(hdr, "FNJB", 4) != 0) {
      errno = EPROTO;
      die("bad job header");
    }
    uint32_t len = u32at(hdr + 4);
    unsigned char *job = malloc(len + 1);
    if (!job) die("malloc");
    if (read_full(0, job, len) < 0) return 0;
    job[len] = 0;
    run_job(job, len);
    free(job);
  }
}
