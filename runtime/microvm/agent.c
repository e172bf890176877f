/*
 * Paddock's microVM guest init and agent: pid 1 of the guest, from the initramfs.
 *
 * Boot: mounts /dev, /proc, /sys, cgroup2; loads the kernel modules the initramfs lists in
 * /modules.order (the Debian cloud kernel has virtio, virtio-mmio, virtio-console, virtio-blk,
 * erofs and overlayfs as modules, virtio_ring before virtio); mounts each image layer (a
 * read-only virtio-blk disk whose serial is pdk-l<i>) as EROFS, a tmpfs of pdk.disk MiB as the
 * writable layer, and the overlay of both at /root. Guest programs run chrooted there: the agent
 * and the initramfs are not in their view.
 *
 * The agent speaks a framed protocol over one virtio-serial port (named "paddock"): a 12-byte
 * header (u32 payload length, u16 type, u16 zero, u32 id, little-endian) and a payload. It keeps
 * the port's one descriptor open for its whole life: a second opener gets EBUSY, and while the
 * host side is away reads return EOF (the agent waits and reads again). Every exec runs in a cgroup
 * of its own, so that KILL ends its whole process tree (cgroup.kill), whatever it forked or setsid.
 * Those cgroups are below one for the sandbox (SB_CG), which holds its pids limit (SYNC sets it);
 * an exec's EXIT says whether, while it ran, the sandbox's OOM kills or pids-limit hits went up
 * (the containers' verdicts, same before/after). Until Linux 6.10 a refused fork is counted in the
 * pids.events of the forking task's cgroup, not of the one whose limit it hit: the exec's own
 * cgroup is read as well. A hit of the pids limit also ends the exec at once, as on a container: a
 * fork bomb never ends by itself.
 * Files are opened with openat2(RESOLVE_IN_ROOT) below /root: `..` and symlinks cannot leave it.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <linux/random.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum {
  T_EXEC = 1, T_STDIN = 2, T_KILL = 3, T_FREAD = 4, T_FWRITE = 5, T_FLIST = 6, T_FREMOVE = 7, T_SYNC = 8, T_PING = 9, T_NET = 10,
  T_OUT = 101, T_ERR = 102, T_EXIT = 103, T_REPLY = 104,
};
#define MAX_FRAME (2u << 20)
#define MAX_EXECS 64
#define ROOT "/root"
#define SB_CG "/sys/fs/cgroup/sb"
/* Bits of an EXIT's second word. */
#define EXIT_OOM 1u
#define EXIT_PIDS 2u

struct exec {
  uint32_t id;
  pid_t pid;
  int out, err, in;
  char *pend;
  size_t pendlen, pendoff;
  int stdin_eof;
  /* The sandbox's counters when it started (memory.events oom_kill, pids.events max). */
  uint64_t oom0, pids0;
  /* Its cgroup's pids.events, open to be told (POLLPRI) of a refused fork. */
  int pev;
};
static struct exec execs[MAX_EXECS];
static int port = -1;
static int rootfd = -1;

static void logf_(const char *m) {
  int fd = open("/dev/kmsg", O_WRONLY);
  if (fd >= 0) {
    dprintf(fd, "paddock-agent: %s (%s)\n", m, strerror(errno));
    close(fd);
  }
}

static void put32(char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

static void writeall(const char *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(port, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) { struct pollfd p = {port, POLLOUT, 0}; poll(&p, 1, 100); continue; }
      return;
    }
    b += w;
    n -= (size_t)w;
  }
}

static void send_frame(uint16_t type, uint32_t id, const void *a, size_t alen, const void *b, size_t blen) {
  char h[12];
  put32(h, (uint32_t)(alen + blen));
  uint32_t t = type;
  memcpy(h + 4, &t, 4);
  put32(h + 8, id);
  writeall(h, 12);
  if (alen) writeall(a, alen);
  if (blen) writeall(b, blen);
}

static void reply(uint32_t id, int err, const void *data, size_t n) {
  char e[4];
  put32(e, (uint32_t)err);
  send_frame(T_REPLY, id, e, 4, data, n);
}

static int writefile(const char *path, const char *s) {
  int fd = open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t w = write(fd, s, strlen(s));
  close(fd);
  return w < 0 ? -1 : 0;
}

/* ─── boot ─────────────────────────────────────────────────────────────────────────────────── */

