/*
 * vmdiff: a QEMU 7.2 migration stream on stdin, the same stream on stdout without the pages of one
 * RAM block that equal its template's.
 *
 *   vmdiff <template-ram-file> <block-id>
 *
 * A clone's RAM is its template's RAM file mapped private, so a VMM loading a state into a new
 * clone already holds every page the template has: only the pages the guest changed need writing
 * and reading again. QEMU's precopy loader takes whatever page records come and leaves other pages
 * as they are, so a stream without them loads into the same template's clone as the whole one did.
 * Measured on a 512 MiB VM with 64 MiB written: 125 MiB of state became ~70 MiB, and the loading
 * VMM no longer touches (and so no longer copies) the ~390 MiB the guest never used.
 *
 * Only what QEMU 7.2 writes for a precopy migration is understood: the header, the configuration
 * section, then the "ram" section's start (its block list), parts and end, each a run of page
 * records up to EOS; what follows the end (device state) is copied as it is. A stream this does not
 * understand before its first page is copied whole (still correct, only not smaller); one that
 * turns strange after pages were dropped ends in exit status 2 (the caller fails the save).
 *
 * The template file's holes are found with SEEK_HOLE rather than read: reading a hole makes the
 * kernel allocate and zero a page-cache page, which was half the time of a hibernate here.
 *
 * stderr: one line "kept K dropped D" (pages of the block) when done; a reason when not.
 * Exit: 0 done, 1 I/O error, 2 a stream it cannot follow.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define PAGE 4096
#define F_ZERO 0x02
#define F_MEM_SIZE 0x04
#define F_PAGE 0x08
#define F_EOS 0x10
#define F_CONTINUE 0x20
#define FLAGS 0xfffULL

enum { S_START = 0x01, S_PART = 0x02, S_END = 0x03, S_SUB = 0x05, S_CONFIG = 0x07, S_FOOTER = 0x7e };

static unsigned char in[1 << 20];
static size_t have, at;
static int in_eof;
static unsigned char out[1 << 20];
static size_t olen;

static void die(int code, const char *why) {
  fprintf(stderr, "vmdiff: %s\n", why);
  exit(code);
}

static void flush(void) {
  size_t o = 0;
  while (o < olen) {
    ssize_t w = write(1, out + o, olen - o);
    if (w < 0) {
      if (errno == EINTR) continue;
      die(1, "write failed");
    }
    o += (size_t)w;
  }
  olen = 0;
}

static void emit(const void *p, size_t n) {
  const unsigned char *b = p;
  while (n > 0) {
    size_t k = sizeof(out) - olen < n ? sizeof(out) - olen : n;
    memcpy(out + olen, b, k);
    olen += k;
    b += k;
    n -= k;
    if (olen == sizeof(out)) flush();
  }
}

/* At least n bytes buffered from `at` (n <= sizeof in), or 0 at the end of the input. */
static int need(size_t n) {
  if (have - at >= n) return 1;
  memmove(in, in + at, have - at);
  have -= at;
  at = 0;
  while (have < n && !in_eof) {
    ssize_t r = read(0, in + have, sizeof(in) - have);
    if (r < 0) {
      if (errno == EINTR) continue;
      die(1, "read failed");
    }
    if (r == 0) in_eof = 1;
    have += (size_t)r;
  }
  return have - at >= n;
}

static const unsigned char *take(size_t n) {
  if (!need(n)) die(2, "the stream ends early");
  const unsigned char *p = in + at;
  at += n;
  return p;
}

static uint64_t be(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v = (v << 8) | p[i];
  return v;
}

static void put_be64(uint64_t v) {
  unsigned char b[8];
  for (int i = 7; i >= 0; i--, v >>= 8) b[i] = (unsigned char)v;
  emit(b, 8);
}

/* Copies n bytes through and returns them. */
static const unsigned char *pass(size_t n) {
  const unsigned char *p = take(n);
  emit(p, n);
  return p;
}

