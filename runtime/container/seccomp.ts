/**
 * The seccomp profile every sandbox process runs under, as OCI `linux.seccomp` data.
 *
 * Allow by default, deny a list: the user namespace, the dropped capabilities and no_new_privs
 * already stop most of what is listed here, so this is the second wall, aimed at the calls that
 * reach kernel code which namespaces do not isolate (bpf, perf, io_uring, keyrings, userfaultfd,
 * filesystem-level ioctls) and at the ones agents were seen to use against their own sandbox
 * (mount tricks, namespace escapes, ptrace of a target, XFS_IOC_SWAPEXT that shut a filesystem
 * down). An allow-list in the style of Docker's would be tighter but breaks the long tail of
 * programs an agent may legitimately run; a denied call fails with EPERM so programs see a plain
 * "operation not permitted" rather than dying.
 */

const EPERM = 1;
const ENOSYS = 38;

/** Denied outright. */
export const DENIED_SYSCALLS = [
  // Filesystem topology: an agent must not remount, pivot or shuffle its view of the tree.
  'mount',
  'umount',
  'umount2',
  'pivot_root',
  'move_mount',
  'open_tree',
  'fsopen',
  'fsconfig',
  'fsmount',
  'fspick',
  'mount_setattr',
  // Namespaces: joining is never needed; creating one is filtered by flag below.
  'setns',
  // Kernel code loading and kernel-wide state.
  'bpf',
  'perf_event_open',
  'kexec_load',
  'kexec_file_load',
  'init_module',
  'finit_module',
  'delete_module',
  'create_module',
  'query_module',
  'get_kernel_syms',
  'reboot',
  'swapon',
  'swapoff',
  'acct',
  'quotactl',
  'quotactl_fd',
  'syslog',
  'nfsservctl',
  'uselib',
  'ustat',
  'sysfs',
  '_sysctl',
  'lookup_dcookie',
  'vm86',
  'vm86old',
  'iopl',
  'ioperm',
  'settimeofday',
  'clock_settime',
  'clock_adjtime',
  'adjtimex',
  // Keyrings are not namespaced.
  'keyctl',
  'add_key',
  'request_key',
  // Classic kernel-exploit primitives.
  'userfaultfd',
  'io_uring_setup',
  'io_uring_enter',
  'io_uring_register',
  // Reaching into other processes (the "exploit against its own target" case), and file handles
  // that bypass path checks (the "shocker" escape).
  'ptrace',
  'process_vm_readv',
  'process_vm_writev',
  'kcmp',
  'open_by_handle_at',
  'name_to_handle_at',
  'fanotify_init',
  'vhangup',
];

// Namespace flags of clone(2) and unshare(2).
const CLONE_NEWNS = 0x00020000;
const CLONE_NEWCGROUP = 0x02000000;
const CLONE_NEWUTS = 0x04000000;
const CLONE_NEWIPC = 0x08000000;
const CLONE_NEWUSER = 0x10000000;
const CLONE_NEWPID = 0x20000000;
const CLONE_NEWNET = 0x40000000;
const CLONE_NEWTIME = 0x00000080;
export const NAMESPACE_FLAGS = [CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWTIME];

/** An ioctl request number's type and number bytes, which name it whatever its size and direction bits. */
const ioc = (type: string | number, nr: number) => ((typeof type === 'string' ? type.charCodeAt(0) : type) << 8) | nr;

/**
 * ioctls that rearrange or stop a filesystem under everyone who shares it. Matched on the low 16
 * bits only (the kernel reads `cmd` as 32 bits; seccomp sees 64), so neither a different size
 * field nor garbage in the upper bits slips past.
 */
export const DENIED_IOCTLS: Record<string, number> = {
  XFS_IOC_SWAPEXT: ioc('X', 109),
  XFS_IOC_EXCHANGE_RANGE: ioc('X', 129),
  'FS_IOC_SHUTDOWN (XFS_IOC_GOINGDOWN, EXT4_IOC_SHUTDOWN)': ioc('X', 125),
  'FIFREEZE (XFS_IOC_FREEZE)': ioc('X', 119),
  'FITHAW (XFS_IOC_THAW)': ioc('X', 120),
  EXT4_IOC_MOVE_EXT: ioc('f', 15),
  EXT4_IOC_SWAP_BOOT: ioc('f', 17),
  // Pushes input into a terminal another process reads.
  TIOCSTI: 0x5412,
  TIOCLINUX: 0x541c,
};

