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
 *     <seq> run <flags> <stdin path|""> <stdout path|""> <stderr path|"">
 *                 [<disk> <tmpfs opts> <uid> <overlay opts> <rootfs> <id count> <mq bytes> <sigpending>
 *                  <ucounts> <n> <layer...>]
 *                 <argc> <argv...> <envc> <env...>
 *       flags: i = SCHED_IDLE, 3 = keep fd 3 (the sandbox init, given at start with argument
 *       "fd3"), m = own mount namespace and the bracketed mount arguments, c = capture stderr,
 *       p = relay stdout and stderr to the node as they come (the paths of both are then unused),
 *       o = oom_score_adj 500 (a sandbox's exec: the OOM killer's choice before its init).
 *       With envc 0 the command inherits this process's environment.
 *     <seq> kill <signal>   signals the process of request <seq>, if it still runs
 *     <seq> close           stops relaying the output of <seq>, which has exited
 *     <seq> hold | go       stops reading the relayed output of <seq>, and starts again: its pipes
 *                           fill and its writer blocks (the node's flow control, per command)
 *     0 release <fd>        closes a disk fd this process holds for the node (see keep_sock)
 *   messages: "<seq> <type> <code> <length>\n" then <length> bytes, type:
 *       o, E: a chunk of the command's stdout, stderr (relayed);
 *       x: it ended: code is its exit code or 128 + signal; the bytes are its captured stderr
 *          (at most 64 KiB), or empty;
 *       e: it never ran (code -1: no process; 125: setup failed; 127: exec failed): the bytes say why;
 *       z: a relayed command's output has ended (both pipes closed), after its x;
 *       k: (m requests) code is the fd this process now holds of the sandbox's disk (before x).
 *   and, with seq 0: "0 d <code> <length>\n<pid>": a process that was no command of ours ended
 *       (an orphan this subreaper adopted: a sandbox's init once `crun run -d` is gone); code as x.
 * End of file on stdin ends this process; commands still running go on. It is their subreaper
 * (see main) and reaps every process that ends under it.
 *
 * argv[0] "@charge" runs no program: see charge().
 *
 * Arguments: "fd3" (see above), and "seal=<path>": the program at <path> (crun) is copied once
 * into a sealed memfd, and a request whose argv[0] is <path> executes that copy. crun, like runc,
 * defends against CVE-2019-5736 (a container overwriting the runtime's binary through
 * /proc/self/exe) by re-executing itself from a read-only copy on every start unless it already
 * runs from a sealed memfd: a temp file in /tmp, a bind mount, a remount, an unmount that waits
 * for an RCU grace period, and a second execve with all its dynamic linking, for every crun run,
 * exec and delete. One sealed copy gives the same protection (it cannot be written), once.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <linux/falloc.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define CAPTURE_MAX 65536
#define FRAME_MAX (1 << 20)

struct job {
  long seq;
  pid_t pid; /* 0 once reaped (a relayed command's output may go on) */
  int err;   /* why it never ran: written by the child before _exit, close-on-exec */
  int cap;   /* its stderr, when captured; -1 otherwise */
  int out[2]; /* its stdout and stderr, when relayed; -1 otherwise or once closed */
  int relayed;
  int held; /* its relayed pipes are left out of the poll set until "go" */
  char *buf;
  size_t len;
};

static struct job *jobs;
static size_t njobs, jobcap;
static int have_fd3;
static int sealed_fd = -1;
/*
 * A sandbox's writable layer is mounted only in its own mount namespace, which is gone once crun
 * has pivoted into the overlay: nothing on the node can reach the upper dir by a path. A snapshot
 * of the sandbox's files needs it, so the child that mounts it sends an O_PATH fd of the disk here
 * (SCM_RIGHTS on keep_sock) and this process holds it: the node reads it as /proc/<this>/fd/<n>.
 */
static int keep_sock[2] = {-1, -1};
static int *held;
static size_t nheld, heldcap;
static const char *sealed_path;

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

static void reply(long seq, char type, int code, const char *msg, size_t len) {
  char head[80];
  int n = snprintf(head, sizeof head, "%ld %c %d %zu\n", seq, type, code, len);
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
  long seq;
  const char *flags, *in, *out, *err;
  const char *disk, *opts, *ovl, *rootfs;
  unsigned uid, idsize;
  unsigned long mq, sigpending;
  const char *ucounts; /* "<name>=<value>,...": the namespace's /proc/sys/user limits ("" none) */
  int nlowers;
  char **lowers;
  char **argv, **envp;
};

/* In the child: hands an O_PATH fd of the sandbox's disk to the spawner (see keep_sock); best effort. */
static void send_disk(const struct run *r) {
  int d = open(r->disk, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (d < 0 || keep_sock[1] < 0) {
    if (d >= 0) close(d);
    return;
  }
  char data[24];
  int n = snprintf(data, sizeof data, "%ld", r->seq);
  struct iovec iov = {.iov_base = data, .iov_len = (size_t)n};
  union {
    struct cmsghdr h;
    char buf[CMSG_SPACE(sizeof(int))];
  } c;
  memset(&c, 0, sizeof c);
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf, .msg_controllen = sizeof c.buf};
  struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
  cm->cmsg_level = SOL_SOCKET;
  cm->cmsg_type = SCM_RIGHTS;
  cm->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(cm), &d, sizeof d);
  while (sendmsg(keep_sock[1], &m, 0) < 0 && errno == EINTR) {
  }
  close(d);
}

/* Takes the disks children sent (keep_sock) and tells the node: "<seq> k <fd> 0". Before reap, so the node hears it before that command's x. */
static void take_disks(void) {
  for (;;) {
    char data[24];
    struct iovec iov = {.iov_base = data, .iov_len = sizeof data - 1};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int))];
    } c;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf, .msg_controllen = sizeof c.buf};
    ssize_t n = recvmsg(keep_sock[0], &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data[n] = '\0';
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    if (!cm || cm->cmsg_type != SCM_RIGHTS) continue;
    int fd;
    memcpy(&fd, CMSG_DATA(cm), sizeof fd);
    if (nheld == heldcap) {
      heldcap = heldcap ? heldcap * 2 : 64;
      held = realloc(held, heldcap * sizeof *held);
      if (!held) exit(1);
    }
    held[nheld++] = fd;
    reply(strtol(data, NULL, 10), 'k', fd, "", 0);
  }
}

