"""``python3 -m paddock``: a small command line over the gateway (JSON out, one line per record)."""

import argparse
import json
import sys

from . import Paddock, PaddockError


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m paddock", description="Drive Paddock sandboxes through its HTTP gateway ($PADDOCK_URL).")
    p.add_argument("--url", help="the gateway (default $PADDOCK_URL, else http://$PADDOCK_HTTP, else http://127.0.0.1:7070)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds per call (default 60)")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create", help="create a sandbox, print its record")
    c.add_argument("--image", default=None)
    c.add_argument("--label", action="append", default=[], help="key=value, repeatable")
    c.add_argument("--group")
    ls = sub.add_parser("ls", help="list sandboxes")
    ls.add_argument("--label", action="append", default=[])
    ls.add_argument("--group")
    ls.add_argument("--all", action="store_true")
    e = sub.add_parser("exec", help="run a command, stream its output, exit with its code")
    e.add_argument("id")
    e.add_argument("argv", nargs=argparse.REMAINDER)
    g = sub.add_parser("get", help="print a sandbox's record")
    g.add_argument("id")
    r = sub.add_parser("rm", help="kill a sandbox")
    r.add_argument("id")
    sub.add_parser("nodes", help="list the nodes")
    a = p.parse_args(argv)
    pdk = Paddock(url=a.url, timeout=a.timeout)
    labels = lambda kvs: dict(kv.split("=", 1) for kv in kvs)  # noqa: E731
    try:
        if a.cmd == "create":
            print(json.dumps(pdk.sandboxes.create(image=a.image, labels=labels(a.label) or None, group=a.group).info))
        elif a.cmd == "ls":
            for s in pdk.sandboxes.list(labels=labels(a.label), group=a.group, all=a.all):
                print(json.dumps(s))
        elif a.cmd == "get":
            print(json.dumps(pdk.sandboxes.get(a.id).info))
        elif a.cmd == "rm":
            print(json.dumps(pdk.sandboxes.get(a.id).kill()))
        elif a.cmd == "nodes":
            for n in pdk.nodes.list():
                print(json.dumps(n))
        elif a.cmd == "exec":
            argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
            if not argv:
                p.error("exec: give a command after the id (exec ID -- cmd args…)")
            code = 0
            for ev in pdk.sandboxes.get(a.id).exec_stream(argv):
                if ev.type == "stdout":
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
                elif ev.type == "stderr":
                    sys.stderr.write(ev.text)
                    sys.stderr.flush()
                else:
                    code = ev.exit_code if ev.exit_code is not None else 1
            return code
    except PaddockError as err:
        print(f"paddock: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
