"""Processes, as both sides handle them: the launcher (its census, its pool) and the ranks and the fork server.

:mod:`~ddpfaults.proc.tree` reads the process tree from /proc and kills what is below a process;
:mod:`~ddpfaults.proc.mp_private` holds every use of multiprocessing's private API; :mod:`~ddpfaults.proc.platform`
says what a world needs of the operating system and refuses one where it is missing. None imports torch, nor
anything of ddpfaults but its errors.
"""