/*
 * A proc of the calling process's own, on /proc of a mount namespace of its own (the caller is the
 * throwaway child of sandbox_userns): every user namespace has its own /proc/sys/user entries, and
 * in one proc instance their dentries share a parent and a name, so a lookup compares every live
 * sandbox's (proc_sys_compare). With the node's /proc that was 12% of the host's CPU at 2,000 live
 * sandboxes (perf). A new proc mount is a new instance (Linux 5.8+): its dentries are this
 * namespace's alone, and go with this process.
 */
static int own_proc(void) {
  if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0) return -1;
  return mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
}

/*
 * Sets the calling process's user namespace's limits in /proc/sys/user, from "<name>=<value>,...".
 * The kernel looks them up by the writer's user namespace, and lets its owner (the caller, who
 * made it) write them, not the sandbox's root. Done by the namespace's maker before crun joins it,
 * so no process of the sandbox ever runs without them, and with no process of its own to start.
 * On failure `why` says which, after a '0'.
 */
static void ucount_limits(const char *list, char *why, size_t size) {
  for (const char *p = list; *p;) {
    const char *end = strchr(p, ',');
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *eq = memchr(p, '=', len);
    if (!eq || eq == p || memchr(p, '/', len)) {
      snprintf(why, size, "0bad limit %.*s", (int)len, p);
      return;
    }
    char path[128];
    snprintf(path, sizeof path, "/proc/sys/user/%.*s", (int)(eq - p), p);
    int s = open(path, O_WRONLY | O_CLOEXEC);
    if (s < 0 && errno == ENOENT) { /* a counter this kernel does not have */
    } else {
      ssize_t want = (ssize_t)(len - (size_t)(eq + 1 - p));
      if (s < 0 || write(s, eq + 1, (size_t)want) != want) {
        snprintf(why, size, "0write %s: %s", path, strerror(errno));
        if (s >= 0) close(s);
        return;
      }
      close(s);
    }
    p = end ? end + 1 : p + len;
  }
}

