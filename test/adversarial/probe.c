// What an agent probing its sandbox would try, one line per attempt: "<name> <result>", where
// result is OK or the errno's name. Built static by the adversarial suite and copied into a
// sandbox through the files API (the busybox image has no compiler).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/perf_event.h>
#include <mqueue.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void report(const char *name, long r) {
  if (r >= 0) printf("%s OK\n", name);
  else printf("%s %s\n", name, strerrorname_np(errno));
  fflush(stdout);
}

#define IOC(dir, type, nr, size) (((unsigned long)(dir) << 30) | ((unsigned long)(size) << 16) | ((unsigned long)(type) << 8) | (nr))

#ifndef AF_VSOCK
#define AF_VSOCK 40
#endif
#ifndef AF_ALG
#define AF_ALG 38
#endif

/* `probe sockets`: each socket family, allowed (OK) or not (the errno). */
static int sockets(void) {
  report("socket_unix", socket(AF_UNIX, SOCK_STREAM, 0));
  report("socket_inet", socket(AF_INET, SOCK_STREAM, 0));
  report("socket_inet6", socket(AF_INET6, SOCK_DGRAM, 0));
  report("socket_netlink_route", socket(AF_NETLINK, SOCK_RAW, 0));
  report("socketpair_unix", socketpair(AF_UNIX, SOCK_STREAM, 0, (int[2]){0, 0}));
  report("socket_vsock", socket(AF_VSOCK, SOCK_STREAM, 0));
  report("socket_alg", socket(AF_ALG, SOCK_SEQPACKET, 0));
  report("socket_packet", socket(AF_PACKET, SOCK_DGRAM, 0));
  report("socket_netlink_audit", socket(AF_NETLINK, SOCK_RAW, 9));
  report("socket_netlink_kobject_uevent", socket(AF_NETLINK, SOCK_DGRAM, 15));
  report("socket_netlink_netfilter", socket(AF_NETLINK, SOCK_RAW, 12));
  report("socket_key", socket(AF_KEY, SOCK_RAW, 2));
  report("socket_bluetooth", socket(AF_BLUETOOTH, SOCK_RAW, 0));
  report("socket_appletalk", socket(AF_APPLETALK, SOCK_DGRAM, 0));
  report("socket_tipc", socket(AF_TIPC, SOCK_RDM, 0));
  report("socket_rds", socket(AF_RDS, SOCK_SEQPACKET, 0));
  report("socket_family_200", socket(200, SOCK_STREAM, 0));
  report("socketpair_inet", socketpair(AF_INET, SOCK_STREAM, 0, (int[2]){0, 0}));
  return 0;
}

/* `probe procs N`: N children that wait forever (a sandbox full of processes), then "started N". */
static int procs(int n) {
  int i = 0;
  for (; i < n; i++) {
    pid_t c = fork();
    if (c < 0) break;
    if (c == 0) {
      for (;;) pause();
    }
  }
  printf("started %d\n", i);
  return 0;
}

/* `probe deep DIR N`: a chain of N directories under DIR (far past PATH_MAX), then "deep N". */
static int deep(const char *dir, int n) {
  if (mkdir(dir, 0755) < 0 || chdir(dir) < 0) return 1;
  int i = 0;
  for (; i < n; i++)
    if (mkdir("d", 0755) < 0 || chdir("d") < 0) break;
  printf("deep %d\n", i);
  return i == n ? 0 : 1;
}

/* `probe swap DIR SECONDS`: swaps DIR/a (a directory) and DIR/b (a symlink to /) as fast as it can. */
static int swap(const char *dir, int seconds) {
  char a[4096], b[4096];
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  mkdir(dir, 0755);
  mkdir(a, 0755);
  char f[4200];
  snprintf(f, sizeof f, "%s/f", a);
  close(open(f, O_CREAT | O_WRONLY, 0644));
  if (symlink("/", b) < 0 && errno != EEXIST) return 1;
  long n = 0;
  time_t end = time(NULL) + seconds;
  while (time(NULL) < end)
    for (int k = 0; k < 1000; k++, n++) syscall(SYS_renameat2, AT_FDCWD, a, AT_FDCWD, b, 2 /* RENAME_EXCHANGE */);
  printf("swapped %ld\n", n);
  return 0;
}

/* `probe inotify N SECONDS`: up to N inotify instances, "inotify <count> <errno of the first refusal>", held SECONDS. */
static int inotify(int n, int seconds) {
  int i = 0;
  const char *why = "none";
  for (; i < n; i++)
    if (syscall(SYS_inotify_init1, 0) < 0) {
      why = strerrorname_np(errno);
      break;
    }
  printf("inotify %d %s\n", i, why);
  fflush(stdout);
  sleep(seconds);
  return 0;
}

