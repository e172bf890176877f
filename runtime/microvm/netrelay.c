/*
 * A VM's network, for the node: `netrelay <tap> <socket>` attaches to the host tap device <tap>
 * (made by the node, with the sandbox's egress rules on it: runtime/network/egress.ts), connects to
 * the unix socket where the VM's QEMU serves its one virtio-net (`-netdev stream,server=on`), and
 * moves Ethernet frames between the two until either side ends: a frame read from the tap goes to
 * QEMU as a 4-byte big-endian length and the frame (QEMU's stream framing), and each such frame
 * from QEMU is written to the tap.
 *
 * Why a relay and not `-netdev tap` in QEMU: a VMM is started before a sandbox takes it (a spare)
 * and before anyone knows whether it will have a network at all; microvm's virtio-mmio has no
 * hotplug, and the template every clone restores must have the same devices. With nobody
 * connected to its socket QEMU drops the guest's frames: no policy means no network at all.
 *
 * stderr: "ok\n" once both ends are open; "error <what>: <why>\n" and exit 2 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_FRAME 65536

static void die(const char *what) {
  dprintf(2, "error %s: %s\n", what, strerror(errno));
  _exit(2);
}

static int writeall(int fd, const uint8_t *b, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, b, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    b += w;
    n -= (size_t)w;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    dprintf(2, "error usage: netrelay <tap> <socket>\n");
    return 2;
  }
  // Ends with the node, however the node ends.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  signal(SIGPIPE, SIG_IGN);
  int tun = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (tun < 0) die("open /dev/net/tun");
  struct ifreq ifr = {0};
  ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
  strncpy(ifr.ifr_name, argv[1], IFNAMSIZ - 1);
  if (ioctl(tun, TUNSETIFF, &ifr) != 0) die("attach tap");
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) die("socket");
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  if (strlen(argv[2]) >= sizeof addr.sun_path) {
    errno = ENAMETOOLONG;
    die("socket path");
  }
  strcpy(addr.sun_path, argv[2]);
  if (connect(s, (struct sockaddr *)&addr, sizeof addr) != 0) die("connect");
  dprintf(2, "ok\n");

  static uint8_t out[4 + MAX_FRAME];
  static uint8_t in[2 * (4 + MAX_FRAME)];
  size_t have = 0;
  struct pollfd pf[2] = {{tun, POLLIN, 0}, {s, POLLIN, 0}};
  for (;;) {
    if (poll(pf, 2, -1) < 0) {
      if (errno == EINTR) continue;
      die("poll");
    }
    if (pf[0].revents & (POLLERR | POLLHUP | POLLNVAL)) return 0;
    if (pf[0].revents & POLLIN) {
      ssize_t n = read(tun, out + 4, MAX_FRAME);
      if (n < 0 && errno != EAGAIN && errno != EINTR) return 0;  // the tap was deleted: the policy went
      if (n > 0) {
        out[0] = (uint8_t)(n >> 24);
        out[1] = (uint8_t)(n >> 16);
        out[2] = (uint8_t)(n >> 8);
        out[3] = (uint8_t)n;
        if (writeall(s, out, (size_t)n + 4) != 0) return 0;
      }
    }
    if (pf[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      ssize_t n = read(s, in + have, sizeof in - have);
      if (n <= 0) {
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        return 0;  // QEMU exited (hibernated, destroyed)
      }
      have += (size_t)n;
      size_t off = 0;
      while (have - off >= 4) {
        uint32_t len = ((uint32_t)in[off] << 24) | ((uint32_t)in[off + 1] << 16) | ((uint32_t)in[off + 2] << 8) | in[off + 3];
        if (len > MAX_FRAME) {
          dprintf(2, "error frame: %u bytes from QEMU\n", len);
          return 2;
        }
        if (have - off < 4 + len) break;
        // A frame the tap refuses (too big for its MTU) is dropped, as a wire would.
        if (write(tun, in + off + 4, len) < 0 && errno != EINVAL && errno != EIO) return 0;
        off += 4 + len;
      }
      memmove(in, in + off, have - off);
      have -= off;
    }
  }
}
