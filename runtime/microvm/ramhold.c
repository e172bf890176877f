/*
 * ramhold: keeps template RAM files in the page cache, mapped, for as long as its node runs.
 *
 * Saving a clone (a hibernate, a snapshot) reads every page of its RAM, and each page the clone
 * never wrote reads through to its template's file, where the template's guest left most of it a
 * hole: a page not in the cache is allocated and zeroed on the save's path (~0.6 s of a 512 MiB
 * VM's 1.2 s here). Read once, the pages are cached, but not for long on every host: reclaim that
 * takes cold page cache which no process maps (DAMON's pageout scheme on this kind of VM: pages
 * read and left alone were gone within two minutes) takes them back. Mapped here, they count as in
 * use, and ordinary reclaim under memory pressure can still take them.
 *
 * Reads paths on stdin, one a line; maps each whole file read-only and shared with MAP_POPULATE
 * (which reads it in, holes included) and answers "ok" or "error <why>" on stdout, a line for
 * each. Exits at the end of stdin, and with its parent (PR_SET_PDEATHSIG): the mappings go with it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *hold(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return strerror(errno);
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    return strerror(e);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return "not a regular file";
  }
  if (st.st_size > 0 && mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0) == MAP_FAILED) {
    int e = errno;
    close(fd);
    return strerror(e);
  }
  close(fd);
  return NULL;
}

int main(void) {
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() == 1) return 1;
  char line[4096];
  setvbuf(stdout, NULL, _IOLBF, 0);
  while (fgets(line, sizeof line, stdin)) {
    size_t n = strlen(line);
    if (n == 0 || line[n - 1] != '\n') {
      printf("error a path of up to %zu bytes, ended by a newline\n", sizeof line - 2);
      return 2;
    }
    line[n - 1] = 0;
    const char *why = hold(line);
    if (why) printf("error %s\n", why);
    else printf("ok\n");
  }
  return 0;
}