/*
 * The sandbox's user namespace, mapping 0..size-1 to its host ids uid.., made here and owned by
 * uid, not by root: the kernel charges a namespace's pending signals, message-queue bytes and
 * inotify instances to its owner in the parent namespace too, so with crun making it (as root),
 * every sandbox's charges summed up on host root. Owned by the sandbox's own host uid, they sum
 * up there alone, bounded by the rlimits its creator had (r->mq, r->sigpending). Made by a child
 * that sets its /proc/sys/user limits (ucount_limits), then waits in it while root writes its
 * maps, then is killed; the namespace lives on in a bind mount of it at <disk>/userns (this mount
 * namespace only, which crun inherits and joins it from: config.json names that path). Returns an
 * fd of it, for the layers' id maps.
 */
static int sandbox_userns(int errw, const struct run *r) {
  int ready[2];
  if (pipe2(ready, O_CLOEXEC) < 0) fail(errw, 125, "pipe");
  pid_t pid = fork();
  if (pid < 0) fail(errw, 125, "fork");
  if (pid == 0) {
    struct rlimit mq = {r->mq, r->mq}, sp = {r->sigpending, r->sigpending};
    /* The proc for ucount_limits is mounted while this child is still root on the host. */
    int ok = (!*r->ucounts || own_proc() == 0) && (r->mq == 0 || setrlimit(RLIMIT_MSGQUEUE, &mq) == 0) && (r->sigpending == 0 || setrlimit(RLIMIT_SIGPENDING, &sp) == 0) &&
             setgroups(0, NULL) == 0 && setresgid(r->uid, r->uid, r->uid) == 0 && setresuid(r->uid, r->uid, r->uid) == 0 && unshare(CLONE_NEWUSER) == 0;
    char why[160] = "1";
    if (!ok) snprintf(why, sizeof why, "0%s", strerror(errno));
    else ucount_limits(r->ucounts, why, sizeof why);
    if (write(ready[1], why, strlen(why)) < 1) _exit(1);
    for (;;) pause();
  }
  close(ready[1]);
  char why[160] = {0};
  ssize_t got = read(ready[0], why, sizeof why - 1);
  if (got < 1 || why[0] != '1') {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    fail(errw, 125, "a user namespace owned by %u: %s", r->uid, got > 1 ? why + 1 : "its maker failed");
  }
  close(ready[0]);
  char path[64], map[64];
  int len = snprintf(map, sizeof map, "0 %u %u\n", r->uid, r->idsize);
  const char *files[] = {"uid_map", "gid_map"};
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, files[i]);
    int f = open(path, O_WRONLY | O_CLOEXEC);
    if (f < 0 || write(f, map, (size_t)len) != len) {
      kill(pid, SIGKILL);
      waitpid(pid, NULL, 0);
      fail(errw, 125, "write %s", path);
    }
    close(f);
  }
  snprintf(path, sizeof path, "/proc/%d/ns/user", (int)pid);
  int ns = open(path, O_RDONLY | O_CLOEXEC);
  int keep = open("userns", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  int bound = ns >= 0 && keep >= 0 && mount(path, "userns", NULL, MS_BIND, NULL) == 0;
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  if (!bound) fail(errw, 125, "keep %s at %s/userns", path, r->disk);
  close(keep);
  return ns;
}

