/*
 * The node's process spawner: a small long-lived child of the node that forks and execs the
 * commands a node runs once per sandbox (`crun run`, `crun delete`) and reports how they ended.
 *
 * Why not the node's own child_process.spawn: libuv forks the node itself and then blocks the
 * event loop until the child has exec'd. Forking a process of ~170 MiB copies its page tables,
 * and on a busy node the child waits for a CPU before it can exec — measured at 3,200 live
 * sandboxes, spawn held the node's only JavaScript thread for ~3.7 ms per create, a third of its
 * time. This process is a few hundred KiB: its fork is cheap, and nothing waits on it.
 *
 * It also does, between fork and exec, what a sandbox's start needs and would otherwise cost
 * one more program: SCHED_IDLE for best-effort sandboxes, and the sandbox's own mount namespace
 * with its writable tmpfs and overlay root (see hardening.ts).
 *
 * Protocol, on its stdin and stdout (pipes to the node):
 *   request: u32 length (little-endian), then that many bytes of NUL-terminated strings:
 *     <seq> run <flags> <stdout path|""> <stderr path|""> [<disk> <tmpfs opts> <uid> <overlay opts> <rootfs>]
 *                 <argc> <argv...> <envc> <env...>
 *       flags: i = SCHED_IDLE, 3 = keep fd 3 (the sandbox init, given at start with argument
 *       "fd3"), m = own mount namespace and the bracketed mount arguments, c = capture stderr.
 *       With envc 0 the command inherits this process's environment.
 *     <seq> kill <signal>   signals the process of request <seq>, if it still runs
 *   reply, once the process has ended: "<seq> <code> <kind> <length>\n" then <length> bytes.
 *       code: the exit code, 128 + signal if killed, -1 if there was no process (fork failed).
 *       kind e: the bytes say why the command never ran (a failed mount or exec);
 *       kind o: the bytes are its captured stderr (at most 64 KiB), or empty.
 * End of file on stdin ends this process; commands still running go on.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CAPTURE_MAX 65536
#define FRAME_MAX (1 << 20)

struct job {
  long seq;
  pid_t pid;
  int err; /* why it never ran: written by the child before _exit, close-on-exec */
  int cap; /* its stderr, when captured; -1 otherwise */
  char *out;
  size_t len;
};

static struct job *jobs;
static size_t njobs, jobcap;
static int have_fd3;

static void write_all(int fd, const void *buf, size_t len) {
  const char *p = buf;
  while (len > 0) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) exit(1); /* the node is gone */
    p += n;
    len -= (size_t)n;
  }
}

static void reply(long seq, int code, char kind, const char *msg, size_t len) {
  char head[80];
  int n = snprintf(head, sizeof head, "%ld %d %c %zu\n", seq, code, kind, len);
  write_all(1, head, (size_t)n);
  if (len) write_all(1, msg, len);
}

/* In the child: say why on the error pipe and end. */
static void __attribute__((noreturn)) fail(int errw, int code, const char *fmt, ...) {
  int e = errno;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof msg - 1) n = sizeof msg - 1;
  n += snprintf(msg + n, sizeof msg - (size_t)n, ": %s", strerror(e));
  (void)!write(errw, msg, (size_t)(n < (int)sizeof msg ? n : (int)sizeof msg - 1));
  _exit(code);
}

static void redirect(int errw, int target, const char *path, int flags) {
  int fd = open(*path ? path : "/dev/null", flags, 0600);
  if (fd < 0) fail(errw, 125, "open %s", *path ? path : "/dev/null");
  if (fd != target) {
    if (dup2(fd, target) < 0) fail(errw, 125, "dup2 %s", path);
    close(fd);
  }
}

struct run {
  const char *flags, *out, *err;
  const char *disk, *opts, *ovl, *rootfs;
  unsigned uid;
  char **argv, **envp;
};

static void own_mounts(int errw, const struct run *r) {
  char upper[4096], work[4096];
  snprintf(upper, sizeof upper, "%s/upper", r->disk);
  snprintf(work, sizeof work, "%s/work", r->disk);
  if (unshare(CLONE_NEWNS) < 0) fail(errw, 125, "unshare mount namespace");
  /* Nothing mounted here may reach the node's namespace. */
  if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) fail(errw, 125, "make / private");
  if (mkdir(r->disk, 0700) < 0) fail(errw, 125, "mkdir %s", r->disk);
  if (mount("paddock-disk", r->disk, "tmpfs", MS_NOSUID | MS_NODEV, r->opts) < 0) fail(errw, 125, "mount tmpfs on %s", r->disk);
  if (mkdir(upper, 0755) < 0 || mkdir(work, 0700) < 0) fail(errw, 125, "mkdir in %s", r->disk);
  /* The upper root is the sandbox's `/`: owned by its root. */
  if (chown(upper, r->uid, r->uid) < 0) fail(errw, 125, "chown %s", upper);
  if (mount("overlay", r->rootfs, "overlay", 0, r->ovl) < 0) fail(errw, 125, "mount overlay on %s", r->rootfs);
}