static void load_modules(void) {
  FILE *f = fopen("/modules.order", "r");
  if (!f) return;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\n")] = 0;
    if (!line[0]) continue;
    int fd = open(line, O_RDONLY | O_CLOEXEC);
    if (fd < 0) { logf_(line); continue; }
    if (syscall(SYS_finit_module, fd, "", 0) != 0 && errno != EEXIST) logf_(line);
    close(fd);
  }
  fclose(f);
}

static long cmdline_num(const char *key, long dflt) {
  char buf[4096] = {0};
  int fd = open("/proc/cmdline", O_RDONLY);
  if (fd < 0) return dflt;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return dflt;
  char *p = strstr(buf, key);
  return p ? strtol(p + strlen(key), NULL, 10) : dflt;
}

/* The block device whose serial is `serial` (devices appear asynchronously after virtio_blk loads). */
static int find_disk(const char *serial, char *dev, size_t n) {
  for (int tries = 0; tries < 500; tries++) {
    DIR *d = opendir("/sys/block");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (strncmp(e->d_name, "vd", 2) != 0) continue;
      char p[300], s[64] = {0};
      snprintf(p, sizeof p, "/sys/block/%s/serial", e->d_name);
      int fd = open(p, O_RDONLY);
      if (fd < 0) continue;
      ssize_t r = read(fd, s, sizeof s - 1);
      close(fd);
      if (r > 0 && strncmp(s, serial, strlen(serial)) == 0 && (s[strlen(serial)] == 0 || s[strlen(serial)] == '\n')) {
        snprintf(dev, n, "/dev/%s", e->d_name);
        closedir(d);
        if (access(dev, F_OK) == 0) return 0;
        goto again;
      }
    }
    if (d) closedir(d);
  again:
    usleep(10000);
  }
  return -1;
}

static int open_port(void) {
  for (int tries = 0; tries < 1000; tries++) {
    DIR *d = opendir("/sys/class/virtio-ports");
    struct dirent *e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char p[300], s[64] = {0};
      snprintf(p, sizeof p, "/sys/class/virtio-ports/%s/name", e->d_name);
      int fd = open(p, O_RDONLY);
      if (fd < 0) continue;
      ssize_t r = read(fd, s, sizeof s - 1);
      close(fd);
      if (r > 0 && strncmp(s, "paddock", 7) == 0) {
        snprintf(p, sizeof p, "/dev/%s", e->d_name);
        int pfd = open(p, O_RDWR | O_CLOEXEC);
        if (pfd >= 0) { closedir(d); return pfd; }
      }
    }
    if (d) closedir(d);
    usleep(10000);
  }
  return -1;
}

/* The value of `key` in a cgroup's `key value` lines (memory.events, pids.events); 0 if unreadable. */
static uint64_t counter(const char *file, const char *key) {
  char buf[1024];
  int fd = open(file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  size_t kl = strlen(key);
  for (char *l = buf; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
    if (strncmp(l, key, kl) == 0 && l[kl] == ' ') return strtoull(l + kl + 1, NULL, 10);
  }
  return 0;
}

static uint64_t oom_kills(void) { return counter(SB_CG "/memory.events", "oom_kill"); }
static uint64_t pids_hits(void) { return counter(SB_CG "/pids.events", "max"); }

static void cg_path(char *p, size_t n, uint32_t id, const char *file);

/* Whether the exec's own cgroup saw a refused fork, or the sandbox's count went up since it started. */
static int exec_hit_pids(const struct exec *x) {
  char p[80];
  cg_path(p, sizeof p, x->id, "pids.events");
  return counter(p, "max") > 0 || pids_hits() > x->pids0;
}

static void kill_exec(const struct exec *x) {
  char p[80];
  cg_path(p, sizeof p, x->id, "cgroup.kill");
  if (writefile(p, "1") != 0) kill(-x->pid, SIGKILL);
}

static int if_up(const char *name) {
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return errno;
  struct ifreq ifr = {0};
  strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
  int err = 0;
  if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) err = errno;
  else {
    ifr.ifr_flags |= IFF_UP;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) err = errno;
  }
  close(s);
  return err;
}