/*
 * Each read-only layer (mounted once by the node, its files owned by root) seen through an
 * idmapped clone at <disk>/l<i>, owned by this sandbox's own range of host ids (container/ids.ts).
 * Made here, in the sandbox's mount namespace, because a clone per layer per sandbox in the node's
 * namespace would make every later create copy them all (see hardening.ts ownMounts). overlayfs
 * cannot itself be idmapped (mount_setattr: EINVAL), its layers can.
 */
static void idmapped_layers(int errw, const struct run *r, int ns) {
  for (int i = 0; i < r->nlowers; i++) {
    char mp[32];
    snprintf(mp, sizeof mp, "l%d", i);
    if (mkdir(mp, 0700) < 0) fail(errw, 125, "mkdir %s", mp);
    int t = open_tree(AT_FDCWD, r->lowers[i], OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (t < 0) fail(errw, 125, "open_tree %s", r->lowers[i]);
    struct mount_attr a = {.attr_set = MOUNT_ATTR_IDMAP, .userns_fd = (uint64_t)ns};
    if (mount_setattr(t, "", AT_EMPTY_PATH, &a, sizeof a) < 0) fail(errw, 125, "idmap %s", r->lowers[i]);
    if (move_mount(t, "", AT_FDCWD, mp, MOVE_MOUNT_F_EMPTY_PATH) < 0) fail(errw, 125, "move_mount %s", r->lowers[i]);
    close(t);
  }
}

/*
 * And one for the sandbox's init, as its fd 4 (crun --preserve-fds 2, after the init binary at 3):
 * the init holds the disk for the sandbox's life, so a node restarted after a crash, whose
 * spawner's hold died with the old one, still reaches the upper dir as /proc/<init>/fd/4. The init
 * is not dumpable and no process of the sandbox has CAP_SYS_PTRACE: they cannot open it. Fds of
 * this child's own that sit at 4 move up first.
 */
static void pass_disk(int *errw, const struct run *r) {
  int *mine[] = {errw, &sealed_fd, &keep_sock[1]};
  for (size_t i = 0; i < sizeof mine / sizeof *mine; i++) {
    if (*mine[i] != 4) continue;
    int n = fcntl(4, F_DUPFD_CLOEXEC, 5);
    if (n < 0) fail(*errw, 125, "move fd 4");
    *mine[i] = n;
  }
  int d = open(r->disk, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (d < 0) fail(*errw, 125, "open %s", r->disk);
  if (d == 4) {
    fcntl(4, F_SETFD, 0);
    return;
  }
  if (dup2(d, 4) < 0) fail(*errw, 125, "dup2 %s to 4", r->disk);
  close(d);
}

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
  send_disk(r);
  /*
   * The overlay's options are relative to the disk (hardening.ts): the kernel shows them as given
   * in the sandbox's mountinfo, and absolute ones named the node's home, its id and the sandbox's.
   */
  if (chdir(r->disk) < 0) fail(errw, 125, "chdir %s", r->disk);
  if (r->idsize > 0) {
    int ns = sandbox_userns(errw, r);
    idmapped_layers(errw, r, ns);
    close(ns);
  }
  if (mount("overlay", r->rootfs, "overlay", 0, r->ovl) < 0) fail(errw, 125, "mount overlay on %s", r->rootfs);
  if (chdir("/") < 0) fail(errw, 125, "chdir /");
}

/*
 * `@charge <cgroup.procs> <file> <offset> <length> [<file> <offset> <length>]...`, run in place
 * of a program: joins the cgroup (a sandbox's memory cgroup) and allocates each range of each file
 * there, so that the pages of a tmpfs write the node then makes into them are charged to the
 * sandbox, not to the node. Several ranges in one run because the run, not the fallocate, is the
 * cost (~5 ms): a tar upload of 10,000 small files charged one by one spent 50 s on it. Exits with
 * the first failing fallocate's errno, 0 when all are done.
 */
static void __attribute__((noreturn)) charge(int errw, const struct run *r) {
  if (!r->argv[1] || !r->argv[2] || !r->argv[3] || !r->argv[4]) fail(errw, 125, "@charge: 4 arguments");
  int c = open(r->argv[1], O_WRONLY | O_CLOEXEC);
  if (c < 0 || write(c, "0", 1) != 1) fail(errw, 125, "join %s", r->argv[1]);
  close(c);
  for (int i = 2; r->argv[i]; i += 3) {
    if (!r->argv[i + 1] || !r->argv[i + 2]) fail(errw, 125, "@charge: ranges come in threes");
    int fd = open(r->argv[i], O_WRONLY | O_CLOEXEC);
    if (fd < 0) fail(errw, 125, "open %s", r->argv[i]);
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, atoll(r->argv[i + 1]), atoll(r->argv[i + 2])) < 0) _exit(errno);
    close(fd);
  }
  _exit(0);
}

