"""Drives a program in a pseudo-terminal: python3 drive.py CMD_JSON STEPS_JSON.

STEPS: a list of {"send": text} (\\x03 is Ctrl-C, \\x04 Ctrl-D) and {"expect": regex, "timeout": s}
(matched against the output after the previous match). Prints the transcript; exits with the
program's exit status, or 3 if an expectation was not met (or 4 if the program did not exit).
"""
import json
import os
import pty
import re
import select
import sys
import time

cmd, steps = json.loads(sys.argv[1]), json.loads(sys.argv[2])
pid, fd = pty.fork()
if pid == 0:
    os.environ["TERM"] = "dumb"
    os.execvp(cmd[0], cmd)

out = b""
pos = 0


def pump(deadline):
    global out
    while True:
        left = deadline - time.time()
        if left <= 0:
            return False
        ready, _, _ = select.select([fd], [], [], min(left, 0.2))
        if ready:
            try:
                data = os.read(fd, 65536)
            except OSError:
                return True
            if not data:
                return True
            out += data
            return None


def transcript():
    sys.stdout.write(out.decode("utf-8", "replace"))
    sys.stdout.flush()


for step in steps:
    if "send" in step:
        os.write(fd, step["send"].encode())
    if "expect" in step:
        pattern = re.compile(step["expect"].encode())
        deadline = time.time() + step.get("timeout", 60)
        while True:
            m = pattern.search(out, pos)
            if m:
                pos = m.end()
                break
            if pump(deadline) is not None and not pattern.search(out, pos):
                transcript()
                print(f"\n--- expected {step['expect']!r} within {step.get('timeout', 60)} s", file=sys.stderr)
                os.kill(pid, 9)
                sys.exit(3)

deadline = time.time() + 30
while time.time() < deadline:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        pump(time.time() + 0.5)
        transcript()
        sys.exit(os.waitstatus_to_exitcode(status))
    pump(time.time() + 0.2)
transcript()
os.kill(pid, 9)
sys.exit(4)