static void boot(void) {
  mkdir("/dev", 0755); mkdir("/proc", 0755); mkdir("/sys", 0755);
  mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
  mount("proc", "/proc", "proc", 0, NULL);
  mount("sysfs", "/sys", "sysfs", 0, NULL);
  mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, NULL);
  writefile("/sys/fs/cgroup/cgroup.subtree_control", "+pids +memory");
  mkdir(SB_CG, 0755);
  writefile(SB_CG "/cgroup.subtree_control", "+pids +memory");
  load_modules();
  long layers = cmdline_num("pdk.layers=", 1), disk = cmdline_num("pdk.disk=", 64);
  mkdir("/l", 0755);
  char lower[4096] = "";
  for (long i = layers - 1; i >= 0; i--) {
    char serial[32], dev[64], dir[32];
    snprintf(serial, sizeof serial, "pdk-l%ld", i);
    snprintf(dir, sizeof dir, "/l/%ld", i);
    mkdir(dir, 0755);
    if (find_disk(serial, dev, sizeof dev) != 0) { logf_(serial); continue; }
    if (mount(dev, dir, "erofs", MS_RDONLY, NULL) != 0) { logf_(dev); continue; }
    if (lower[0]) strcat(lower, ":");
    strcat(lower, dir);
  }
  mkdir("/rw", 0755);
  char opts[64];
  snprintf(opts, sizeof opts, "size=%ldm,mode=0755", disk);
  mount("rw", "/rw", "tmpfs", 0, opts);
  mkdir("/rw/upper", 0755); mkdir("/rw/work", 0755);
  mkdir(ROOT, 0755);
  char ov[4400];
  snprintf(ov, sizeof ov, "lowerdir=%s,upperdir=/rw/upper,workdir=/rw/work", lower[0] ? lower : "/l");
  if (mount("overlay", ROOT, "overlay", 0, ov) != 0) logf_("overlay");
  mkdir(ROOT "/proc", 0555); mkdir(ROOT "/dev", 0755); mkdir(ROOT "/sys", 0555); mkdir(ROOT "/tmp", 01777);
  mount("proc", ROOT "/proc", "proc", 0, NULL);
  mount("devtmpfs", ROOT "/dev", "devtmpfs", 0, NULL);
  /* Terminals (xterm, script, a PTY) need ptys; GTK and Python's multiprocessing need POSIX shm. */
  mkdir(ROOT "/dev/pts", 0755); mkdir(ROOT "/dev/shm", 01777);
  mount("devpts", ROOT "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "ptmxmode=0666,mode=0620");
  mount("shm", ROOT "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m");
  mount("sysfs", ROOT "/sys", "sysfs", MS_RDONLY, NULL);
  rootfd = open(ROOT, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if_up("lo");
}

/* ─── exec ─────────────────────────────────────────────────────────────────────────────────── */

static struct exec *find_exec(uint32_t id) {
  for (int i = 0; i < MAX_EXECS; i++) if (execs[i].pid > 0 && execs[i].id == id) return &execs[i];
  return NULL;
}

static void cg_path(char *p, size_t n, uint32_t id, const char *file) {
  snprintf(p, n, SB_CG "/x%u%s%s", id, file ? "/" : "", file ? file : "");
}

static void do_exec(uint32_t id, const char *pl, uint32_t len) {
  if (len < 8) { send_frame(T_EXIT, id, "\xff\x7f\0\0", 4, NULL, 0); return; }
  uint32_t argc = get32(pl), envc = get32(pl + 4);
  if (argc == 0 || argc > 4096 || envc > 4096) { uint32_t st = 127 << 8; send_frame(T_EXIT, id, &st, 4, NULL, 0); return; }
  char **argv = calloc(argc + 1, sizeof *argv), **envp = calloc(envc + 1, sizeof *envp);
  const char *p = pl + 8, *end = pl + len;
  const char *cwd = p;
  p += strnlen(p, (size_t)(end - p)) + 1;
  for (uint32_t i = 0; i < argc && p < end; i++) { argv[i] = (char *)p; p += strnlen(p, (size_t)(end - p)) + 1; }
  for (uint32_t i = 0; i < envc && p < end; i++) { envp[i] = (char *)p; p += strnlen(p, (size_t)(end - p)) + 1; }
  if (p > end || !argv[argc - 1]) { free(argv); free(envp); uint32_t st = 127 << 8; send_frame(T_EXIT, id, &st, 4, NULL, 0); return; }
  struct exec *x = NULL;
  for (int i = 0; i < MAX_EXECS; i++) if (execs[i].pid == 0) { x = &execs[i]; break; }
  int o[2], e[2], in[2], ready[2];
  if (!x || pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC) || pipe2(in, O_CLOEXEC) || pipe2(ready, O_CLOEXEC)) {
    free(argv); free(envp);
    const char *m = "paddock-agent: too many execs\n";
    send_frame(T_ERR, id, m, strlen(m), NULL, 0);
    uint32_t st = 126 << 8; send_frame(T_EXIT, id, &st, 4, NULL, 0);
    return;
  }
  char cg[64];
  cg_path(cg, sizeof cg, id, NULL);
  mkdir(cg, 0755);
  uint64_t oom0 = oom_kills(), pids0 = pids_hits();
  pid_t pid = fork();
  if (pid == 0) {
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    char procs[80];
    cg_path(procs, sizeof procs, id, "cgroup.procs");
    writefile(procs, "0");
    setsid();
    dup2(in[0], 0); dup2(o[1], 1); dup2(e[1], 2);
    if (chroot(ROOT) != 0 || chdir("/") != 0) _exit(126);
    if (chdir(cwd[0] ? cwd : "/") != 0) { dprintf(2, "cd %s: %s\n", cwd, strerror(errno)); _exit(126); }
    int has_path = 0;
    for (uint32_t i = 0; i < envc; i++) if (envp[i] && strncmp(envp[i], "PATH=", 5) == 0) has_path = 1;
    environ = envp;
    if (!has_path) setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", 1);
    execvp(argv[0], argv);
    int err = errno;
    dprintf(2, "exec %s: %s\n", argv[0], strerror(err));
    _exit(err == ENOENT ? 127 : 126);
  }
  close(o[1]); close(e[1]); close(in[0]); close(ready[0]); close(ready[1]);
  free(argv); free(envp);
  fcntl(o[0], F_SETFL, O_NONBLOCK); fcntl(e[0], F_SETFL, O_NONBLOCK); fcntl(in[1], F_SETFL, O_NONBLOCK);
  if (pid < 0) {
    close(o[0]); close(e[0]); close(in[1]);
    uint32_t st = 126 << 8; send_frame(T_EXIT, id, &st, 4, NULL, 0);
    return;
  }
  char pe[80];
  cg_path(pe, sizeof pe, id, "pids.events");
  *x = (struct exec){ .id = id, .pid = pid, .out = o[0], .err = e[0], .in = in[1], .oom0 = oom0, .pids0 = pids0, .pev = open(pe, O_RDONLY | O_CLOEXEC) };
}