static void onto(int errw, int fd, int target) {
  if (dup2(fd, target) < 0) fail(errw, 125, "dup2 %d", target);
  close(fd);
}

/* outw, errw2: write ends of the relay pipes (or -1); capw: of the capture pipe (or -1). */
static void __attribute__((noreturn)) child(const struct run *r, int errw, int capw, int outw, int errw2) {
  sigset_t none;
  sigemptyset(&none);
  for (int s = 1; s < NSIG; s++) signal(s, SIG_DFL);
  sigprocmask(SIG_SETMASK, &none, NULL);
  redirect(errw, 0, r->in, O_RDONLY);
  if (outw >= 0) onto(errw, outw, 1);
  else redirect(errw, 1, r->out, O_WRONLY | O_CREAT | O_TRUNC);
  if (errw2 >= 0) onto(errw, errw2, 2);
  else if (capw >= 0) onto(errw, capw, 2);
  else redirect(errw, 2, r->err, O_WRONLY | O_CREAT | O_TRUNC);
  if (!(have_fd3 && strchr(r->flags, '3'))) close(3);
  if (strcmp(r->argv[0], "@charge") == 0) charge(errw, r);
  if (strchr(r->flags, 'i')) {
    struct sched_param p = {0};
    if (sched_setscheduler(0, SCHED_IDLE, &p) < 0) fail(errw, 125, "SCHED_IDLE");
  }
  if (strchr(r->flags, 'o')) {
    int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (adj < 0 || write(adj, "500", 3) != 3) fail(errw, 125, "oom_score_adj");
    close(adj);
  }
  if (strchr(r->flags, 'm')) {
    own_mounts(errw, r);
    if (have_fd3 && strchr(r->flags, '3')) pass_disk(&errw, r);
  }
  if (sealed_fd >= 0 && strcmp(r->argv[0], sealed_path) == 0) fexecve(sealed_fd, r->argv, r->envp ? r->envp : environ);
  else if (r->envp) execvpe(r->argv[0], r->argv, r->envp);
  else execvp(r->argv[0], r->argv);
  fail(errw, 127, "exec %s", r->argv[0]);
}

