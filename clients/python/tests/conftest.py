"""Fixtures: a real `rollbox serve` and the fake OpenAI-compatible policy server, each in its own process.

The binaries come from $ROLLBOX_BIN and $ROLLBOX_FAKEPOLICY_BIN (the Go test
that runs this suite builds them), or are built here with `go build`. Under
CI=true nothing skips: a missing tool fails the suite.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE.parent / "src"))

from rollbox import Client  # noqa: E402

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The fake policy's scripts: per task prompt, the conversations it plays in
# turn (a group of as many episodes as choices holds each once).
ANSWER_TASK = {"id": "add", "prompt": "What is 2+2? Call finish with the answer.",
               "reward": {"type": "exact", "answer": "4"}, "limits": {"max_turns": 5}}
FILE_TASK = {"id": "write-file", "prompt": "Write the word hello into /work/out.txt, then call finish.",
             "tools": ["bash", "run_tests", "finish"],
             "reward": {"type": "tests", "command": "test \"$(cat /work/out.txt)\" = hello", "timeout_s": 30},
             "limits": {"max_turns": 5}}
SLOW_TASK = {"id": "slow", "prompt": "Take your time: run bash a few times.",
             "reward": {"type": "exact", "answer": "x"}, "limits": {"max_turns": 30}}

SCRIPTS = {"scripts": [
    {"match": "What is 2+2", "choices": [
        [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo 4"}}]},
         {"tool_calls": [{"name": "finish", "arguments": {"answer": "4"}}]}],
        [{"tool_calls": [{"name": "finish", "arguments": {"answer": "5"}}]}],
    ]},
    {"match": "Write the word hello", "choices": [
        [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo hello > /work/out.txt"}}]},
         {"tool_calls": [{"name": "finish", "arguments": {}}]}],
        [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo goodbye > /work/out.txt"}}]},
         {"tool_calls": [{"name": "finish", "arguments": {}}]}],
    ]},
    {"match": "Take your time", "choices": [
        [{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]} for _ in range(20)],
    ]},
]}


def _need(reason: str) -> None:
    if CI:
        pytest.fail(f"{reason} (CI=true: integration tests may not skip)")
    pytest.skip(reason)


def _build(tmp: Path, pkg: str, name: str) -> str:
    go = shutil.which("go")
    if go is None:
        _need("no Go toolchain to build " + pkg + " (set $ROLLBOX_BIN and $ROLLBOX_FAKEPOLICY_BIN)")
    out = tmp / name
    subprocess.run([go, "build", "-o", str(out), pkg], cwd=REPO, check=True)
    return str(out)


@pytest.fixture(scope="session")
def binaries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("bin")
    rb = os.environ.get("ROLLBOX_BIN") or _build(tmp, "./cmd/rollbox", "rollbox")
    fp = os.environ.get("ROLLBOX_FAKEPOLICY_BIN") or _build(tmp, "./internal/fakepolicy/fakepolicyd", "fakepolicyd")
    return {"rollbox": rb, "fakepolicy": fp}


class Proc:
    """A child process that printed the URL it listens on."""

    def __init__(self, args: list[str], pattern: str, log: Path, stream: str = "stderr") -> None:
        self.log = log
        self.logf = open(log, "w")
        kw = {"stdin": subprocess.PIPE, "text": True}
        if stream == "stderr":
            kw.update(stdout=self.logf, stderr=subprocess.PIPE)
        else:
            kw.update(stdout=subprocess.PIPE, stderr=self.logf)
        self.p = subprocess.Popen(args, **kw)  # type: ignore[call-overload]
        pipe = self.p.stderr if stream == "stderr" else self.p.stdout
        found: list[str] = []
        ready = threading.Event()

        def pump() -> None:
            for line in pipe:
                self.logf.write(line)
                self.logf.flush()
                m = re.search(pattern, line)
                if m and not found:
                    found.append(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        if not ready.wait(120) or not found:
            self.stop()
            raise RuntimeError(f"{args[0]} did not start: see {log}:\n{log.read_text()[-3000:]}")
        self.url = found[0]

    def stop(self, sig_timeout: float = 30) -> int | None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(sig_timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.logf.close()
        return self.p.returncode


@pytest.fixture(scope="session")
def start_policy(binaries: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    procs: list[Proc] = []

    def start(*flags: str, scripts: dict | None = None) -> str:
        d = tmp_path_factory.mktemp("policy")
        script = d / "script.json"
        script.write_text(json.dumps(scripts or SCRIPTS))
        p = Proc([binaries["fakepolicy"], "--script", str(script), *flags], r"listening on (http://\S+)", d / "policy.log", stream="stdout")
        procs.append(p)
        return p.url

    yield start
    for p in procs:
        p.stop()


@pytest.fixture(scope="session")
def start_service(binaries: dict[str, str], tmp_path_factory: pytest.TempPathFactory):
    """Starts `rollbox serve` (WASM backend) with extra flags; returns its Proc."""
    procs: list[Proc] = []

    def start(*flags: str) -> Proc:
        d = tmp_path_factory.mktemp("serve")
        tasks = d / "tasks.jsonl"
        tasks.write_text("".join(json.dumps(t) + "\n" for t in (ANSWER_TASK, FILE_TASK, SLOW_TASK)))
        env = dict(os.environ, ROLLBOX_OWNER="pyclient-" + d.name)
        args = [binaries["rollbox"], "serve", "--addr", "127.0.0.1:0", "--data", str(d / "data"), "--tasks", str(tasks),
                "--backend", "wasm", "--disk-reserve", "0", "--log-level", "info", *flags]
        p = Proc(args, r"listening on (http://[0-9.:]+)", d / "serve.log")
        p.data = d / "data"  # type: ignore[attr-defined]
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.stop()


@pytest.fixture(scope="session")
def policy_url(start_policy) -> str:
    return start_policy()


@pytest.fixture(scope="session")
def slow_policy_url(start_policy) -> str:
    return start_policy("--latency", "300ms")


@pytest.fixture(scope="session")
def service(start_service) -> Proc:
    return start_service()


@pytest.fixture()
def client(service: Proc) -> Iterator[Client]:
    c = Client(service.url)
    yield c
    c.close()


def wait_for(pred, timeout: float = 30.0, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"condition not met in {timeout} s")