static void drain(struct exec *x, int which) {
  int *fd = which == 1 ? &x->out : &x->err;
  char buf[32768];
  for (;;) {
    if (*fd < 0) return;
    ssize_t n = read(*fd, buf, sizeof buf);
    if (n > 0) { send_frame(which == 1 ? T_OUT : T_ERR, x->id, buf, (size_t)n, NULL, 0); continue; }
    if (n == 0 || (errno != EAGAIN && errno != EINTR)) { close(*fd); *fd = -1; }
    return;
  }
}

static void flush_stdin(struct exec *x) {
  while (x->in >= 0 && x->pendoff < x->pendlen) {
    ssize_t w = write(x->in, x->pend + x->pendoff, x->pendlen - x->pendoff);
    if (w < 0) {
      if (errno == EAGAIN) return;
      x->pendoff = x->pendlen;
      break;
    }
    x->pendoff += (size_t)w;
  }
  if (x->pendoff >= x->pendlen) { free(x->pend); x->pend = NULL; x->pendlen = x->pendoff = 0; }
  if (x->stdin_eof && !x->pend && x->in >= 0) { close(x->in); x->in = -1; }
}

static void finish(struct exec *x, int status) {
  drain(x, 1);
  drain(x, 2);
  // Output still held open by background children is not waited for: the main process is done.
  if (x->out >= 0) close(x->out);
  if (x->err >= 0) close(x->err);
  if (x->in >= 0) close(x->in);
  free(x->pend);
  uint32_t st[2] = { (uint32_t)status, (oom_kills() > x->oom0 ? EXIT_OOM : 0) | (exec_hit_pids(x) ? EXIT_PIDS : 0) };
  if (x->pev >= 0) close(x->pev);
  uint32_t id = x->id;
  char cg[64];
  cg_path(cg, sizeof cg, id, NULL);
  rmdir(cg);  // fails while background processes live on in it: they keep their cgroup
  memset(x, 0, sizeof *x);
  send_frame(T_EXIT, id, st, 8, NULL, 0);
}

