"""A preemption notice in a process that holds the signal blocked (a torchrun worker, whose signal thread takes
torchrun's) still reaches the code under test's handler; in this process, no rank needed."""

import signal

from ddpfaults.rank import preempt


def test_a_notice_reaches_the_handler_through_a_held_signal_and_the_signal_stays_held():
    got = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        preempt.notify(signal.SIGUSR1)
        assert got == [signal.SIGUSR1]
        assert signal.SIGUSR1 in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert signal.SIGUSR1 not in signal.sigpending()  # delivered, not left for the thread that takes held ones
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGUSR1, previous)
