"""Processes, as both sides handle them: the launcher (its census, its pool) and the ranks and the fork server.

:mod:`~ddpfaults.proc.tree` reads the process tree from /proc and kills what is below a process;
:mod:`~ddpfaults.proc.mp_private` holds every use of multiprocessing's private API. Neither imports torch or
anything else of ddpfaults.
"""