static void reap(void) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    for (int i = 0; i < MAX_EXECS; i++) if (execs[i].pid == pid) { finish(&execs[i], status); break; }
  }
}

/* ─── files ────────────────────────────────────────────────────────────────────────────────── */

static int open_in_root(const char *path, int flags, mode_t mode) {
  struct open_how how = { .flags = (uint64_t)(flags | O_CLOEXEC | O_NOFOLLOW), .mode = (flags & O_CREAT) ? mode : 0, .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
  int fd = (int)syscall(SYS_openat2, rootfd, path, &how, sizeof how);
  return fd;
}

/* The parent directory of `path` (resolved in the root) and the last component. */
static int open_parent(const char *path, char *name, size_t n) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", path);
  size_t l = strlen(buf);
  while (l > 1 && buf[l - 1] == '/') buf[--l] = 0;
  char *slash = strrchr(buf, '/');
  if (!slash) { errno = EINVAL; return -1; }
  snprintf(name, n, "%s", slash + 1);
  if (!name[0] || strcmp(name, ".") == 0 || strcmp(name, "..") == 0) { errno = EINVAL; return -1; }
  if (slash == buf) slash[1] = 0; else *slash = 0;
  struct open_how how = { .flags = O_PATH | O_DIRECTORY | O_CLOEXEC, .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
  return (int)syscall(SYS_openat2, rootfd, buf, &how, sizeof how);
}

static void mkparents(const char *path) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", path);
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/') continue;
    *p = 0;
    char name[256];
    int d = open_parent(buf, name, sizeof name);
    if (d >= 0) { mkdirat(d, name, 0755); close(d); }
    *p = '/';
  }
}

static void do_read(uint32_t id, const char *pl, uint32_t len) {
  if (len < 13) { reply(id, EINVAL, NULL, 0); return; }
  uint64_t off = get64(pl);
  uint32_t want = get32(pl + 8);
  const char *path = pl + 12;
  if (want > (1u << 20)) want = 1u << 20;
  int fd = open_in_root(path, O_RDONLY | O_NONBLOCK, 0);
  if (fd < 0) { reply(id, errno, NULL, 0); return; }
  struct stat st;
  if (fstat(fd, &st) != 0) { reply(id, errno, NULL, 0); close(fd); return; }
  if (S_ISDIR(st.st_mode)) { reply(id, EISDIR, NULL, 0); close(fd); return; }
  if (!S_ISREG(st.st_mode)) { reply(id, ENXIO, NULL, 0); close(fd); return; }
  char *buf = malloc(8 + (size_t)want);
  put64(buf, (uint64_t)st.st_size);
  size_t got = 0;
  while (got < want) {
    ssize_t r = pread(fd, buf + 8 + got, want - got, (off_t)(off + got));
    if (r <= 0) break;
    got += (size_t)r;
  }
  close(fd);
  reply(id, 0, buf, 8 + got);
  free(buf);
}

static void do_write(uint32_t id, const char *pl, uint32_t len) {
  if (len < 16) { reply(id, EINVAL, NULL, 0); return; }
  uint64_t off = get64(pl);
  uint32_t mode = get32(pl + 8), plen = get32(pl + 12);
  if (plen == 0 || 16 + (uint64_t)plen > len || pl[16 + plen - 1] != 0) { reply(id, EINVAL, NULL, 0); return; }
  const char *path = pl + 16;
  const char *data = pl + 16 + plen;
  size_t n = len - 16 - plen;
  int trunc = off == UINT64_MAX;
  mkparents(path);
  int fd = open_in_root(path, O_WRONLY | O_CREAT | O_NONBLOCK | (trunc ? O_TRUNC : 0), mode == UINT32_MAX ? 0644 : (mode & 07777));
  if (fd < 0) { reply(id, errno, NULL, 0); return; }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { reply(id, ENXIO, NULL, 0); close(fd); return; }
  size_t done = 0;
  uint64_t base = trunc ? 0 : off;
  while (done < n) {
    ssize_t w = pwrite(fd, data + done, n - done, (off_t)(base + done));
    if (w < 0) { reply(id, errno, NULL, 0); close(fd); return; }
    done += (size_t)w;
  }
  if (mode != UINT32_MAX) fchmod(fd, mode & 07777);
  fstat(fd, &st);
  close(fd);
  char sz[8];
  put64(sz, (uint64_t)st.st_size);
  reply(id, 0, sz, 8);
}