/* `probe watches N SECONDS`: up to N inotify watches (on 300 files, over up to 60 instances), "watches <count> <errno of the first refusal>", held. */
static int watches(int n, int seconds) {
  char dir[64], path[96];
  snprintf(dir, sizeof dir, "/tmp/paddock-watches-%d", (int)getpid());
  mkdir(dir, 0700);
  enum { FILES = 300 };
  for (int f = 0; f < FILES; f++) {
    snprintf(path, sizeof path, "%s/%d", dir, f);
    close(open(path, O_CREAT | O_WRONLY, 0600));
  }
  int count = 0;
  const char *why = "none";
  for (int i = 0; i < 60 && count < n && strcmp(why, "none") == 0; i++) {
    int in = inotify_init1(0);
    if (in < 0) {
      why = strerrorname_np(errno);
      break;
    }
    for (int f = 0; f < FILES && count < n; f++) {
      snprintf(path, sizeof path, "%s/%d", dir, f);
      if (inotify_add_watch(in, path, IN_MODIFY) < 0) {
        why = strerrorname_np(errno);
        break;
      }
      count++;
    }
  }
  printf("watches %d %s\n", count, why);
  fflush(stdout);
  sleep(seconds);
  for (int f = 0; f < FILES; f++) {
    snprintf(path, sizeof path, "%s/%d", dir, f);
    unlink(path);
  }
  rmdir(dir);
  return 0;
}

/* `probe epoll N SECONDS`: up to N epoll watches (each of 500 epoll instances watching up to 500 pipe ends), held. */
static int epolls(int n, int seconds) {
  enum { FDS = 500 };
  int fds[FDS];
  int nfds = 0;
  for (; nfds + 1 < FDS; nfds += 2) {
    int p[2];
    if (pipe(p) < 0) break;
    fds[nfds] = p[0];
    fds[nfds + 1] = p[1];
  }
  int count = 0;
  const char *why = "none";
  while (count < n && strcmp(why, "none") == 0) {
    int ep = epoll_create1(0);
    if (ep < 0) {
      why = strerrorname_np(errno);
      break;
    }
    for (int i = 0; i < nfds && count < n; i++) {
      struct epoll_event ev = {.events = EPOLLIN};
      if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev) < 0) {
        why = strerrorname_np(errno);
        break;
      }
      count++;
    }
  }
  printf("epoll %d %s\n", count, why);
  fflush(stdout);
  sleep(seconds);
  return 0;
}

/* `probe pipes N SECONDS`: up to N pipes of 1 MiB each (F_SETPIPE_SZ), "pipes <count> <errno of the first refusal>", held SECONDS. */
static int pipes(int n, int seconds) {
  int i = 0;
  const char *why = "none";
  for (; i < n; i++) {
    int p[2];
    if (pipe(p) < 0 || fcntl(p[0], F_SETPIPE_SZ, 1 << 20) < 0) {
      why = strerrorname_np(errno);
      break;
    }
  }
  printf("pipes %d %s\n", i, why);
  fflush(stdout);
  sleep(seconds);
  return 0;
}

/* `probe sigqueue N SECONDS`: up to N RT signals queued to itself (blocked), "sigqueue <count> <errno>", held SECONDS. */
static int queue_signals(int n, int seconds) {
  sigset_t rt;
  sigemptyset(&rt);
  sigaddset(&rt, SIGRTMIN);
  sigprocmask(SIG_BLOCK, &rt, NULL);
  int i = 0;
  const char *why = "none";
  for (; i < n; i++)
    if (sigqueue(getpid(), SIGRTMIN, (union sigval){.sival_int = i}) < 0) {
      why = strerrorname_np(errno);
      break;
    }
  printf("sigqueue %d %s\n", i, why);
  fflush(stdout);
  sleep(seconds);
  return 0;
}

/* Sends up to n copies of one fd over a unix socket and never receives them: they stay "in flight", counted per host user. */
static int scm_fds(int n, int seconds) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK, 0, sv) < 0) {
    printf("scmfds 0 %s\n", strerrorname_np(errno));
    return 0;
  }
  int fd = open("/dev/null", O_RDONLY);
  enum { PER = 250 };
  int fds[PER];
  for (int i = 0; i < PER; i++) fds[i] = fd;
  int sent = 0;
  const char *why = "none";
  while (sent < n) {
    int k = n - sent < PER ? n - sent : PER;
    char byte = 0;
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
      struct cmsghdr h;
      char buf[CMSG_SPACE(sizeof(int) * PER)];
    } c;
    memset(&c, 0, sizeof c);
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf, .msg_controllen = CMSG_SPACE(sizeof(int) * k)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * k);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * k);
    if (sendmsg(sv[0], &m, 0) < 0) {
      why = strerrorname_np(errno);
      break;
    }
    sent += k;
  }
  printf("scmfds %d %s\n", sent, why);
  fflush(stdout);
  sleep(seconds);
  return 0;
}

