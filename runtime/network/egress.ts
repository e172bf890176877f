/**
 * Per-sandbox egress. A sandbox starts with no way out: a container's network namespace holds only
 * `lo`, a VM's one NIC leads nowhere. When a policy opens anything, the node gives it a link
 * (`pdk<N>` on the host, a /30 from 100.72.0.0/16 — shared address space, never routed on the
 * internet): a veth pair whose other end is the container's `eth0`, or a tap that the VM backend
 * connects to its VM's NIC (runtime/microvm/netrelay.c). The policy is enforced with nftables in a
 * table of the backend's own (`inet pdk_<node>[_<backend>]`), so the host's other rules are not touched:
 *
 *   forward: iifname → the sandbox's chain: allowed CIDR:ports, then addresses its DNS filter
 *            handed out (a set with per-element timeouts), then reject. Other sandboxes, the
 *            node's own addresses and metadata-style addresses are not special cases: they are
 *            simply not allowed unless a policy names them.
 *   input:   from a sandbox to the node itself only DNS to its gateway address; the node's ports and
 *            NATS are never reachable.
 *   postrouting: masquerade what leaves through the node's uplink.
 *
 * A policy can change while the sandbox runs (set-up with package access, rollout without): the
 * chain is rebuilt and the DNS-derived set emptied in one nft transaction; established connections
 * to destinations no longer allowed stop at their next packet.
 *
 * Link indexes are claimed host-wide (one file each under /run/paddock-net), so several nodes on
 * one host never pick the same interface name or /30; a node's claims name it, and recover()
 * removes whatever a crashed run of the node left.
 */