static void do_list(uint32_t id, const char *pl, uint32_t len) {
  if (len < 1) { reply(id, EINVAL, NULL, 0); return; }
  int fd = open_in_root(pl, O_RDONLY | O_DIRECTORY, 0);
  if (fd < 0) { reply(id, errno, NULL, 0); return; }
  DIR *d = fdopendir(fd);
  size_t cap = 65536, n = 0;
  char *out = malloc(cap);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    size_t nl = strlen(e->d_name);
    if (n + 23 + nl > cap) { cap = cap * 2 + nl; out = realloc(out, cap); }
    if (n + 23 + nl > MAX_FRAME - 64) break;
    out[n] = S_ISREG(st.st_mode) ? 'f' : S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : 'o';
    put32(out + n + 1, st.st_mode & 07777);
    put64(out + n + 5, (uint64_t)st.st_size);
    put64(out + n + 13, (uint64_t)st.st_mtim.tv_sec * 1000 + (uint64_t)st.st_mtim.tv_nsec / 1000000);
    uint16_t l16 = (uint16_t)nl;
    memcpy(out + n + 21, &l16, 2);
    memcpy(out + n + 23, e->d_name, nl);
    n += 23 + nl;
  }
  closedir(d);
  reply(id, 0, out, n);
  free(out);
}

static int remove_tree(int dir, const char *name, int depth) {
  if (unlinkat(dir, name, 0) == 0) return 0;
  if (errno != EISDIR && errno != EPERM) return -1;
  if (unlinkat(dir, name, AT_REMOVEDIR) == 0) return 0;
  if (errno != ENOTEMPTY && errno != EEXIST) return -1;
  if (depth > 256) { errno = ELOOP; return -1; }
  int fd = openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  DIR *d = fdopendir(fd);
  struct dirent *e;
  int rc = 0;
  while ((e = readdir(d))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (remove_tree(dirfd(d), e->d_name, depth + 1) != 0) rc = -1;
  }
  closedir(d);
  if (rc != 0) return -1;
  return unlinkat(dir, name, AT_REMOVEDIR);
}

static void do_remove(uint32_t id, const char *pl, uint32_t len) {
  if (len < 2) { reply(id, EINVAL, NULL, 0); return; }
  int recursive = pl[0] != 0;
  char name[256];
  int d = open_parent(pl + 1, name, sizeof name);
  if (d < 0) { reply(id, errno, NULL, 0); return; }
  struct stat st;
  if (fstatat(d, name, &st, AT_SYMLINK_NOFOLLOW) != 0) { reply(id, errno, NULL, 0); close(d); return; }
  // The O_PATH parent cannot be used by unlinkat on older kernels: reopen it as a directory.
  int rd = openat(d, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  close(d);
  if (rd < 0) { reply(id, errno, NULL, 0); return; }
  int rc;
  if (S_ISDIR(st.st_mode)) rc = recursive ? remove_tree(rd, name, 0) : unlinkat(rd, name, AT_REMOVEDIR);
  else rc = unlinkat(rd, name, 0);
  int err = rc == 0 ? 0 : errno;
  close(rd);
  reply(id, err, NULL, 0);
}

/* After a restore from a template or snapshot: this clone's own clock, entropy and identity. */
static void do_sync(uint32_t id, const char *pl, uint32_t len) {
  if (len < 8 + 32) { reply(id, EINVAL, NULL, 0); return; }
  uint64_t ns = get64(pl);
  struct timespec ts = { .tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull) };
  clock_settime(CLOCK_REALTIME, &ts);
  struct { int count, size; unsigned char buf[32]; } ent = { 256, 32, {0} };
  memcpy(ent.buf, pl + 8, 32);
  int r = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
  if (r >= 0) { ioctl(r, RNDADDENTROPY, &ent); close(r); }
  const char *host = pl + 40;
  size_t hl = strnlen(host, len - 40);
  if (hl > 0 && hl < 64) {
    sethostname(host, hl);
    int fd = open(ROOT "/etc/hostname", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) { dprintf(fd, "%.*s\n", (int)hl, host); close(fd); }
  }
  if (len >= 40 + hl + 1 + 32) {
    int fd = open(ROOT "/etc/machine-id", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0444);
    if (fd >= 0) { dprintf(fd, "%.32s\n", pl + 40 + hl + 1); close(fd); }
  }
  if (len >= 40 + hl + 1 + 32 + 4) {
    char n[16];
    snprintf(n, sizeof n, "%u", get32(pl + 40 + hl + 1 + 32));
    writefile(SB_CG "/pids.max", n);
  }
  reply(id, 0, NULL, 0);
}

