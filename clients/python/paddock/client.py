"""The Paddock client over the HTTP gateway, with the standard library only (urllib, json).

    from paddock import Paddock
    pdk = Paddock()                      # $PADDOCK_URL, else http://127.0.0.1:7070
    sb = pdk.sandboxes.create(image="busybox", labels={"job": "demo"})
    print(sb.exec("echo hi").stdout)
    for ev in sb.exec_stream(["sh", "-c", "for i in 1 2 3; do echo $i; sleep 1; done"]):
        print(ev.type, ev.text)
    sb.kill()
"""

import base64
import builtins
import io
import json
import os
import tarfile
import socket
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from .errors import PaddockError, TimeoutError, UnavailableError, error_from

DEFAULT_URL = "http://127.0.0.1:7070"
#: Past an exec's own timeout, how long to wait for the gateway's answer.
REPLY_MARGIN_S = 10.0

Command = Union[str, Sequence[str]]


def _default_url() -> str:
    url = os.environ.get("PADDOCK_URL")
    if url:
        return url
    # What `npm start` prints: PADDOCK_HTTP host:port.
    hp = os.environ.get("PADDOCK_HTTP")
    return f"http://{hp}" if hp else DEFAULT_URL


@dataclass
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    verdict: str = "OK"
    duration_ms: float = 0.0
    truncated: bool = False
    timed_out: bool = False
    signal: Optional[str] = None
    replayed: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecResult":
        return cls(d["exitCode"], d.get("stdout", ""), d.get("stderr", ""), d.get("verdict", "OK"), d.get("durationMs", 0.0),
                   d.get("truncated", False), d.get("timedOut", False), d.get("signal"), d.get("replayed", False))


@dataclass
class ExecEvent:
    """``stdout`` / ``stderr`` with ``text``, then one ``exit`` with ``exit_code`` and ``verdict``."""

    type: str
    text: str = ""
    exit_code: Optional[int] = None
    verdict: Optional[str] = None
    duration_ms: Optional[float] = None
    signal: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict)


class _Http:
    def __init__(self, url: str, api_key: Optional[str], timeout: float) -> None:
        self.base = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def open(self, method: str, path: str, query: Optional[Dict[str, Any]] = None, body: Any = None, raw: Optional[bytes] = None,
             headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None):
        q = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.base + path + (("?" + urllib.parse.urlencode(q, doseq=True)) if q else "")
        h = {"accept": "application/json", **(headers or {})}
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
            h["content-type"] = "application/json"
        elif raw is not None:
            h["content-type"] = "application/octet-stream"
        if self.api_key:
            h["authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(url, data=data, method=method, headers=h)
        t = self.timeout if timeout is None else timeout
        try:
            return urllib.request.urlopen(req, timeout=t)
        except urllib.error.HTTPError as e:
            raise _error_of(e) from None
        except (socket.timeout, builtins.TimeoutError) as e:
            raise TimeoutError("TIMEOUT", f"{method} {path}: no answer within {t} s", True) from e
        except urllib.error.URLError as e:
            if isinstance(e.reason, socket.timeout):
                raise TimeoutError("TIMEOUT", f"{method} {path}: no answer within {t} s", True) from e
            raise UnavailableError("UNAVAILABLE", f"cannot reach the Paddock gateway at {self.base}: {e.reason}", True) from e

    def json(self, method: str, path: str, **kw: Any) -> Any:
        with self.open(method, path, **kw) as res:
            text = res.read()
        return json.loads(text) if text else None


def _error_of(e: "urllib.error.HTTPError") -> PaddockError:
    text = e.read()
    try:
        body = json.loads(text)
    except ValueError:
        body = {"code": "INTERNAL", "message": text.decode(errors="replace") or str(e), "retryable": e.code >= 500}
    ra = e.headers.get("retry-after")
    return error_from(body, e.code, float(ra) if ra else None)


def _sse(res) -> Iterator[Dict[str, Any]]:
    """The events of a text/event-stream response: ``{"event": name, "data": decoded JSON}``."""
    name, data = "message", []
    for line in res:
        line = line.decode("utf-8").rstrip("\r\n")
        if line == "":
            if data:
                yield {"event": name, "data": json.loads("\n".join(data))}
            name, data = "message", []
        elif line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip(" "))


