"""Run a command as a child subreaper, and print (JSON) every process left below this one once it has exited:
whatever the command left behind re-parents here instead of to init, zombies included
(tests/engine/test_cli_ends.py)."""

import json
import os
import subprocess
import sys

from ddpfaults.proc import tree

if __name__ == "__main__":
    tree.become_subreaper()
    done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    table = tree.snapshot()
    left = {}
    for pid in tree.below([os.getpid()], table):
        try:
            with open(f"/proc/{pid}/stat") as f:
                left[pid] = f.read().split()[2]  # the state: Z for a zombie nobody reaped
        except OSError:
            pass  # reaped meanwhile
    print(json.dumps({"returncode": done.returncode, "stderr": done.stderr[-2000:], "left": left}))
