/*
 * vmm-exec: runs QEMU (argv[1..]) with punching holes in files turned into a no-op.
 *
 * A clone maps its template's RAM file private (copy-on-write). When its guest reports free
 * memory (virtio-balloon free-page reporting), QEMU 7.2's ram_block_discard_range() punches a
 * hole in the backing file and then drops its private copy with madvise(MADV_DONTNEED). For a
 * private mapping the first step is wrong: it zeroes those pages of the template itself, under
 * every other clone that has not copied them yet and every clone started after (QEMU 8.2 stopped
 * doing it). QEMU opens the file as root, before it drops to its own user, so permissions cannot
 * stop it, and a read-only backend (readonly=on) maps guest RAM read-only in 7.2.
 *
 * So a seccomp filter, installed before QEMU starts (it stacks under QEMU's own `-sandbox on`,
 * and an errno beats an allow), answers fallocate(FALLOC_FL_PUNCH_HOLE) with success without doing
 * it. QEMU then goes on to MADV_DONTNEED, which is the whole of what a private mapping needs: the
 * host gets the memory back and the page reads as the template's again. Nothing else of a VMM's
 * punches holes: its layer disks are read-only and its writable disk lives in guest RAM.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/falloc.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: vmm-exec <program> [args...]\n");
    return 2;
  }
  struct sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fallocate, 1, 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
      /* mode: the second argument's low 32 bits (little-endian). */
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
      BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, FALLOC_FL_PUNCH_HOLE, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | 0),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
  /* Root (QEMU drops to its user later): no no_new_privs needed, and none set, so -runas still works. */
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
    fprintf(stderr, "vmm-exec: seccomp: %s\n", strerror(errno));
    return 126;
  }
  execvp(argv[1], argv + 1);
  fprintf(stderr, "vmm-exec: %s: %s\n", argv[1], strerror(errno));
  return 127;
}
