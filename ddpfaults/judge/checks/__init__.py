"""Checks of a finished world, after the fact, over its result: the resume check (with its records read from the
job's files), what a preemption did (recovery) and how the verdict measures up (fidelity). They use the pure verdict
(:mod:`ddpfaults.judge`) and nothing of the live judge (:mod:`ddpfaults.judge.live`)."""