static void __attribute__((noreturn)) child(const struct run *r, int errw, int capw) {
  sigset_t none;
  sigemptyset(&none);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  sigprocmask(SIG_SETMASK, &none, NULL);
  redirect(errw, 0, "", O_RDONLY);
  redirect(errw, 1, r->out, O_WRONLY | O_CREAT | O_TRUNC);
  if (capw >= 0) {
    if (dup2(capw, 2) < 0) fail(errw, 125, "dup2 stderr");
    close(capw);
  } else {
    redirect(errw, 2, r->err, O_WRONLY | O_CREAT | O_TRUNC);
  }
  if (!(have_fd3 && strchr(r->flags, '3'))) close(3);
  if (strchr(r->flags, 'i')) {
    struct sched_param p = {0};
    if (sched_setscheduler(0, SCHED_IDLE, &p) < 0) fail(errw, 125, "SCHED_IDLE");
  }
  if (strchr(r->flags, 'm')) own_mounts(errw, r);
  if (r->envp) execvpe(r->argv[0], r->argv, r->envp);
  else execvp(r->argv[0], r->argv);
  fail(errw, 127, "exec %s", r->argv[0]);
}

static struct job *job_of_pid(pid_t pid) {
  for (size_t i = 0; i < njobs; i++)
    if (jobs[i].pid == pid) return &jobs[i];
  return NULL;
}

static void start(long seq, struct run *r) {
  int ep[2], cp[2] = {-1, -1};
  if (pipe2(ep, O_CLOEXEC) < 0) {
    const char *m = strerror(errno);
    reply(seq, -1, 'e', m, strlen(m));
    return;
  }
  if (strchr(r->flags, 'c') && pipe2(cp, O_CLOEXEC) < 0) {
    const char *m = strerror(errno);
    close(ep[0]);
    close(ep[1]);
    reply(seq, -1, 'e', m, strlen(m));
    return;
  }
  pid_t pid = fork();
  if (pid == 0) child(r, ep[1], cp[1]);
  int e = errno;
  close(ep[1]);
  if (cp[1] >= 0) close(cp[1]);
  if (pid < 0) {
    close(ep[0]);
    if (cp[0] >= 0) close(cp[0]);
    char m[128];
    snprintf(m, sizeof m, "fork: %s", strerror(e));
    reply(seq, -1, 'e', m, strlen(m));
    return;
  }
  fcntl(ep[0], F_SETFL, O_NONBLOCK);
  if (cp[0] >= 0) fcntl(cp[0], F_SETFL, O_NONBLOCK);
  if (njobs == jobcap) {
    jobcap = jobcap ? jobcap * 2 : 64;
    jobs = realloc(jobs, jobcap * sizeof *jobs);
    if (!jobs) exit(1);
  }
  jobs[njobs++] = (struct job){.seq = seq, .pid = pid, .err = ep[0], .cap = cp[0]};
}

/* Reads what the captured stderr holds now; past CAPTURE_MAX it is read and dropped. */
static void drain(struct job *j) {
  char buf[8192];
  for (;;) {
    ssize_t n = read(j->cap, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) {
      /* Closed: out of the poll set, or poll would report it again and again. */
      close(j->cap);
      j->cap = -1;
    }
    if (n <= 0) return;
    size_t keep = j->len < CAPTURE_MAX ? CAPTURE_MAX - j->len : 0;
    if ((size_t)n < keep) keep = (size_t)n;
    if (keep) {
      char *o = realloc(j->out, j->len + keep);
      if (!o) exit(1);
      j->out = o;
      memcpy(j->out + j->len, buf, keep);
      j->len += keep;
    }
  }
}

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    struct job *j = job_of_pid(pid);
    if (!j) continue;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char why[512];
    ssize_t n = read(j->err, why, sizeof why);
    if (n > 0) {
      reply(j->seq, code, 'e', why, (size_t)n);
    } else {
      if (j->cap >= 0) drain(j);
      reply(j->seq, code, 'o', j->out ? j->out : "", j->len);
    }
    close(j->err);
    if (j->cap >= 0) close(j->cap);
    free(j->out);
    *j = jobs[--njobs];
  }
}