/*
 * NET: the guest's eth0 (the VM's one virtio-net, whose other end the node relays to a tap of the
 * sandbox's: runtime/microvm/netrelay.c) gets `addr`/`prefix` and a default route through `gw`
 * (IPv4, network byte order), replacing what it had: a fork's copy starts with its parent's.
 */
static void do_net(uint32_t id, const char *pl, uint32_t len) {
  if (len < 9 || (uint8_t)pl[4] > 32) { reply(id, EINVAL, NULL, 0); return; }
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) { reply(id, errno, NULL, 0); return; }
  int err = if_up("eth0");
  struct ifreq ifr = {0};
  strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
  struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
  sin->sin_family = AF_INET;
  memcpy(&sin->sin_addr, pl, 4);
  if (!err && ioctl(s, SIOCSIFADDR, &ifr) != 0) err = errno;
  uint8_t prefix = (uint8_t)pl[4];
  uint32_t mask = prefix == 0 ? 0 : htonl(0xffffffffu << (32 - prefix));
  memcpy(&sin->sin_addr, &mask, 4);
  if (!err && ioctl(s, SIOCSIFNETMASK, &ifr) != 0) err = errno;
  struct rtentry rt = {0};
  ((struct sockaddr_in *)&rt.rt_dst)->sin_family = AF_INET;
  ((struct sockaddr_in *)&rt.rt_genmask)->sin_family = AF_INET;
  struct sockaddr_in *gw = (struct sockaddr_in *)&rt.rt_gateway;
  gw->sin_family = AF_INET;
  memcpy(&gw->sin_addr, pl + 5, 4);
  rt.rt_flags = RTF_UP | RTF_GATEWAY;
  rt.rt_dev = "eth0";
  // The default route a fork's parent had, if any: without a gateway, any default route matches.
  struct rtentry old = rt;
  memset(&old.rt_gateway, 0, sizeof old.rt_gateway);
  old.rt_gateway.sa_family = AF_INET;
  old.rt_flags = RTF_UP;
  while (!err && ioctl(s, SIOCDELRT, &old) == 0) {}
  if (!err && ioctl(s, SIOCADDRT, &rt) != 0) err = errno;
  close(s);
  reply(id, err, NULL, 0);
}

static void handle(uint16_t type, uint32_t id, const char *pl, uint32_t len) {
  switch (type) {
    case T_EXEC: do_exec(id, pl, len); break;
    case T_STDIN: {
      struct exec *x = find_exec(id);
      if (!x) break;
      if (len == 0) x->stdin_eof = 1;
      else {
        size_t left = x->pendlen - x->pendoff;
        char *b = malloc(left + len);
        if (left) memcpy(b, x->pend + x->pendoff, left);
        memcpy(b + left, pl, len);
        free(x->pend);
        x->pend = b; x->pendlen = left + len; x->pendoff = 0;
      }
      flush_stdin(x);
      break;
    }
    case T_KILL: {
      struct exec *x = find_exec(id);
      if (x) kill_exec(x);
      else {
        char p[80];
        cg_path(p, sizeof p, id, "cgroup.kill");
        writefile(p, "1");
      }
      break;
    }
    case T_FREAD: do_read(id, pl, len); break;
    case T_FWRITE: do_write(id, pl, len); break;
    case T_FLIST: do_list(id, pl, len); break;
    case T_FREMOVE: do_remove(id, pl, len); break;
    case T_SYNC: do_sync(id, pl, len); break;
    case T_NET: do_net(id, pl, len); break;
    case T_PING: reply(id, 0, NULL, 0); break;
    default: reply(id, ENOSYS, NULL, 0);
  }
}

