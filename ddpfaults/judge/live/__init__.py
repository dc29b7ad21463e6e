"""Watching a world as it runs: the :class:`~ddpfaults.judge.live.observer.Observer` protocol, each rank's view
(watch: its event file, CPU time, stack and flight-record dump), the deadlock prover, the branches read from the
ranks' source files, and the one judge loop that polls them and calls the pure verdict (:mod:`ddpfaults.judge`)."""
