import subprocess
import sys


def top(path):
    p = subprocess.run([sys.executable, "/app/wordfreq.py", path], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return [tuple(line.split()) for line in p.stdout.splitlines()]


def test_sample():
    assert top("/app/sample.txt") == [("the", "5"), ("bird", "4"), ("a", "3")]


def test_hidden_text():
    # A text the agent never saw: a script that prints fixed answers fails here.
    assert top("/tests/hidden.txt") == [("go", "3"), ("it's", "3"), ("stop", "2")]