import { existsSync } from 'node:fs';
import { mkdir, open, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { domainAllowed, formatIPv4, type NetworkPolicy, type ParsedPolicy, parsePolicy } from '../../protocol/index.ts';
import { run } from '../proc.ts';
import { DnsFilter, MAX_OPEN_SEC, MIN_OPEN_SEC } from './dns.ts';

const CLAIMS = '/run/paddock-net';
/**
 * nftables' binary by path: under npm, PATH starts with node_modules/.bin, where @vercel/nft (a
 * dependency of the toolchain) installs an unrelated `nft` that accepts anything and does nothing.
 */
export const NFT = ['/usr/sbin/nft', '/sbin/nft', '/usr/bin/nft'].find((p) => existsSync(p)) ?? 'nft';
const POOL_BASE = (100 << 24) | (72 << 16);
const POOL_LINKS = 16384;
const STALE_CLAIM_MS = 10 * 60_000;
export const LINK_PREFIX = 'pdk';

/**
 * Where the sandbox's end of its link goes: into a container's network namespace (its init's
 * pid), or, for a VM, a tap on the host that `attach` connects to the VM and whose guest end it
 * configures with `addr`/30 and a default route through `gw`.
 */
export type LinkTarget = { pid: number } | { attach: (link: { ifname: string; addr: string; gw: string }) => Promise<void> };

interface Link {
  index: number;
  ifname: string;
  gw: string;
  addr: string;
  dns: DnsFilter;
  policy: ParsedPolicy;
}

export function linkAddresses(index: number): { gw: string; addr: string } {
  const net = (POOL_BASE + index * 4) >>> 0;
  return { gw: formatIPv4(net + 1), addr: formatIPv4(net + 2) };
}

/** The nft statements of one sandbox's chains for `policy`. */
export function policyRules(table: string, index: number, gw: string, p: ParsedPolicy): string[] {
  const fwd = `sbo_${index}`;
  const inp = `sbi_${index}`;
  const lines = [`flush chain inet ${table} ${fwd}`, `flush chain inet ${table} ${inp}`, `flush set inet ${table} sbd_${index}`];
  for (const a of p.allow) {
    const ports = a.portLo === 0 && a.portHi === 65535 ? '' : ` th dport ${a.portLo === a.portHi ? a.portLo : `${a.portLo}-${a.portHi}`}`;
    lines.push(`add rule inet ${table} ${fwd} ip daddr ${formatIPv4(a.net)}/${a.prefix} meta l4proto { tcp, udp }${ports} accept`);
  }
  lines.push(`add rule inet ${table} ${fwd} meta l4proto { tcp, udp } ip daddr . th dport @sbd_${index} accept`);
  lines.push(`add rule inet ${table} ${fwd} reject with icmpx admin-prohibited`);
  lines.push(`add rule inet ${table} ${inp} ip daddr ${gw} meta l4proto { tcp, udp } th dport 53 accept`);
  lines.push(`add rule inet ${table} ${inp} reject with icmpx admin-prohibited`);
  return lines;
}

export class Egress {
  readonly table: string;
  private readonly links = new Map<string, Link>();
  private tableReady?: Promise<void>;

  constructor(private readonly nodeId: string) {
    this.table = `pdk_${nodeId.replace(/[^A-Za-z0-9_]/g, '_')}`.slice(0, 60);
  }

  private nft(lines: string[]): Promise<unknown> {
    return run(NFT, ['-f', '-'], { input: `${lines.join('\n')}\n` });
  }

  private ensureTable(): Promise<void> {
    this.tableReady ??= (async () => {
      // The node routes for its sandboxes (as any container host does).
      await writeFile('/proc/sys/net/ipv4/ip_forward', '1\n');
      const t = this.table;
      await this.nft([
        `table inet ${t} {`,
        '  map sbout { type ifname : verdict; }',
        '  map sbin { type ifname : verdict; }',
        '  chain forward { type filter hook forward priority 0; policy accept; iifname vmap @sbout; }',
        '  chain input { type filter hook input priority 0; policy accept; iifname vmap @sbin; }',
        `  chain post { type nat hook postrouting priority 100; policy accept; iifname "${LINK_PREFIX}*" oifname != "${LINK_PREFIX}*" masquerade; }`,
        '}',
      ]);
    })();
    this.tableReady.catch(() => {
      this.tableReady = undefined;
    });
    return this.tableReady;
  }

  private async claim(id: string): Promise<number> {
    await mkdir(CLAIMS, { recursive: true });
    const start = Math.floor(Math.random() * POOL_LINKS);
    for (let i = 0; i < POOL_LINKS; i++) {
      const index = (start + i) % POOL_LINKS;
      try {
        const fh = await open(join(CLAIMS, String(index)), 'wx');
        await fh.writeFile(`${this.nodeId} ${id}\n`);
        await fh.close();
        return index;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
        // A claim whose link is gone for a while was left by a node that died and never came back.
        const st = await stat(join(CLAIMS, String(index))).catch(() => null);
        if (st && Date.now() - st.mtimeMs > STALE_CLAIM_MS && !existsSync(`/sys/class/net/${LINK_PREFIX}${index}`)) await rm(join(CLAIMS, String(index)), { force: true });
      }
    }
    throw new Error('no free network link on this host');
  }

  /** Whether the sandbox has a link (a policy was ever applied). */
  has(id: string): boolean {
    return this.links.has(id);
  }

  /**
   * Applies `policy` to the sandbox whose init is `pid`. The first policy that opens anything
   * creates the link; `writeResolv` points the sandbox's resolver at its DNS filter.
   */
  async set(id: string, target: LinkTarget, policy: NetworkPolicy, writeResolv: (text: string) => Promise<void>): Promise<void> {
    const parsed = parsePolicy(policy);
    let link = this.links.get(id);
    if (!link) {
      if (parsed.allow.length === 0 && parsed.domains.length === 0) return;
      link = await this.createLink(id, target, parsed);
      await writeResolv(`nameserver ${link.gw}\n`);
    }
    link.policy = parsed;
    await this.nft(policyRules(this.table, link.index, link.gw, parsed));
  }

  /** The link of a sandbox that has one: its host interface and addresses. */
  link(id: string): { ifname: string; addr: string; gw: string } | undefined {
    const l = this.links.get(id);
    return l && { ifname: l.ifname, addr: l.addr, gw: l.gw };
  }

  private async createLink(id: string, target: LinkTarget, policy: ParsedPolicy): Promise<Link> {
    await this.ensureTable();
    const index = await this.claim(id);
    const ifname = `${LINK_PREFIX}${index}`;
    const { gw, addr } = linkAddresses(index);
    const t = this.table;
    const link: Link = {
      index,
      ifname,
      gw,
      addr,
      policy,
      dns: new DnsFilter({
        address: gw,
        allowed: (name) => domainAllowed(link.policy, name),
        onAnswer: (addrs) => this.open(link, addrs),
      }),
    };
    this.links.set(id, link);
    try {
      // The chains first, rejecting all: the forward hook accepts what no chain claims, so a link
      // that carried packets before its interface was in the map would forward them unfiltered.
      await this.nft([
        `add set inet ${t} sbd_${index} { type ipv4_addr . inet_service; flags timeout; }`,
        `add chain inet ${t} sbo_${index}`,
        `add chain inet ${t} sbi_${index}`,
        // Reject until the policy's rules are in: nothing leaks while they are written.
        `add rule inet ${t} sbo_${index} reject`,
        `add rule inet ${t} sbi_${index} reject`,
        `add element inet ${t} sbout { "${ifname}" : jump sbo_${index} }`,
        `add element inet ${t} sbin { "${ifname}" : jump sbi_${index} }`,
      ]);
      if ('pid' in target) await run('ip', ['link', 'add', ifname, 'type', 'veth', 'peer', 'name', `${ifname}c`, 'netns', String(target.pid)]);
      else await run('ip', ['tuntap', 'add', 'dev', ifname, 'mode', 'tap']);
      await run('ip', ['-batch', '-'], { input: `addr add ${gw}/30 dev ${ifname}\nlink set ${ifname} up\n` });
      // Bound to the gateway address, which exists only now.
      await link.dns.start();
      if ('pid' in target) {
        await run('nsenter', [`--net=/proc/${target.pid}/ns/net`, 'ip', '-batch', '-'], {
          input: `link set ${ifname}c name eth0\naddr add ${addr}/30 dev eth0\nlink set eth0 up\nroute add default via ${gw}\n`,
        });
      } else await target.attach({ ifname, addr, gw });
      return link;
    } catch (e) {
      await this.remove(id);
      throw e;
    }
  }

  /** Opens addresses the DNS filter handed out, on the policy's ports, for their TTL. */
  private async open(link: Link, addrs: Array<{ addr: string; ttl: number }>): Promise<void> {
    const elems: string[] = [];
    for (const { addr, ttl } of addrs) {
      const sec = Math.min(MAX_OPEN_SEC, Math.max(MIN_OPEN_SEC, ttl));
      for (const port of link.policy.ports) elems.push(`${addr} . ${port} timeout ${sec}s`);
    }
    if (elems.length > 0) await this.nft([`add element inet ${this.table} sbd_${link.index} { ${elems.join(', ')} }`]);
  }

  /** Removes the sandbox's link, rules, DNS filter and claim. Idempotent. */
  async remove(id: string): Promise<void> {
    const link = this.links.get(id);
    if (!link) return;
    this.links.delete(id);
    link.dns.close();
    await this.dropIndex(link.index);
  }

  private async dropIndex(index: number): Promise<void> {
    const t = this.table;
    // One statement per transaction: a missing piece must not keep the others from going.
    for (const s of [`delete element inet ${t} sbout { "${LINK_PREFIX}${index}" }`, `delete element inet ${t} sbin { "${LINK_PREFIX}${index}" }`, `delete chain inet ${t} sbo_${index}`, `delete chain inet ${t} sbi_${index}`, `delete set inet ${t} sbd_${index}`]) {
      await run(NFT, [s], { allowFail: true });
    }
    await run('ip', ['link', 'del', `${LINK_PREFIX}${index}`], { allowFail: true });
    await rm(join(CLAIMS, String(index)), { force: true });
  }

  /** Everything a previous run of this node left: its links, claims and table. */
  async recover(): Promise<void> {
    for (const name of await readdir(CLAIMS).catch(() => [] as string[])) {
      const owner = (await readFile(join(CLAIMS, name), 'utf8').catch(() => '')).split(' ')[0];
      if (owner === this.nodeId && /^\d+$/.test(name)) await this.dropIndex(Number(name));
    }
    await run(NFT, ['delete', 'table', 'inet', this.table], { allowFail: true });
    this.tableReady = undefined;
  }

  async close(): Promise<void> {
    for (const id of [...this.links.keys()]) await this.remove(id);
    await run(NFT, ['delete', 'table', 'inet', this.table], { allowFail: true });
    this.tableReady = undefined;
  }
}
