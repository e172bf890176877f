#!/usr/bin/env python3
"""Mounts an idmapped clone of a mount: `idmap.py HOST_ID SIZE SOURCE TARGET`.

Files owned by id N under SOURCE appear owned by HOST_ID + N under TARGET, so a read-only layer
built with every file owned by root is owned by the sandboxes' unprivileged root instead.

Node has no binding for open_tree(2) / mount_setattr(2) / move_mount(2) and util-linux 2.38's
mount(8) has no X-mount.idmap, hence this helper: the syscalls through ctypes, with a throwaway
child process whose user namespace carries the mapping. Their numbers are the same on every
architecture Linux added them to after 5.0.
"""
import ctypes
import os
import signal
import sys

SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
OPEN_TREE_CLONE = 1
O_CLOEXEC = 0o2000000
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_IDMAP = 0x00100000
CLONE_NEWUSER = 0x10000000


class MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64), ("userns_fd", ctypes.c_uint64)]


libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def check(r, what):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return r


def userns_fd(host_id, size):
    """An fd of a user namespace mapping 0..size-1 to host_id..: made by a child that waits in it."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            check(libc.unshare(CLONE_NEWUSER), "unshare")
            os.write(w, b"1")
        finally:
            os.close(w)
        signal.pause()
        os._exit(0)
    os.close(w)
    try:
        if os.read(r, 1) != b"1":
            raise OSError("could not create a user namespace")
        for f in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{f}", "w") as m:
                m.write(f"0 {host_id} {size}\n")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def main():
    if len(sys.argv) != 5:
        sys.exit("usage: idmap.py HOST_ID SIZE SOURCE TARGET")
    host_id, size, source, target = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    ns = userns_fd(host_id, size)
    tree = check(libc.syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), OPEN_TREE_CLONE | O_CLOEXEC), "open_tree")
    attr = MountAttr(MOUNT_ATTR_IDMAP, 0, 0, ns)
    check(libc.syscall(SYS_MOUNT_SETATTR, tree, b"", AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)), "mount_setattr")
    check(libc.syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH), "move_mount")


if __name__ == "__main__":
    try:
        main()
    except OSError as e:
        sys.exit(f"idmap: {e}")