static void close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static void start(long seq, struct run *r) {
  int ep[2] = {-1, -1}, cp[2] = {-1, -1}, op[2] = {-1, -1}, xp[2] = {-1, -1};
  int relays = strchr(r->flags, 'p') != NULL;
  if (pipe2(ep, O_CLOEXEC) < 0 || (strchr(r->flags, 'c') && pipe2(cp, O_CLOEXEC) < 0) || (relays && (pipe2(op, O_CLOEXEC) < 0 || pipe2(xp, O_CLOEXEC) < 0))) {
    char m[128];
    snprintf(m, sizeof m, "pipe: %s", strerror(errno));
    int *all[] = {&ep[0], &ep[1], &cp[0], &cp[1], &op[0], &op[1], &xp[0], &xp[1]};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) close_fd(all[i]);
    reply(seq, 'e', -1, m, strlen(m));
    return;
  }
  pid_t pid = fork();
  if (pid == 0) child(r, ep[1], cp[1], op[1], xp[1]);
  int e = errno;
  close_fd(&ep[1]);
  close_fd(&cp[1]);
  close_fd(&op[1]);
  close_fd(&xp[1]);
  if (pid < 0) {
    close_fd(&ep[0]);
    close_fd(&cp[0]);
    close_fd(&op[0]);
    close_fd(&xp[0]);
    char m[128];
    snprintf(m, sizeof m, "fork: %s", strerror(e));
    reply(seq, 'e', -1, m, strlen(m));
    return;
  }
  int rd[] = {ep[0], cp[0], op[0], xp[0]};
  for (size_t i = 0; i < sizeof rd / sizeof *rd; i++)
    if (rd[i] >= 0) fcntl(rd[i], F_SETFL, O_NONBLOCK);
  if (njobs == jobcap) {
    jobcap = jobcap ? jobcap * 2 : 64;
    jobs = realloc(jobs, jobcap * sizeof *jobs);
    if (!jobs) exit(1);
  }
  jobs[njobs++] = (struct job){.seq = seq, .pid = pid, .err = ep[0], .cap = cp[0], .out = {op[0], xp[0]}, .relayed = relays};
}

/* Reads what the captured stderr holds now (a bounded amount, as relay); past CAPTURE_MAX it is read and dropped. */
static void drain(struct job *j) {
  char buf[8192];
  for (int reads = 0; reads < 64; reads++) {
    ssize_t n = read(j->cap, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) close_fd(&j->cap); /* closed: out of the poll set, or poll would report it again and again */
    if (n <= 0) return;
    size_t keep = j->len < CAPTURE_MAX ? CAPTURE_MAX - j->len : 0;
    if ((size_t)n < keep) keep = (size_t)n;
    if (keep) {
      char *o = realloc(j->buf, j->len + keep);
      if (!o) exit(1);
      j->buf = o;
      memcpy(j->buf + j->len, buf, keep);
      j->len += keep;
    }
  }
}

/*
 * Forwards what a relayed pipe holds now, at most `reads` chunks of 64 KiB: a command flooding its
 * output must not keep this loop from everyone else's commands.
 */
static void relay(struct job *j, int which, int reads) {
  static char buf[65536];
  while (reads-- > 0) {
    ssize_t n = read(j->out[which], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) close_fd(&j->out[which]);
    if (n <= 0) return;
    reply(j->seq, which ? 'E' : 'o', 0, buf, (size_t)n);
  }
}

static void drop(size_t i) {
  struct job *j = &jobs[i];
  close_fd(&j->err);
  close_fd(&j->cap);
  close_fd(&j->out[0]);
  close_fd(&j->out[1]);
  free(j->buf);
  jobs[i] = jobs[--njobs];
}

