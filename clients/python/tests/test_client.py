"""Against a live Paddock: PADDOCK_URL names its gateway (test/python-client.test.ts starts both)."""

import os
import subprocess
import sys
import unittest

import paddock
from paddock import InvalidStateError, NotFoundError, Paddock

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pdk = Paddock(timeout=60)
        cls.sb = cls.pdk.sandboxes.create(labels={"job": "py"}, group="pygroup", ttl_sec=600, auto_resume=False)

    @classmethod
    def tearDownClass(cls):
        cls.sb.kill()

    def test_exec_and_stream(self):
        r = self.sb.exec("echo hi; echo oops >&2; cat; exit 3", stdin="piped\n")
        self.assertEqual((r.exit_code, r.stdout, r.stderr, r.verdict), (3, "hi\npiped\n", "oops\n", "OK"))
        self.assertEqual(self.sb.exec(["sh", "-c", "echo $X"], env={"X": "argv"}).stdout, "argv\n")
        events = list(self.sb.exec_stream("echo one; echo two >&2; exit 5"))
        self.assertEqual("".join(e.text for e in events if e.type == "stdout"), "one\n")
        self.assertEqual("".join(e.text for e in events if e.type == "stderr"), "two\n")
        self.assertEqual((events[-1].type, events[-1].exit_code), ("exit", 5))

    def test_leaving_a_stream_kills_its_command(self):
        stream = self.sb.exec_stream("echo started; exec sleep 300")
        self.assertEqual(next(stream).text, "started\n")
        stream.close()
        for _ in range(50):
            ps = self.sb.exec(["ps"]).stdout
            if "sleep 300" not in ps:
                break
            import time
            time.sleep(0.1)
        self.assertNotIn("sleep 300", ps)

    def test_processes(self):
        p = self.sb.processes.start("while read l; do echo got $l; done; exit 4", tag="py")
        p.write("one\n", eof=True)
        done = p.wait()
        self.assertEqual((done["state"], done["exitCode"], done["verdict"]), ("exited", 4, "OK"))
        events = list(self.sb.processes.get(p.id).output(stdout=4))
        self.assertEqual([(e["text"], e["offset"]) for e in events if e["event"] == "stdout"], [("one\n", 4)])
        self.assertEqual(events[-1]["event"], "exit")
        self.assertTrue(any(x["id"] == p.id and x.get("tag") == "py" for x in self.sb.processes.list()))
        sleeper = self.sb.processes.start(["sleep", "1000"])
        sleeper.kill()
        self.assertEqual(sleeper.wait()["verdict"], "KILLED")
        with self.assertRaises(NotFoundError):
            self.sb.processes.get("p999")

    def test_holding_reader(self):
        # More than the process's 1 MiB buffer, read by a loop that stops for a while: every byte, no gap.
        p = self.sb.processes.start("echo ready; while [ ! -e /tmp/go ]; do sleep 0.05; done; seq 1 200000")
        text, events = "", []
        for e in p.output(hold=True):
            events.append(e["event"])
            if e["event"] != "stdout":
                continue
            text += e["text"]
            if text == "ready\n":
                self.sb.files.write("/tmp/go", "")
            elif len(events) == 3:
                import time
                time.sleep(1)
        self.assertNotIn("gap", events)
        self.assertEqual(events[-1], "exit")
        self.assertEqual(text, "ready\n" + "".join("%d\n" % i for i in range(1, 200001)))

    def test_files(self):
        data = bytes(range(256)) * 5000
        self.assertEqual(self.sb.files.write("/work/py/data.bin", data), len(data))
        self.assertEqual(self.sb.files.read("/work/py/data.bin"), data)
        self.assertEqual(self.sb.files.read("/work/py/data.bin", offset=1000, length=10), data[1000:1010])
        self.sb.files.write("/work/py/t.txt", "text")
        self.assertEqual(sorted(e["name"] for e in self.sb.files.list("/work/py")), ["data.bin", "t.txt"])
        self.sb.files.remove("/work/py/t.txt")
        with self.assertRaises(NotFoundError) as cm:
            self.sb.files.read("/work/py/t.txt")
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        self.assertEqual(cm.exception.status, 404)

    def test_directories(self):
        import tempfile
        with tempfile.TemporaryDirectory() as src, tempfile.TemporaryDirectory() as back:
            os.makedirs(os.path.join(src, "pkg", "sub"))
            with open(os.path.join(src, "pkg", "sub", "m.py"), "w") as f:
                f.write("X = 1\n")
            os.symlink("sub/m.py", os.path.join(src, "pkg", "link"))
            self.sb.exec("mkdir -p /work/up")
            r = self.sb.files.upload(src, "/work/up")
            self.assertEqual(r["entries"], 4)
            self.assertEqual(self.sb.exec("cat /work/up/pkg/link").stdout, "X = 1\n")
            self.sb.files.download("/work/up", dest=back)
            self.assertEqual(os.readlink(os.path.join(back, "pkg", "link")), "sub/m.py")
            with open(os.path.join(back, "pkg", "sub", "m.py")) as f:
                self.assertEqual(f.read(), "X = 1\n")
        with self.assertRaises(NotFoundError):
            self.sb.files.download("/work/nothing-here")

    def test_list_get_and_lifecycle(self):
        ids = [s["id"] for s in self.pdk.sandboxes.list(labels={"job": "py"})]
        self.assertEqual(ids, [self.sb.id])
        self.assertEqual([s["id"] for s in self.pdk.sandboxes.list(group="pygroup", state=["running", "paused"])], [self.sb.id])
        self.assertEqual(self.pdk.sandboxes.get(self.sb.id).state, "running")
        self.assertEqual(self.sb.pause()["state"], "paused")
        with self.assertRaises(InvalidStateError) as cm:
            self.sb.exec("true")
        self.assertFalse(cm.exception.retryable)
        self.assertEqual(self.sb.resume()["state"], "running")
        self.assertGreaterEqual(len(self.pdk.nodes.list()), 1)

    def test_groups_and_rollouts(self):
        ro = self.pdk.rollouts.start(sandbox={"ttl_sec": 600, "group": "pyro"})
        try:
            self.assertEqual(ro.exec("echo step").stdout, "step\n")
            again = self.pdk.rollouts.attach(ro.rollout_id)
            self.assertEqual(again.last_step, 0)
            self.assertTrue(again.exec("echo step").replayed)
            self.assertEqual([r["step"] for r in self.pdk.rollouts.export(ro.rollout_id)], [0])
            self.assertIsInstance(self.pdk.groups.pause("pyro"), dict)
            self.assertEqual(ro.sandbox.refresh()["state"], "paused")
        finally:
            self.pdk.rollouts.delete(ro.rollout_id, kill=True)

    def test_errors_carry_the_code(self):
        with self.assertRaises(NotFoundError) as cm:
            self.pdk.sandboxes.get("sb-nonesuch")
        self.assertEqual(cm.exception.code, "NOT_FOUND")
        with self.assertRaises(paddock.InvalidRequestError) as cm:
            self.pdk.sandboxes.create(memory_mib="lots")
        self.assertEqual(cm.exception.code, "INVALID_SPEC")
        with self.assertRaises(paddock.UnavailableError):
            Paddock(url="http://127.0.0.1:9", timeout=2).nodes.list()

    def test_snapshots(self):
        self.sb.exec("echo snap > /work/snapmark")
        snap = self.sb.snapshot()
        self.assertEqual(snap["backend"], "container")
        try:
            self.assertIn(snap["id"], [s["id"] for s in self.pdk.snapshots.list()])
            copy = self.pdk.sandboxes.create(from_snapshot=snap["id"])
            try:
                self.assertEqual(copy.exec("cat /work/snapmark").stdout, "snap\n")
            finally:
                copy.kill()
        finally:
            self.assertTrue(self.pdk.snapshots.delete(snap["id"]))
        self.assertFalse(self.pdk.snapshots.delete("sn-nonesuch"))
        with self.assertRaises(NotFoundError):
            self.pdk.sandboxes.create(from_snapshot="sn-nonesuch")

    def test_module_command_line(self):
        env = {**os.environ, "PYTHONPATH": HERE}
        out = subprocess.run([sys.executable, "-m", "paddock", "exec", self.sb.id, "--", "sh", "-c", "echo cli; exit 7"], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual((out.returncode, out.stdout), (7, "cli\n"))


if __name__ == "__main__":
    unittest.main()