const AF_UNIX = 1;
const AF_INET = 2;
const AF_INET6 = 10;
const AF_NETLINK = 16;
const NETLINK_ROUTE = 0;
/** One past the highest address family of Linux 6.x (AF_MCTP is 45). */
const AF_MAX = 46;
/** The socket families a sandbox may open: local, IPv4, IPv6, and netlink for routing only. */
export const ALLOWED_SOCKET_FAMILIES = [AF_UNIX, AF_INET, AF_INET6, AF_NETLINK] as const;

interface SyscallRule {
  names: string[];
  action: string;
  errnoRet?: number;
  args?: Array<{ index: number; value: number; valueTwo?: number; op: string }>;
}

function architectures(arch: string): string[] {
  switch (arch) {
    case 'x64':
      return ['SCMP_ARCH_X86_64', 'SCMP_ARCH_X86', 'SCMP_ARCH_X32'];
    case 'arm64':
      return ['SCMP_ARCH_AARCH64', 'SCMP_ARCH_ARM'];
    default:
      return [];
  }
}

export function seccompProfile(arch: string = process.arch): Record<string, unknown> {
  const deny = (names: string[], args?: SyscallRule['args']): SyscallRule => ({ names, action: 'SCMP_ACT_ERRNO', errnoRet: EPERM, ...(args ? { args } : {}) });
  const rules: SyscallRule[] = [deny(DENIED_SYSCALLS)];
  // Any one namespace flag is enough to refuse; a rule's args are ANDed, so one rule per flag.
  // clone's flags are its first argument on every architecture we list.
  for (const flag of NAMESPACE_FLAGS) {
    rules.push(deny(['unshare', 'clone'], [{ index: 0, value: flag, valueTwo: flag, op: 'SCMP_CMP_MASKED_EQ' }]));
  }
  // clone3 passes its flags in memory, out of seccomp's sight: ENOSYS makes libc fall back to clone.
  rules.push({ names: ['clone3'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS });
  for (const cmd of Object.values(DENIED_IOCTLS)) {
    rules.push(deny(['ioctl'], [{ index: 1, value: 0xffff, valueTwo: cmd, op: 'SCMP_CMP_MASKED_EQ' }]));
  }
  // Socket families: only those a sandbox needs. Everything else reaches kernel code no namespace
  // isolates (AF_VSOCK leaves a VM through virtio to its hypervisor; AF_ALG is the kernel's crypto;
  // packet and raw sockets are also refused by the missing CAP_NET_RAW, denied here as well so
  // that a capability mistake cannot open one). A rule's args are ANDed and rules ORed: one rule
  // per family refused, and one for all families past the last the kernel knows today.
  for (let family = 0; family < AF_MAX; family++) {
    if (!(ALLOWED_SOCKET_FAMILIES as readonly number[]).includes(family)) rules.push(deny(['socket', 'socketpair'], [{ index: 0, value: family, op: 'SCMP_CMP_EQ' }]));
  }
  rules.push(deny(['socket', 'socketpair'], [{ index: 0, value: AF_MAX, op: 'SCMP_CMP_GE' }]));
  // Netlink only for routing (ip addr, ip route): audit, uevents, xfrm, nftables and the others talk
  // to host-wide kernel state.
  rules.push(deny(['socket'], [{ index: 0, value: AF_NETLINK, op: 'SCMP_CMP_EQ' }, { index: 2, value: NETLINK_ROUTE, op: 'SCMP_CMP_NE' }]));
  // On 32-bit x86 the socket calls can also go through socketcall(2), whose arguments are in
  // memory where seccomp cannot see them: refused (ENOSYS, so libc uses socket(2) instead).
  rules.push({ names: ['socketcall'], action: 'SCMP_ACT_ERRNO', errnoRet: ENOSYS });
  return { defaultAction: 'SCMP_ACT_ALLOW', architectures: architectures(arch), syscalls: rules };
}