/* A reaped job whose relayed output has ended is done. */
static void settle(size_t i) {
  struct job *j = &jobs[i];
  if (j->pid != 0 || j->out[0] >= 0 || j->out[1] >= 0) return;
  reply(j->seq, 'z', 0, "", 0);
  drop(i);
}

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    size_t i = 0;
    while (i < njobs && jobs[i].pid != pid) i++;
    if (i == njobs) {
      /* A sandbox's init that died is news to the node: the sandbox is over (an OOM kill, say). */
      char p[24];
      int n = snprintf(p, sizeof p, "%d", (int)pid);
      reply(0, 'd', WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), p, (size_t)n);
      continue;
    }
    struct job *j = &jobs[i];
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    char why[512];
    ssize_t n = read(j->err, why, sizeof why);
    /* What it wrote before it ended goes before its exit (up to 1 MiB; the rest follows). */
    if (j->out[0] >= 0) relay(j, 0, 16);
    if (j->out[1] >= 0) relay(j, 1, 16);
    if (n > 0) {
      reply(j->seq, 'e', code, why, (size_t)n);
    } else {
      if (j->cap >= 0) drain(j);
      reply(j->seq, 'x', code, j->buf ? j->buf : "", j->len);
    }
    j->pid = 0;
    if (j->relayed) settle(i);
    else drop(i);
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
      if (jobs[i].seq == seq && jobs[i].pid > 0) kill(jobs[i].pid, atoi(s[2]));
    return;
  }
  if (strcmp(s[1], "release") == 0 && n >= 3) {
    /* Only a disk fd this process holds: anything else (its own pipes) stays open. */
    int fd = atoi(s[2]);
    for (size_t i = 0; i < nheld; i++)
      if (held[i] == fd) {
        close(fd);
        held[i] = held[--nheld];
        break;
      }
    return;
  }
  if (strcmp(s[1], "hold") == 0 || strcmp(s[1], "go") == 0) {
    for (size_t i = 0; i < njobs; i++)
      if (jobs[i].seq == seq) jobs[i].held = s[1][0] == 'h';
    return;
  }
  if (strcmp(s[1], "close") == 0) {
    for (size_t i = 0; i < njobs; i++)
      if (jobs[i].seq == seq && jobs[i].pid == 0) {
        drop(i);
        break;
      }
    return;
  }
  const char *bad = "malformed request";
  if (strcmp(s[1], "run") != 0 || n < 7) {
    reply(seq, 'e', -1, bad, strlen(bad));
    return;
  }
  struct run r = {.seq = seq, .flags = s[2], .in = s[3], .out = s[4], .err = s[5]};
  int i = 6;
  if (strchr(r.flags, 'm')) {
    if (n < i + 5) {
      reply(seq, 'e', -1, bad, strlen(bad));
      return;
    }
    r.disk = s[i];
    r.opts = s[i + 1];
    r.uid = (unsigned)strtoul(s[i + 2], NULL, 10);
    r.ovl = s[i + 3];
    r.rootfs = s[i + 4];
    i += 5;
    if (n < i + 5) {
      reply(seq, 'e', -1, bad, strlen(bad));
      return;
    }
    r.idsize = (unsigned)strtoul(s[i], NULL, 10);
    r.mq = strtoul(s[i + 1], NULL, 10);
    r.sigpending = strtoul(s[i + 2], NULL, 10);
    r.ucounts = s[i + 3];
    r.nlowers = atoi(s[i + 4]);
    i += 5;
    if (r.nlowers < 0 || r.nlowers > 500 || n < i + r.nlowers || (r.nlowers > 0 && r.idsize == 0)) {
      reply(seq, 'e', -1, bad, strlen(bad));
      return;
    }
    r.lowers = &s[i];
    i += r.nlowers;
  }
  int argc = i < n ? atoi(s[i++]) : 0;
  if (argc < 1 || i + argc >= n) {
    reply(seq, 'e', -1, bad, strlen(bad));
    return;
  }
  char **argv = &s[i];
  i += argc;
  int envc = atoi(s[i]);
  if (envc < 0 || i + 1 + envc > n) {
    reply(seq, 'e', -1, bad, strlen(bad));
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

static int seal_fd(int src, const char *name, const char *what);

/* A sealed memfd copy of `path` (see the top), or -1 with the reason on stderr. */
static int seal_copy(const char *path) {
  int src = open(path, O_RDONLY | O_CLOEXEC);
  /* Named as the program: its processes show as memfd:<name> in ps. */
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  if (src < 0) {
    dprintf(2, "spawner: %s: %s; it runs unsealed\n", path, strerror(errno));
    return -1;
  }
  return seal_fd(src, base, path);
}

/* A sealed memfd copy of what `src` holds, named `name`; closes `src`. -1 (said why) if it fails. */
static int seal_fd(int src, const char *name, const char *what) {
  struct stat st;
  if (fstat(src, &st) < 0) {
    dprintf(2, "spawner: %s: %s; it runs unsealed\n", what, strerror(errno));
    close(src);
    return -1;
  }
  int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  off_t sent = 0;
  while (fd >= 0 && sent < st.st_size) {
    /* At an explicit offset: fd 3's file offset is shared with the node, and a respawned spawner copies it again. */
    off_t at = sent;
    ssize_t n = sendfile(fd, src, &at, (size_t)(st.st_size - sent));
    if (n <= 0) break;
    sent += n;
  }
  close(src);
  if (fd < 0 || sent != st.st_size || fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) < 0) {
    dprintf(2, "spawner: cannot seal a copy of %s: %s; it runs unsealed\n", what, strerror(errno));
    if (fd >= 0) close(fd);
    return -1;
  }
  /* Above the fds a child is given (0-3), which it must not lose to a dup2 or close(3). */
  int high = fcntl(fd, F_DUPFD_CLOEXEC, 10);
  close(fd);
  return high;
}