/* Splits a frame into its strings; returns how many, or -1 if it does not end with a NUL. */
static int split(char *p, size_t len, char **out, int max) {
  if (len == 0 || p[len - 1] != '\0') return -1;
  int n = 0;
  for (size_t i = 0; i < len && n < max; n++) {
    out[n] = p + i;
    i += strlen(p + i) + 1;
  }
  return n;
}

static void request(char *frame, size_t len) {
  static char *s[8192];
  int n = split(frame, len, s, 8190);
  if (n < 2) return;
  long seq = strtol(s[0], NULL, 10);
  if (strcmp(s[1], "kill") == 0 && n >= 3) {
    for (size_t i = 0; i < njobs; i++)
      if (jobs[i].seq == seq) kill(jobs[i].pid, atoi(s[2]));
    return;
  }
  const char *bad = "malformed request";
  if (strcmp(s[1], "run") != 0 || n < 6) {
    reply(seq, -1, 'e', bad, strlen(bad));
    return;
  }
  struct run r = {.flags = s[2], .out = s[3], .err = s[4]};
  int i = 5;
  if (strchr(r.flags, 'm')) {
    if (n < i + 5) {
      reply(seq, -1, 'e', bad, strlen(bad));
      return;
    }
    r.disk = s[i];
    r.opts = s[i + 1];
    r.uid = (unsigned)strtoul(s[i + 2], NULL, 10);
    r.ovl = s[i + 3];
    r.rootfs = s[i + 4];
    i += 5;
  }
  int argc = i < n ? atoi(s[i++]) : 0;
  if (argc < 1 || i + argc >= n) {
    reply(seq, -1, 'e', bad, strlen(bad));
    return;
  }
  char **argv = &s[i];
  i += argc;
  int envc = atoi(s[i]);
  if (envc < 0 || i + 1 + envc > n) {
    reply(seq, -1, 'e', bad, strlen(bad));
    return;
  }
  /* Each string's NUL ends it; the lists need NULL after them, which the next string's slot gives. */
  s[i] = NULL;
  r.argv = argv;
  char **envp = &s[i + 1];
  if (envc > 0) {
    s[i + 1 + envc] = NULL;
    r.envp = envp;
  }
  start(seq, &r);
}

int main(int argc, char **argv) {
  have_fd3 = argc > 1 && strcmp(argv[1], "fd3") == 0 && fcntl(3, F_GETFD) >= 0;
  if (have_fd3) fcntl(3, F_SETFD, 0);
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  signal(SIGPIPE, SIG_IGN);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, NULL);
  int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    perror("spawner: signalfd");
    return 1;
  }
  fcntl(0, F_SETFD, FD_CLOEXEC);
  fcntl(1, F_SETFD, FD_CLOEXEC);

  char *buf = malloc(FRAME_MAX + 4);
  size_t have = 0;
  struct pollfd *pfd = NULL;
  size_t pcap = 0;
  for (;;) {
    if (pcap < njobs + 2) {
      pcap = (njobs + 2) * 2;
      pfd = realloc(pfd, pcap * sizeof *pfd);
      if (!pfd || !buf) exit(1);
    }
    pfd[0] = (struct pollfd){.fd = 0, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = sfd, .events = POLLIN};
    size_t np = 2;
    for (size_t i = 0; i < njobs; i++)
      if (jobs[i].cap >= 0) pfd[np++] = (struct pollfd){.fd = jobs[i].cap, .events = POLLIN};
    if (poll(pfd, np, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (pfd[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      reap();
    }
    for (size_t i = 2; i < np; i++)
      if (pfd[i].revents)
        for (size_t k = 0; k < njobs; k++)
          if (jobs[k].cap == pfd[i].fd) drain(&jobs[k]);
    if (pfd[0].revents) {
      ssize_t n = read(0, buf + have, FRAME_MAX + 4 - have);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return 0;
      have += (size_t)n;
      for (;;) {
        if (have < 4) break;
        uint32_t len = (uint32_t)(unsigned char)buf[0] | (uint32_t)(unsigned char)buf[1] << 8 | (uint32_t)(unsigned char)buf[2] << 16 | (uint32_t)(unsigned char)buf[3] << 24;
        if (len > FRAME_MAX) return 2; /* the node never sends this: the stream is lost */
        if (have < 4 + len) break;
        request(buf + 4, len);
        memmove(buf, buf + 4 + len, have - 4 - len);
        have -= 4 + len;
      }
    }
  }
}
