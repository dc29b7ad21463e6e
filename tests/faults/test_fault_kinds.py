"""Unit tests of the data, device, uneven-input and checkpoint faults (values; their effects in isolation)."""

import pytest
import torch

import ddpfaults.faults
from ddpfaults.errors import FaultError
from ddpfaults.faults import (
    DeviceMismatch,
    EmptyBatch,
    SchemaDrift,
    TornCheckpointWrite,
    UnevenInputs,
    WriterKilledMidSave,
    check_faults,
)
from ddpfaults.toy.data import TARGET_FIELDS, make_batch, target_schema

NEW_FAULTS = [
    EmptyBatch(rank=1, step=1),
    EmptyBatch(rank=[0, 2], step=[3, 1]),
    SchemaDrift(key="segment_mask"),
    SchemaDrift(key="inst_weight", rank=2, step=[0, 4]),
    TornCheckpointWrite(),
    TornCheckpointWrite(writer=2, step=1),
    WriterKilledMidSave(writer=1),
    WriterKilledMidSave(writer=0, step=[2, 5]),
    DeviceMismatch(),
    DeviceMismatch(device_type="hpu", rank=3),
    UnevenInputs(rank=1, batches=2),
    UnevenInputs(rank=[0, 3], batches=0),
]


@pytest.mark.parametrize("fault", NEW_FAULTS, ids=repr)
def test_repr_rebuilds_the_fault(fault):
    rebuilt = eval(repr(fault), vars(ddpfaults.faults))
    assert rebuilt == fault and repr(rebuilt) == repr(fault) and hash(rebuilt) == hash(fault)
    assert check_faults([fault], 4) == (fault,)


def test_repr_examples():
    assert repr(TornCheckpointWrite()) == "TornCheckpointWrite(writer=0)"
    assert repr(WriterKilledMidSave(writer=1, step=2)) == "WriterKilledMidSave(writer=1, step=2)"
    assert repr(SchemaDrift(key="segment_mask")) == "SchemaDrift(key='segment_mask')"
    assert repr(UnevenInputs(rank=1, batches=2)) == "UnevenInputs(rank=1, batches=2)"
    assert repr(DeviceMismatch()) == "DeviceMismatch()"
    assert repr(EmptyBatch(rank=1, step=[2, 1])) == "EmptyBatch(rank=1, step=[1, 2])"


@pytest.mark.parametrize(
    "make",
    [
        lambda: EmptyBatch(1, 2),
        lambda: EmptyBatch(rank=1),
        lambda: SchemaDrift("segment_mask"),
        lambda: TornCheckpointWrite(0),
        lambda: UnevenInputs(rank=1),
    ],
)
def test_positional_or_missing_arguments_are_type_errors(make):
    with pytest.raises(TypeError):
        make()


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: EmptyBatch(rank=None, step=1), "EmptyBatch: rank is required"),
        (lambda: EmptyBatch(rank=1, step=None), "EmptyBatch: step is required"),
        (lambda: EmptyBatch(rank=-1, step=0), "EmptyBatch: rank"),
        (lambda: SchemaDrift(key=""), "SchemaDrift: key"),
        (lambda: SchemaDrift(key=3), "SchemaDrift: key"),
        (lambda: TornCheckpointWrite(writer=-1), "TornCheckpointWrite: writer"),
        (lambda: TornCheckpointWrite(writer=[0, 1]), "TornCheckpointWrite: writer"),
        (lambda: WriterKilledMidSave(writer=True), "WriterKilledMidSave: writer"),
        (lambda: WriterKilledMidSave(writer=0, step=-2), "WriterKilledMidSave: step"),
        (lambda: DeviceMismatch(device_type="cpu"), "DeviceMismatch: device_type"),
        (lambda: DeviceMismatch(device_type="xla:0"), "DeviceMismatch: device_type"),
        (lambda: UnevenInputs(rank=1, batches=-1), "UnevenInputs: batches"),
        (lambda: UnevenInputs(rank=1, batches=1.5), "UnevenInputs: batches"),
        (lambda: UnevenInputs(rank=None, batches=1), "UnevenInputs: rank is required"),
    ],
)
def test_invalid_values_raise_fault_error_naming_the_fault(make, message):
    with pytest.raises(FaultError, match=message):
        make()