int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "fd3") == 0) have_fd3 = fcntl(3, F_GETFD) >= 0;
    else if (strncmp(argv[i], "seal=", 5) == 0) {
      sealed_path = argv[i] + 5;
      sealed_fd = seal_copy(sealed_path);
    }
  }
  if (have_fd3) {
    /*
     * The sandbox init, from a sealed in-memory copy: run from the node's file, a sandbox's
     * /proc/1/exe named it (its path under the node's cache), and exec'd from an fd of that file the
     * init would hold the node's binary itself.
     */
    int src = fcntl(3, F_DUPFD_CLOEXEC, 10);
    int copy = src >= 0 ? seal_fd(src, "init", "the sandbox init") : -1;
    if (copy >= 0) {
      dup2(copy, 3);
      close(copy);
    }
    fcntl(3, F_SETFD, 0);
  } else if (fcntl(3, F_GETFD) >= 0) {
    fcntl(3, F_SETFD, FD_CLOEXEC);
  } else {
    /* Hold fd 3 (on /dev/null) so that none of ours lands there: a child closes 3 unless it is passed. */
    int n = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (n >= 0 && n != 3) {
      dup3(n, 3, O_CLOEXEC);
      close(n);
    }
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  /*
   * `crun run -d` leaves the sandbox's init behind as an orphan: as subreaper, this process
   * becomes its parent, and reaps it the moment it dies (an OOM kill, `crun delete`) instead of it
   * staying a zombie until the host's pid 1 gets to it.
   */
  prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
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
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, keep_sock) < 0) perror("spawner: socketpair (no snapshots of sandboxes' files)");

  char *buf = malloc(FRAME_MAX + 4);
  size_t have = 0;
  struct pollfd *pfd = NULL;
  size_t pcap = 0;
  for (;;) {
    if (pcap < 3 * njobs + 3) {
      pcap = (3 * njobs + 3) * 2;
      pfd = realloc(pfd, pcap * sizeof *pfd);
      if (!pfd || !buf) exit(1);
    }
    pfd[0] = (struct pollfd){.fd = 0, .events = POLLIN};
    pfd[1] = (struct pollfd){.fd = sfd, .events = POLLIN};
    pfd[2] = (struct pollfd){.fd = keep_sock[0], .events = POLLIN};
    size_t np = 3;
    for (size_t i = 0; i < njobs; i++) {
      int fds[] = {jobs[i].cap, jobs[i].held ? -1 : jobs[i].out[0], jobs[i].held ? -1 : jobs[i].out[1]};
      for (int k = 0; k < 3; k++)
        if (fds[k] >= 0) pfd[np++] = (struct pollfd){.fd = fds[k], .events = POLLIN};
    }
    if (poll(pfd, np, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (keep_sock[0] >= 0) take_disks();
    if (pfd[1].revents) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {
      }
      reap();
    }
    for (size_t i = 3; i < np; i++) {
      if (!pfd[i].revents) continue;
      for (size_t k = 0; k < njobs; k++) {
        struct job *j = &jobs[k];
        if (j->cap == pfd[i].fd) drain(j);
        else if (j->out[0] == pfd[i].fd || j->out[1] == pfd[i].fd) {
          relay(j, j->out[1] == pfd[i].fd, 1);
          settle(k);
        } else continue;
        break;
      }
    }
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
