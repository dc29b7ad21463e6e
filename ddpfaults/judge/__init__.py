"""The verdict on a world, pure: results as data (:mod:`~ddpfaults.judge.results`) and the functions that judge them
(verdict, deadlock proofs, attribution, divergence, flight records, causes); no time, no files, no processes. Beside
it, :mod:`ddpfaults.judge.live` watches a running world and calls it; :mod:`ddpfaults.judge.checks` checks a finished
one after the fact. Imports no torch."""