/* A length byte and that many bytes, copied through, into `s` (NUL-terminated). */
static void pass_str(char s[256]) {
  size_t n = *pass(1);
  memcpy(s, pass(n), n);
  s[n] = 0;
}

/* Copies the rest of the input as it is. */
static void pass_rest(void) {
  for (;;) {
    if (have > at) emit(in + at, have - at);
    at = have = 0;
    if (in_eof) break;
    need(1);
  }
}

static void done(void) {
  flush();
  exit(0);
}

/* The template. */
static const unsigned char *tmem;
static uint64_t tsize;
static unsigned char *tdata; /* one byte per page: 1 where the file has data, 0 in a hole */
static const unsigned char zero[PAGE];

static void open_template(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) die(1, "cannot open the template's RAM file");
  struct stat st;
  if (fstat(fd, &st) < 0 || st.st_size <= 0 || st.st_size % PAGE) die(1, "the template's RAM file is not whole pages");
  tsize = (uint64_t)st.st_size;
  void *m = mmap(NULL, tsize, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) die(1, "cannot map the template's RAM file");
  tmem = m;
  tdata = calloc(tsize / PAGE, 1);
  if (!tdata) die(1, "out of memory");
  off_t pos = 0;
  for (;;) {
    off_t d = lseek(fd, pos, SEEK_DATA);
    if (d < 0) break; /* ENXIO: no data past pos */
    off_t h = lseek(fd, d, SEEK_HOLE);
    if (h < 0) h = (off_t)tsize;
    for (uint64_t p = (uint64_t)d / PAGE; p < ((uint64_t)h + PAGE - 1) / PAGE && p < tsize / PAGE; p++) tdata[p] = 1;
    pos = h;
    if ((uint64_t)pos >= tsize) break;
  }
  close(fd);
}

