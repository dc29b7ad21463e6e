"""Faults are values: what goes wrong, on which rank, at which step.

Every fault has a keyword-only constructor that validates its arguments, a
``check_world(world_size)`` that validates it against the world it is given to,
and a ``repr`` that is valid Python rebuilding it (so a failing plan can be pasted
into a regression test). Inside a rank, the engine calls ``on_step`` when the
rank's step clock starts a step (``ctx.step(i)``, or the optimizer/DataLoader clock
of a script world) and ``skips_collective`` before each traced collective; data
faults (``EmptyBatch``, ``SchemaDrift``, ``UnevenInputs``) act on the batches a
``DataLoader`` yields and ``DeviceMismatch`` on the construction of DDP, unless
scenario code asks for them through ``ctx.fault(Kind)``; checkpoint faults
(``TornCheckpointWrite``, ``WriterKilledMidSave``) act at the checkpoint file on disk,
whatever writes it, through the rank's file record (armed when their step starts), the DCP faults (``TornDcpWrite``,
``CheckpointNotVisible``, ``AsyncSaveKilled``) DCP's file writes, existence checks and ``async_save``;
``OutOfMemory`` limits its rank's
address space when its step starts; the link faults (``SlowLink``, ``DroppedLink``) act as their
rank enters a collective (``before_collective``). So the code under test needs no change.
Whenever a fault takes effect it is recorded as fired, and only then: a checkpoint fault fires when it tears
or kills a save, ``UnevenInputs`` when it cuts a loader short. A plan is validated in one place,
:func:`~ddpfaults.faults.base.check_plan` (a list of faults, no two in conflict on one rank and step) and
:func:`check_faults` (against a world), into a :class:`Plan` carried as it is from where it entered to the ranks;
a plan knows whether it only changes data (:attr:`Plan.data_only`).

This package holds the values only: :mod:`~ddpfaults.faults.base` (the base class and its
validation), :mod:`~ddpfaults.faults.step`, :mod:`~ddpfaults.faults.data`,
:mod:`~ddpfaults.faults.checkpoint`, :mod:`~ddpfaults.faults.dcp`, :mod:`~ddpfaults.faults.memory` and
:mod:`~ddpfaults.faults.link`
(the kinds), :mod:`~ddpfaults.faults.batches` (what a data fault does to a batch of any layout). The effect of a
checkpoint, memory or ``DroppedLink`` fault inside a rank needs the rank's machinery: it lives in
:mod:`ddpfaults.rank.effects`, which looks the kind up; this package never imports the rank side (nor torch at
import).
"""

from __future__ import annotations

from ddpfaults.errors import FaultError
from ddpfaults.faults.base import Fault, Plan, check_faults
from ddpfaults.faults.batches import register_empty_batch, zero_instance_target
from ddpfaults.faults.checkpoint import TornCheckpointWrite, WriterKilledMidSave
from ddpfaults.faults.data import DeviceMismatch, EmptyBatch, SchemaDrift, UnevenInputs
from ddpfaults.faults.dcp import AsyncSaveKilled, CheckpointNotVisible, TornDcpWrite
from ddpfaults.faults.link import DroppedLink, LinkDropped, SlowLink
from ddpfaults.faults.memory import OutOfMemory
from ddpfaults.faults.step import Preempt, RankCrash, RankKilled, RankOnlyBarrier, SkippedCollective, Straggler

__all__ = [
    "AsyncSaveKilled",
    "CheckpointNotVisible",
    "DeviceMismatch",
    "DroppedLink",
    "EmptyBatch",
    "Fault",
    "FaultError",
    "LinkDropped",
    "OutOfMemory",
    "Plan",
    "RankCrash",
    "RankKilled",
    "Preempt",
    "RankOnlyBarrier",
    "SchemaDrift",
    "SkippedCollective",
    "SlowLink",
    "Straggler",
    "TornCheckpointWrite",
    "TornDcpWrite",
    "UnevenInputs",
    "WriterKilledMidSave",
    "check_faults",
    "register_empty_batch",
    "zero_instance_target",
]