@pytest.mark.parametrize(
    "fault, word",
    [
        (EmptyBatch(rank=4, step=0), "rank 4 "),
        (UnevenInputs(rank=[1, 5], batches=1), "rank 5 "),
        (TornCheckpointWrite(writer=4), "writer 4 "),
        (WriterKilledMidSave(writer=7), "writer 7 "),
        (SchemaDrift(key="k", rank=4), "rank 4 "),
        (DeviceMismatch(rank=9), "rank 9 "),
    ],
)
def test_check_world_names_the_rank_and_the_world_size(fault, word):
    with pytest.raises(FaultError) as info:
        fault.check_world(4)
    assert word in str(info.value) and "world of 4" in str(info.value)


def test_torn_write_applies_on_every_rank_at_its_steps_and_killed_only_on_the_writer():
    torn = TornCheckpointWrite(writer=0, step=1)
    assert all(torn.applies(r, 1) for r in range(4)) and not torn.applies(2, 0) and not torn.applies(0, None)
    killed = WriterKilledMidSave(writer=2)
    assert killed.applies(2, 0) and killed.applies(2, None) and not killed.applies(1, 0)
    assert killed.writer == 2 and torn.writer == 0


def test_empty_batch_keeps_the_schema_and_removes_every_instance():
    _, targets = make_batch(seed=0, rank=0, step=0, batch_size=3)
    empty = EmptyBatch(rank=0, step=0).apply(targets)
    for before, after in zip(targets, empty, strict=True):
        assert tuple(after) == TARGET_FIELDS and target_schema(after) == target_schema(before)
        assert len(after["labels"]) == 0 and after["masks"].shape[0] == 0
        assert torch.equal(after["point2segment"], before["point2segment"])
    assert all(len(t["labels"]) > 0 for t in targets), "the real targets must be left untouched"


def test_schema_drift_adds_a_missing_key_and_requires_it():
    _, (target, *_) = make_batch(seed=0, rank=0, step=0)
    drift = SchemaDrift(key="inst_weight")
    drifted = drift.apply(target)
    assert "inst_weight" not in target
    assert drifted["inst_weight"].shape == target["labels"].shape and drifted["inst_weight"].dtype == torch.bool
    drift.require([drifted])
    with pytest.raises(KeyError, match="inst_weight"):
        drift.require([drifted, target])
    assert SchemaDrift(key="segment_mask").apply(target) is target


def test_device_mismatch_hands_out_an_accelerator_device_per_rank():
    assert DeviceMismatch().launcher_device(2) == torch.device("xla", 2)
    assert DeviceMismatch(device_type="hpu").launcher_device(0) == torch.device("hpu", 0)


def test_uneven_inputs_limit_the_loader():
    assert list(UnevenInputs(rank=0, batches=2).limit(iter(range(10)))) == [0, 1]
    assert list(UnevenInputs(rank=0, batches=0).limit(range(10))) == []
    assert list(UnevenInputs(rank=0, batches=5).limit(range(3))) == [0, 1, 2]


def test_empty_batch_is_the_toy_fake_target_transform():
    """EmptyBatch's generic zero-row transform gives exactly the toy's fake_target_like on any target dict."""
    from ddpfaults.faults.batches import PER_SAMPLE_KEYS
    from ddpfaults.toy.data import PER_SCENE_FIELDS, fake_target_like

    assert set(PER_SCENE_FIELDS) <= set(PER_SAMPLE_KEYS)
    _, targets = make_batch(seed=3, rank=1, step=2, batch_size=3)
    targets[0] = {**targets[0], "scale": torch.tensor(2.5), "meta": {"scene": [1, 2]}}
    for got, want in zip(
        EmptyBatch(rank=1, step=2).apply(targets), [fake_target_like(t) for t in targets], strict=True
    ):
        assert list(got) == list(want)
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
            else:
                assert got[key] == value and got[key] is not targets[0].get(key), key


def test_fault_modules_import_no_rank_engine_toy_or_torch_at_module_level():
    """Faults are values: their module-level imports stay off the rank machinery, the engine, the toy and torch."""
    import ast
    import pathlib

    forbidden = ("torch", "ddpfaults.rank", "ddpfaults.engine", "ddpfaults.toy", "ddpfaults.torchrun")
    files = sorted(pathlib.Path(ddpfaults.faults.__file__).parent.glob("*.py"))
    assert len(files) >= 5
    for path in files:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            bad = [n for n in names if any(n == f or n.startswith(f + ".") for f in forbidden)]
            assert not bad, f"{path.name} imports {bad} at module level"