def _exec_body(cmd: Command, cwd, env, stdin, timeout_ms, max_output_bytes, rollout_id, step) -> Dict[str, Any]:
    b: Dict[str, Any] = {"cmd": cmd if isinstance(cmd, str) else list(cmd)}
    if cwd is not None:
        b["cwd"] = cwd
    if env is not None:
        b["env"] = env
    if isinstance(stdin, (bytes, bytearray)):
        b["stdinBase64"] = base64.b64encode(stdin).decode()
    elif stdin is not None:
        b["stdin"] = stdin
    if timeout_ms is not None:
        b["timeoutMs"] = timeout_ms
    if max_output_bytes is not None:
        b["maxOutputBytes"] = max_output_bytes
    if rollout_id is not None:
        b["rolloutId"] = rollout_id
        b["step"] = step
    return b


def _quote(s: str) -> str:
    return urllib.parse.quote(s, safe="")


class Sandbox:
    """A handle on one sandbox. ``info`` is its last known record; ``refresh()`` fetches a new one."""

    def __init__(self, http: _Http, info: Dict[str, Any]) -> None:
        self._http = http
        self.info = info
        self.files = SandboxFiles(self)
        self.processes = SandboxProcesses(self)

    @property
    def id(self) -> str:
        return self.info["id"]

    @property
    def state(self) -> str:
        return self.info["state"]

    def __repr__(self) -> str:
        return f"<Sandbox {self.id} {self.state}>"

    def _path(self, tail: str = "") -> str:
        return f"/v1/sandboxes/{_quote(self.id)}{tail}"

    def refresh(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        self.info = self._http.json("GET", self._path(), timeout=timeout)
        return self.info

    def exec(self, cmd: Command, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None, stdin: Union[str, bytes, None] = None,
             timeout_ms: Optional[int] = None, max_output_bytes: Optional[int] = None, rollout_id: Optional[str] = None,
             step: Optional[int] = None, timeout: Optional[float] = None) -> ExecResult:
        """Runs a command (argv, or a string for /bin/sh -c) to completion."""
        body = _exec_body(cmd, cwd, env, stdin, timeout_ms, max_output_bytes, rollout_id, step)
        t = timeout if timeout is not None else (timeout_ms or 60_000) / 1000 + REPLY_MARGIN_S
        return ExecResult.from_json(self._http.json("POST", self._path("/exec"), body=body, timeout=t))

    def exec_stream(self, cmd: Command, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None, stdin: Union[str, bytes, None] = None,
                    timeout_ms: Optional[int] = None, max_output_bytes: Optional[int] = None, timeout: Optional[float] = None) -> Iterator[ExecEvent]:
        """Yields output as it comes, then one ``exit`` event. Leaving the loop early kills the command."""
        body = _exec_body(cmd, cwd, env, stdin, timeout_ms, max_output_bytes, None, None)
        t = timeout if timeout is not None else (timeout_ms or 60_000) / 1000 + REPLY_MARGIN_S
        res = self._http.open("POST", self._path("/exec"), body=body, headers={"accept": "text/event-stream"}, timeout=t)
        try:
            for ev in _sse(res):
                name, d = ev["event"], ev["data"]
                if name in ("stdout", "stderr"):
                    yield ExecEvent(name, text=d.get("text", ""), raw=d)
                elif name == "exit":
                    yield ExecEvent("exit", exit_code=d["exitCode"], verdict=d.get("verdict"), duration_ms=d.get("durationMs"), signal=d.get("signal"), raw=d)
                    return
                elif name == "error":
                    raise error_from(d)
        except socket.timeout as e:
            raise TimeoutError("TIMEOUT", f"no output from sandbox {self.id} within {t} s", True) from e
        finally:
            # Closing the connection is the cancel: the gateway kills the command.
            res.close()

    def _verb(self, verb: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        self.info = self._http.json("POST", self._path(f"/{verb}"), timeout=timeout)
        return self.info

    def pause(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb("pause", timeout)

    def resume(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb("resume", timeout)

    def hibernate(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb("hibernate", timeout)

    def restore(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb("restore", timeout)

    def stats(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._http.json("GET", self._path("/stats"), timeout=timeout)

    def set_network(self, policy: Dict[str, Any], timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._http.json("POST", self._path("/network"), body={"policy": policy}, timeout=timeout)["policy"]

    def kill(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        self.info = self._http.json("DELETE", self._path(), timeout=timeout)
        return self.info

    def snapshot(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """A VM sandbox's whole state saved on its node (it runs on): a SnapshotInfo; ``sandboxes.create(from_snapshot=s["id"])`` starts from it."""
        return self._http.json("POST", self._path("/snapshot"), timeout=timeout)

    def fork(self, count: int = 1, labels: Optional[Dict[str, str]] = None, group: Optional[str] = None, ttl_sec: Optional[float] = None,
             timeout: Optional[float] = None) -> List["Sandbox"]:
        """``count`` copies of this VM sandbox as it is now, on its node; all or none (NoCapacityError)."""
        body = {k: v for k, v in {"count": count, "labels": labels, "group": group, "ttlSec": ttl_sec}.items() if v is not None}
        r = self._http.json("POST", self._path("/fork"), body=body, timeout=timeout if timeout is not None else 60.0 + 5.0 * count)
        return [Sandbox(self._http, info) for info in r["sandboxes"]]

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()


class Process:
    """A background process (or terminal) of a sandbox. ``info`` is its last known record."""

    def __init__(self, sb: Sandbox, info: Dict[str, Any]) -> None:
        self._sb = sb
        self.info = info

    @property
    def id(self) -> str:
        return self.info["id"]

    @property
    def pid(self) -> Optional[int]:
        return self.info.get("pid")

    def __repr__(self) -> str:
        return f"<Process {self.id} {self.info.get('state')}>"

    def _path(self, tail: str = "") -> str:
        return self._sb._path(f"/processes/{_quote(self.id)}{tail}")

    def refresh(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        self.info = self._sb._http.json("GET", self._path(), timeout=timeout)
        return self.info

    def wait(self) -> Dict[str, Any]:
        """Its record once it has exited (``exitCode``, ``verdict``, ``signal``…), however long that takes."""
        while True:
            self.info = self._sb._http.json("POST", self._path("/wait"), timeout=40.0)
            if self.info["state"] == "exited":
                return self.info

    def kill(self, signal: str = "SIGKILL", timeout: Optional[float] = None) -> Dict[str, Any]:
        self.info = self._sb._http.json("POST", self._path("/kill"), query={"signal": signal}, timeout=timeout)
        return self.info

    def write(self, data: Union[str, bytes], eof: bool = False, timeout: Optional[float] = None) -> None:
        """Bytes for its stdin (a terminal: keys typed); ``eof`` closes it afterwards."""
        body: Dict[str, Any] = {"text": data} if isinstance(data, str) else {"data": base64.b64encode(data).decode()}
        if eof:
            body["eof"] = True
        self._sb._http.json("POST", self._path("/input"), body=body, timeout=timeout)

    def close_stdin(self, timeout: Optional[float] = None) -> None:
        self._sb._http.json("POST", self._path("/input"), body={"eof": True}, timeout=timeout)

    def resize(self, cols: int, rows: int, timeout: Optional[float] = None) -> None:
        self._sb._http.json("POST", self._path("/resize"), body={"cols": cols, "rows": rows}, timeout=timeout)

    def output(self, stdout: int = 0, stderr: int = 0, follow: bool = True, hold: bool = False,
               timeout: Optional[float] = None) -> Iterator[Dict[str, Any]]:
        """Its output from byte offsets: ``{"event": "stdout"|"stderr", "text", "offset"}``, ``gap``
        (bytes dropped before they were asked for), then ``exit`` (or ``end`` with follow=False).
        ``hold=True``: every byte at this loop's pace (the process waits on its pipe while the loop is
        a window behind, instead of ``gap`` events); a loop that takes nothing for 60 s is let go
        with CANCELLED."""
        q = {"stdout": stdout, "stderr": stderr, "follow": None if follow else "0", "hold": "1" if hold else None}
        res = self._sb._http.open("GET", self._path("/output"), query=q, headers={"accept": "text/event-stream"}, timeout=timeout or 3600.0)
        try:
            for ev in _sse(res):
                if ev["event"] == "error":
                    raise error_from(ev["data"])
                yield {"event": ev["event"], **ev["data"]}
                if ev["event"] in ("exit", "end"):
                    return
        finally:
            res.close()


class SandboxProcesses:
    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def start(self, cmd: Command, cwd: Optional[str] = None, env: Optional[Dict[str, str]] = None, timeout_ms: Optional[int] = None,
              buffer_bytes: Optional[int] = None, tag: Optional[str] = None, pty: Optional[Dict[str, int]] = None,
              timeout: Optional[float] = None) -> Process:
        """Starts a command (argv, or a string for /bin/sh -c) in the background; returns at once."""
        body: Dict[str, Any] = {"cmd": cmd if isinstance(cmd, str) else list(cmd)}
        for k, v in (("cwd", cwd), ("env", env), ("timeoutMs", timeout_ms), ("bufferBytes", buffer_bytes), ("tag", tag), ("pty", pty)):
            if v is not None:
                body[k] = v
        return Process(self._sb, self._sb._http.json("POST", self._sb._path("/processes"), body=body, timeout=timeout))

    def list(self, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        return self._sb._http.json("GET", self._sb._path("/processes"), timeout=timeout)["processes"]

    def get(self, id: str, timeout: Optional[float] = None) -> Process:
        return Process(self._sb, self._sb._http.json("GET", self._sb._path(f"/processes/{_quote(id)}"), timeout=timeout))


class SandboxFiles:
    def __init__(self, sb: Sandbox) -> None:
        self._sb = sb

    def read(self, path: str, offset: int = 0, length: Optional[int] = None, timeout: Optional[float] = None) -> bytes:
        """The file's bytes; with ``offset``/``length``, only that part (an HTTP range)."""
        headers = {}
        if offset or length is not None:
            headers["range"] = f"bytes={offset}-{'' if length is None else offset + length - 1}"
        with self._sb._http.open("GET", self._sb._path("/files"), query={"path": path}, headers=headers, timeout=timeout) as res:
            return res.read()

    def read_text(self, path: str, timeout: Optional[float] = None) -> str:
        return self.read(path, timeout=timeout).decode()

    def write(self, path: str, data: Union[str, bytes], mode: Optional[int] = None, timeout: Optional[float] = None) -> int:
        """Replaces (or creates) the file; parent directories are made. Returns the bytes written."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        r = self._sb._http.json("PUT", self._sb._path("/files"), query={"path": path, "mode": mode}, raw=raw, timeout=timeout)
        return r["size"]

    def upload(self, src: Union[str, bytes], dest: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Unpacks ``src`` into the existing directory ``dest``: a local directory (packed here
        with tarfile, its contents at ``dest``) or the bytes of a tar archive. Returns
        ``{path, entries, bytes}``."""
        if isinstance(src, str):
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for name in sorted(os.listdir(src)):
                    tar.add(os.path.join(src, name), arcname=name)
            raw = buf.getvalue()
        else:
            raw = bytes(src)
        return self._sb._http.json("PUT", self._sb._path("/files/tar"), query={"path": dest}, raw=raw, timeout=timeout)

    def download(self, path: str, dest: Optional[str] = None, timeout: Optional[float] = None) -> bytes:
        """A tar archive of ``path`` (symlinks stay symlinks); with ``dest``, also unpacked into
        that local directory (links and names that would leave it are refused by tarfile's data filter
        where the Python has one)."""
        with self._sb._http.open("GET", self._sb._path("/files/tar"), query={"path": path}, timeout=timeout) as res:
            raw = res.read()
        if dest is not None:
            os.makedirs(dest, exist_ok=True)
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(dest, filter="data")
                else:
                    for m in tar.getmembers():
                        if m.name.startswith("/") or ".." in m.name.split("/") or m.islnk() or m.isdev():
                            raise PaddockError("FORBIDDEN", f"archive entry {m.name} would leave {dest}")
                    tar.extractall(dest)
        return raw

    def list(self, path: str, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        return self._sb._http.json("GET", self._sb._path("/files/list"), query={"path": path}, timeout=timeout)["entries"]

    def remove(self, path: str, recursive: bool = False, timeout: Optional[float] = None) -> None:
        self._sb._http.json("DELETE", self._sb._path("/files"), query={"path": path, "recursive": "1" if recursive else None}, timeout=timeout)


_SPEC_NAMES = {"memory_mib": "memoryMiB", "pids_limit": "pidsLimit", "disk_mib": "diskMiB", "ttl_sec": "ttlSec", "idle_timeout_sec": "idleTimeoutSec",
               "idle_action": "idleAction", "auto_resume": "autoResume", "from_snapshot": "fromSnapshot"}


def _spec(kw: Dict[str, Any]) -> Dict[str, Any]:
    return {_SPEC_NAMES.get(k, k): v for k, v in kw.items() if v is not None}


class Sandboxes:
    def __init__(self, http: _Http) -> None:
        self._http = http

    def create(self, timeout: Optional[float] = 130.0, **spec: Any) -> Sandbox:
        """Creates a sandbox and returns once it runs. Spec fields as keywords: image, cpu, memory_mib, labels, group, ttl_sec, env, …"""
        return Sandbox(self._http, self._http.json("POST", "/v1/sandboxes", body=_spec(spec), timeout=timeout))

    def get(self, id: str, timeout: Optional[float] = None) -> Sandbox:
        return Sandbox(self._http, self._http.json("GET", f"/v1/sandboxes/{_quote(id)}", timeout=timeout))

    def list(self, labels: Optional[Dict[str, str]] = None, group: Optional[str] = None, state: Optional[Sequence[str]] = None,
             node: Optional[str] = None, all: bool = False, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        q = {"label": [f"{k}={v}" for k, v in (labels or {}).items()] or None, "group": group, "state": ",".join(state) if state else None,
             "node": node, "all": "1" if all else None}
        return self._http.json("GET", "/v1/sandboxes", query=q, timeout=timeout)["sandboxes"]


class Groups:
    """``pdk.groups.pause("job-7")``: one call, every sandbox of the training job."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    def _verb(self, group: str, verb: str, timeout: Optional[float]) -> Dict[str, Any]:
        return self._http.json("POST", f"/v1/groups/{_quote(group)}/{verb}", timeout=610.0 if timeout is None else timeout)

    def pause(self, group: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb(group, "pause", timeout)

    def resume(self, group: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb(group, "resume", timeout)

    def hibernate(self, group: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb(group, "hibernate", timeout)

    def restore(self, group: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb(group, "restore", timeout)

    def kill(self, group: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._verb(group, "kill", timeout)


class Rollout:
    """A sandbox driven through numbered steps recorded in the command log: a restarted trainer replays them."""

    def __init__(self, http: _Http, view: Dict[str, Any]) -> None:
        self.record = view["rollout"]
        self.rollout_id: str = self.record["rolloutId"]
        self.sandbox = Sandbox(http, view["sandbox"])
        #: Highest step recorded when the rollout was started or attached (-1: none).
        self.last_step: int = view["lastStep"]
        self.next_step = 0

    def exec(self, cmd: Command, step: Optional[int] = None, **kw: Any) -> ExecResult:
        """Runs ``cmd`` as the next step (or ``step``); a recorded step returns its result with ``replayed`` and runs nothing."""
        s = self.next_step if step is None else step
        self.next_step = s + 1
        return self.sandbox.exec(cmd, rollout_id=self.rollout_id, step=s, **kw)


class Rollouts:
    def __init__(self, http: _Http) -> None:
        self._http = http

    def start(self, sandbox: Optional[Dict[str, Any]] = None, rollout_id: Optional[str] = None, retention_sec: Optional[float] = None,
              timeout: Optional[float] = 130.0) -> Rollout:
        body: Dict[str, Any] = {"sandbox": _spec(sandbox or {})}
        if rollout_id is not None:
            body["rolloutId"] = rollout_id
        if retention_sec is not None:
            body["retentionSec"] = retention_sec
        return Rollout(self._http, self._http.json("POST", "/v1/rollouts", body=body, timeout=timeout))

    def attach(self, rollout_id: str, timeout: Optional[float] = None) -> Rollout:
        return Rollout(self._http, self._http.json("POST", f"/v1/rollouts/{_quote(rollout_id)}/attach", timeout=timeout))

    def get(self, rollout_id: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._http.json("GET", f"/v1/rollouts/{_quote(rollout_id)}", timeout=timeout)

    def export(self, rollout_id: str, timeout: Optional[float] = None) -> Iterator[Dict[str, Any]]:
        """The trajectory, one record per step."""
        with self._http.open("GET", f"/v1/rollouts/{_quote(rollout_id)}/export", timeout=timeout) as res:
            for line in res:
                if line.strip():
                    yield json.loads(line)

    def delete(self, rollout_id: str, kill: bool = False, timeout: Optional[float] = None) -> None:
        self._http.json("DELETE", f"/v1/rollouts/{_quote(rollout_id)}", query={"kill": "1" if kill else None}, timeout=timeout)


class Fn:
    def __init__(self, http: _Http) -> None:
        self._http = http

    def invoke(self, language: Optional[str] = None, code: Optional[str] = None, stdin: Optional[str] = None, tests: Optional[List[Dict[str, Any]]] = None,
               limits: Optional[Dict[str, Any]] = None, retry_busy: bool = False, timeout: Optional[float] = 120.0, **extra: Any) -> Dict[str, Any]:
        """One-shot invocation: ``pdk.fn.invoke(language="python", code="print(input())", stdin="hi")`` → a verdict."""
        body = {k: v for k, v in {"language": language, "code": code, "stdin": stdin, "tests": tests, "limits": limits, **extra}.items() if v is not None}
        return self._http.json("POST", "/v1/fn/invoke", query={"retryBusy": "1" if retry_busy else None}, body=body, timeout=timeout)


class Nodes:
    def __init__(self, http: _Http) -> None:
        self._http = http

    def list(self, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        return self._http.json("GET", "/v1/nodes", timeout=timeout)["nodes"]

    def info(self, node: str, timeout: Optional[float] = None) -> Dict[str, Any]:
        return self._http.json("GET", f"/v1/nodes/{_quote(node)}", timeout=timeout)


class Snapshots:
    """Snapshots of VM sandboxes (``sb.snapshot()``), on every node."""

    def __init__(self, http: _Http) -> None:
        self._http = http

    def list(self, node: Optional[str] = None, from_: Optional[str] = None, timeout: Optional[float] = None) -> List[Dict[str, Any]]:
        return self._http.json("GET", "/v1/snapshots", query={"node": node, "from": from_}, timeout=timeout)["snapshots"]

    def delete(self, id: str, timeout: Optional[float] = None) -> bool:
        """Removes the snapshot's files from its node; False when there was none (deleting twice is harmless)."""
        return self._http.json("DELETE", f"/v1/snapshots/{_quote(id)}", timeout=timeout)["deleted"]


class Paddock:
    """``Paddock(url=None, api_key=None, timeout=60)``: url defaults to $PADDOCK_URL (or http://$PADDOCK_HTTP), key to $PADDOCK_API_KEY."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, timeout: float = 60.0) -> None:
        self._http = _Http(url or _default_url(), api_key if api_key is not None else os.environ.get("PADDOCK_API_KEY"), timeout)
        self.sandboxes = Sandboxes(self._http)
        self.groups = Groups(self._http)
        self.rollouts = Rollouts(self._http)
        self.fn = Fn(self._http)
        self.nodes = Nodes(self._http)
        self.snapshots = Snapshots(self._http)

    @property
    def url(self) -> str:
        return self._http.base
