"""The launcher is interrupted or terminated mid-world: no rank, DataLoader worker or fork server survives."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

from processes import EVENT_GUARD, alive, interruptible, wait_for

#: tests/support (the helper modules): the launcher script below runs outside pytest, so it puts them on sys.path
SUPPORT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "support")

LAUNCHER = textwrap.dedent(
    """
    import faulthandler, signal, sys
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # the test asks for our stacks if we do not exit
    sys.path.insert(0, {support!r})
    import rankfns
    from ddpfaults import run_world
    if __name__ == "__main__":
        # fixed: the guard's 600 s (a world only the signal this test sends ends): no verdict depends on it
        run_world(rankfns.record_pids, world_size=3, args=({directory!r},), kwargs=dict(hang="sleep"), timeout=600)
    """
)


def test_nothing_survives_a_terminated_launcher(tmp_path):
    """SIGTERM while a 3-rank world hangs: the launcher cleans up and exits non-zero; no rank, DataLoader worker or
    fork server is left, nor the world's temp dir. (Ctrl-C: tests/engine/test_cli_ends.py; SIGKILL, where no clean-up
    of the launcher runs: tests/engine/test_escapees.py, whose ranks' children left their process groups.)"""
    signum = signal.SIGTERM
    script = tmp_path / "launcher.py"
    script.write_text(LAUNCHER.format(support=SUPPORT, directory=str(tmp_path)))
    output = tmp_path / "launcher.out"
    with open(output, "wb") as out:
        launcher = subprocess.Popen(
            [sys.executable, str(script)], stdout=out, stderr=subprocess.STDOUT, preexec_fn=interruptible
        )
    try:

        def infos():
            files = [tmp_path / f"rank{r}.json" for r in range(3)]
            return all(f.exists() for f in files) and [json.loads(f.read_text()) for f in files]

        ranks = wait_for(infos, EVENT_GUARD, "the ranks to start their DataLoader workers", process=launcher)
        pids = [i["pid"] for i in ranks] + [w for i in ranks for w in i["workers"]]
        fork_server = {i["ppid"] for i in ranks}
        assert len(pids) == 9 and alive(pids) == pids
        # fixed: a pause only: the teardown checked is the same whenever the signal comes
        time.sleep(0.3)  # the world is now hung (rank 0 sleeps; only the 600 s timeout would end it): interrupt it
        launcher.send_signal(signum)
        try:
            launcher.wait(timeout=EVENT_GUARD)
        except subprocess.TimeoutExpired as late:
            launcher.send_signal(signal.SIGUSR2)
            # fixed: a moment for the launcher's dump (SIGUSR2) before the failure is reported: diagnostics only
            time.sleep(1)
            raise AssertionError(
                f"the launcher did not exit 120 s after {signum.name}; its output:\n{output.read_text()}"
            ) from late
        wait_for(
            lambda: not alive(pids + sorted(fork_server)), EVENT_GUARD, "every rank, worker and the fork server to die"
        )
        wait_for(lambda: not os.path.exists(ranks[0]["shared_dir"]), EVENT_GUARD, "the world's temp dir to be removed")
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0