int main(void) {
  if (getpid() == 1) boot();
  else rootfd = open(ROOT, O_PATH | O_DIRECTORY | O_CLOEXEC);
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGCHLD);
  sigprocmask(SIG_BLOCK, &mask, NULL);
  int sfd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
  port = open_port();
  if (port < 0) { logf_("no virtio-serial port named paddock"); for (;;) pause(); }
  char *buf = malloc(MAX_FRAME + 13);
  size_t have = 0;
  // The kernel marks a cgroup's events file changed (POLLPRI) when a counter in it goes up.
  int pev = open(SB_CG "/pids.events", O_RDONLY | O_CLOEXEC);
  uint64_t pids_seen = pids_hits();
  struct pollfd pf[3 + 4 * MAX_EXECS];
  for (;;) {
    int n = 0;
    pf[n++] = (struct pollfd){ port, POLLIN, 0 };
    pf[n++] = (struct pollfd){ sfd, POLLIN, 0 };
    pf[n++] = (struct pollfd){ pev, POLLPRI, 0 };
    for (int i = 0; i < MAX_EXECS; i++) {
      if (execs[i].pid == 0) continue;
      if (execs[i].out >= 0) pf[n++] = (struct pollfd){ execs[i].out, POLLIN, 0 };
      if (execs[i].err >= 0) pf[n++] = (struct pollfd){ execs[i].err, POLLIN, 0 };
      if (execs[i].in >= 0 && execs[i].pend) pf[n++] = (struct pollfd){ execs[i].in, POLLOUT, 0 };
      if (execs[i].pev >= 0) pf[n++] = (struct pollfd){ execs[i].pev, POLLPRI, 0 };
    }
    if (poll(pf, (nfds_t)n, -1) < 0 && errno != EINTR) continue;
    for (int k = 3; k < n; k++) {
      if (!(pf[k].revents & (POLLPRI | POLLERR))) continue;
      for (int i = 0; i < MAX_EXECS; i++) {
        if (execs[i].pid == 0 || execs[i].pev != pf[k].fd) continue;
        char tmp[256];
        lseek(execs[i].pev, 0, SEEK_SET);
        if (read(execs[i].pev, tmp, sizeof tmp) < 0) {}
        if (exec_hit_pids(&execs[i])) kill_exec(&execs[i]);
      }
    }
    for (int i = 0; i < MAX_EXECS; i++) {
      if (execs[i].pid == 0) continue;
      drain(&execs[i], 1);
      drain(&execs[i], 2);
      if (execs[i].pend) flush_stdin(&execs[i]);
    }
    if (pf[2].revents & (POLLPRI | POLLERR)) {
      char tmp[256];
      lseek(pev, 0, SEEK_SET);
      if (read(pev, tmp, sizeof tmp) < 0) {}
      uint64_t now = pids_hits();
      if (now > pids_seen) {
        for (int i = 0; i < MAX_EXECS; i++) if (execs[i].pid != 0) kill_exec(&execs[i]);
      }
      pids_seen = now;
    }
    if (pf[1].revents & POLLIN) {
      struct signalfd_siginfo si;
      while (read(sfd, &si, sizeof si) > 0) {}
      reap();
    }
    if (pf[0].revents & (POLLIN | POLLHUP)) {
      ssize_t r = read(port, buf + have, MAX_FRAME + 12 - have);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
        // The host side is not connected: wait for it (closing the port would drop what it sent).
        // A frame it left half-sent is dropped: the next host (a restarted node's) starts afresh.
        have = 0;
        usleep(20000);
        continue;
      }
      if (r < 0) continue;
      have += (size_t)r;
      size_t off = 0;
      while (have - off >= 12) {
        uint32_t len = get32(buf + off);
        uint16_t type;
        memcpy(&type, buf + off + 4, 2);
        uint32_t id = get32(buf + off + 8);
        if (len > MAX_FRAME) { have = off = 0; break; }  // out of step: drop what we have
        if (have - off < 12 + (size_t)len) break;
        // Paths are NUL-terminated in their frames; a frame's end is made a NUL too.
        char save = buf[off + 12 + len];
        buf[off + 12 + len] = 0;
        handle(type, id, buf + off + 12, len);
        buf[off + 12 + len] = save;
        off += 12 + len;
      }
      memmove(buf, buf + off, have - off);
      have -= off;
    }
  }
}