/* Whether the template's page at `off` holds exactly `page` (or, with page NULL, only `fill` bytes). */
static int same(uint64_t off, const unsigned char *page, int fill) {
  if (off + PAGE > tsize) return 0;
  uint64_t p = off / PAGE;
  if (!tdata[p]) {
    if (!page) return fill == 0;
    return memcmp(page, zero, PAGE) == 0;
  }
  const unsigned char *t = tmem + off;
  if (page) return memcmp(page, t, PAGE) == 0;
  for (int i = 0; i < PAGE; i++)
    if (t[i] != fill) return 0;
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 3) die(2, "usage: vmdiff <template-ram-file> <block-id>");
  const char *want = argv[2];
  open_template(argv[1]);

  /* Header: magic and version. */
  const unsigned char *h = pass(8);
  if (be(h, 4) != 0x5145564d || be(h + 4, 4) != 3) {
    pass_rest();
    done();
  }
  int ignore_shared = 0;
  uint32_t ram_section = 0;
  /* Up to the "ram" section's start: anything unknown, and the rest goes as it is. */
  for (;;) {
    if (!need(1)) done();
    int t = in[at];
    if (t == S_CONFIG) {
      pass(1);
      size_t n = (size_t)be(pass(4), 4);
      pass(n);
      while (need(1) && in[at] == S_SUB) {
        char name[256];
        pass(1);
        pass_str(name);
        pass(4);
        if (!strcmp(name, "configuration/target-page-bits")) {
          if (be(pass(4), 4) != 12) {
            pass_rest();
            done();
          }
        } else if (!strcmp(name, "configuration/capabilities")) {
          uint32_t k = (uint32_t)be(pass(4), 4);
          for (uint32_t i = 0; i < k; i++) {
            char cap[256];
            pass_str(cap);
            if (!strcmp(cap, "x-ignore-shared")) ignore_shared = 1;
            /* Postcopy changes the block list and the loader: not followed. */
            if (!strncmp(cap, "postcopy", 8) || !strcmp(cap, "xbzrle") || !strcmp(cap, "compress") || !strcmp(cap, "multifd")) {
              pass_rest();
              done();
            }
          }
        } else if (!strcmp(name, "configuration/uuid")) {
          pass(16);
        } else {
          pass_rest();
          done();
        }
      }
      continue;
    }
    if (t == S_START) {
      if (!need(1 + 4 + 1)) {
        pass_rest();
        done();
      }
      size_t n = in[at + 5];
      if (!need(6 + n + 8 + 8) || n != 3 || memcmp(in + at + 6, "ram", 3) || !(be(in + at + 6 + n + 8, 8) & F_MEM_SIZE)) {
        pass_rest();
        done();
      }
      ram_section = (uint32_t)be(in + at + 1, 4);
      break;
    }
    pass_rest();
    done();
  }

  /* The "ram" section's start: its blocks. */
  pass(1 + 4 + 1 + 3 + 4 + 4);
  uint64_t total = be(pass(8), 8) & ~FLAGS;
  char names[64][256];
  int nblocks = 0, diff_block = -1;
  while (total > 0) {
    if (nblocks == 64) die(2, "more RAM blocks than expected");
    pass_str(names[nblocks]);
    uint64_t len = be(pass(8), 8);
    if (ignore_shared) pass(8);
    if (!strcmp(names[nblocks], want) && len == tsize) diff_block = nblocks;
    if (len > total) die(2, "the RAM blocks add up to more than their total");
    total -= len;
    nblocks++;
  }
  if (diff_block < 0) {
    /* No block of the template's size by that name: nothing to compare with. */
    pass_rest();
    done();
  }

  uint64_t kept = 0, dropped = 0;
  int last_in = -1; /* the block the input's last record named */
  int last_out;     /* the block the output's last record named (-1: name the next) */
  for (int section = 0;; section++) {
    last_out = -1;
    if (section > 0) {
      const unsigned char *s = take(5);
      if ((s[0] != S_PART && s[0] != S_END) || be(s + 1, 4) != ram_section) die(2, "a section other than ram's between its parts");
      emit(s, 5);
    }
    int end = section > 0 && in[at - 5] == S_END;
    for (;;) {
      uint64_t hdr = be(take(8), 8);
      unsigned flags = (unsigned)(hdr & FLAGS);
      uint64_t off = hdr & ~FLAGS;
      if (flags & F_EOS) {
        if (flags & ~F_EOS) die(2, "an EOS with other flags");
        put_be64(hdr);
        break;
      }
      if (flags & F_MEM_SIZE) die(2, "a second block list");
      if (!(flags & F_CONTINUE)) {
        char name[256];
        size_t n = *take(1);
        memcpy(name, take(n), n);
        name[n] = 0;
        last_in = -1;
        for (int i = 0; i < nblocks; i++)
          if (!strcmp(names[i], name)) last_in = i;
        if (last_in < 0) die(2, "a page of a RAM block the stream did not list");
      } else if (last_in < 0) {
        die(2, "a continued page before any block was named");
      }
      const unsigned char *payload;
      size_t plen;
      int drop = 0;
      if ((flags & ~F_CONTINUE) == F_ZERO) {
        payload = take(1);
        plen = 1;
        drop = last_in == diff_block && same(off, NULL, payload[0]);
      } else if ((flags & ~F_CONTINUE) == F_PAGE) {
        payload = take(PAGE);
        plen = PAGE;
        drop = last_in == diff_block && same(off, payload, 0);
      } else {
        die(2, "a page record of a kind not followed (compressed, xbzrle, rdma)");
      }
      if (last_in == diff_block) {
        if (drop)
          dropped++;
        else
          kept++;
      }
      if (drop) continue;
      if (last_out == last_in) {
        put_be64(hdr | F_CONTINUE);
      } else {
        put_be64(hdr & ~(uint64_t)F_CONTINUE);
        unsigned char n = (unsigned char)strlen(names[last_in]);
        emit(&n, 1);
        emit(names[last_in], n);
        last_out = last_in;
      }
      emit(payload, plen);
    }
    if (need(5) && in[at] == S_FOOTER) pass(5);
    if (end) break;
  }
  fprintf(stderr, "kept %llu dropped %llu\n", (unsigned long long)kept, (unsigned long long)dropped);
  pass_rest();
  done();
}