/* Opens POSIX message queues of ~8 KiB each until `bytes` are promised or the kernel says no; holds them. */
static int mqueues(int bytes, int seconds) {
  struct mq_attr a = {.mq_maxmsg = 8, .mq_msgsize = 1024};
  int n = 0;
  const char *why = "none";
  char name[64];
  for (; n * 8 * 1024 < bytes; n++) {
    snprintf(name, sizeof name, "/paddock-probe-%d-%d", (int)getpid(), n);
    mqd_t q = mq_open(name, O_CREAT | O_EXCL | O_RDWR, 0600, &a);
    if (q == (mqd_t)-1) {
      why = strerrorname_np(errno);
      break;
    }
  }
  printf("mqueue %d %s\n", n, why);
  fflush(stdout);
  sleep(seconds);
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "/paddock-probe-%d-%d", (int)getpid(), i);
    mq_unlink(name);
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "sockets") == 0) return sockets();
  if (argc > 3 && strcmp(argv[1], "sigqueue") == 0) return queue_signals(atoi(argv[2]), atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "watches") == 0) return watches(atoi(argv[2]), atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "epoll") == 0) return epolls(atoi(argv[2]), atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "scmfds") == 0) return scm_fds(atoi(argv[2]), atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "mqueue") == 0) return mqueues(atoi(argv[2]), atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "pipes") == 0) return pipes(atoi(argv[2]), atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "inotify") == 0) return inotify(atoi(argv[2]), atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "deep") == 0) return deep(argv[2], atoi(argv[3]));
  if (argc > 3 && strcmp(argv[1], "swap") == 0) return swap(argv[2], atoi(argv[3]));
  if (argc > 2 && strcmp(argv[1], "procs") == 0) return procs(atoi(argv[2]));
  char buf[4096] = {0};
  report("mount", mount("none", "/mnt", "tmpfs", 0, NULL));
  report("umount", umount2("/proc", MNT_DETACH));
  report("unshare_user", unshare(CLONE_NEWUSER));
  report("unshare_mount", unshare(CLONE_NEWNS));
  report("unshare_net", unshare(CLONE_NEWNET));
  int ns = open("/proc/self/ns/net", O_RDONLY);
  report("setns", setns(ns, 0));
  report("clone3", syscall(SYS_clone3, NULL, 0));
  pid_t child = fork();
  if (child == 0) {
    pause();
    _exit(0);
  }
  report("ptrace_attach", ptrace(PTRACE_ATTACH, child, NULL, NULL));
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  report("init_module", syscall(SYS_init_module, buf, sizeof buf, ""));
  report("finit_module", syscall(SYS_finit_module, 0, "", 0));
  report("delete_module", syscall(SYS_delete_module, "ext4", 0));
  report("bpf", syscall(SYS_bpf, 0, buf, 64));
  struct perf_event_attr pe = {.type = PERF_TYPE_SOFTWARE, .size = sizeof pe, .config = PERF_COUNT_SW_CPU_CLOCK};
  report("perf_event_open", syscall(SYS_perf_event_open, &pe, 0, -1, -1, 0));
  report("kexec_load", syscall(SYS_kexec_load, 0, 0, NULL, 0));
  report("keyctl", syscall(SYS_keyctl, 0, 0, 0, 0, 0));
  report("add_key", syscall(SYS_add_key, "user", "k", "v", 1, -4));
  report("userfaultfd", syscall(SYS_userfaultfd, 0));
  report("io_uring_setup", syscall(SYS_io_uring_setup, 1, buf));
  report("socket_packet", socket(AF_PACKET, SOCK_RAW, 0));
  report("socket_raw", socket(AF_INET, SOCK_RAW, 1));
  report("mknod", mknod("/tmp/null", S_IFCHR | 0666, makedev(1, 3)));
  report("chroot", chroot("/tmp"));
  report("reboot", reboot(RB_POWER_OFF));
  report("open_by_handle_at", syscall(SYS_open_by_handle_at, AT_FDCWD, buf, O_RDONLY));
  int fd = open("/tmp/swapext-target", O_RDWR | O_CREAT, 0644);
  // XFS_IOC_SWAPEXT (_IOWR('X', 109, struct xfs_swapext)): the ioctl that shut a filesystem down.
  report("ioctl_swapext", syscall(SYS_ioctl, fd, IOC(3, 'X', 109, 192), buf));
  // The same request with garbage in the upper 32 bits, which the kernel ignores.
  report("ioctl_swapext_high", syscall(SYS_ioctl, fd, (0xdeadbeefUL << 32) | IOC(3, 'X', 109, 192), buf));
  report("ioctl_shutdown", syscall(SYS_ioctl, fd, IOC(2, 'X', 125, 4), buf));
  report("ioctl_move_ext", syscall(SYS_ioctl, fd, IOC(3, 'f', 15, 40), buf));
  return 0;
}
