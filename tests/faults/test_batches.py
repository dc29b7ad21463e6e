"""What EmptyBatch and SchemaDrift do to a DataLoader batch of any layout (pure transforms, no ranks)."""

from collections import namedtuple

import pytest
import torch

from ddpfaults.faults import EmptyBatch, SchemaDrift, batches, register_empty_batch
from ddpfaults.faults.batches import can_empty, empty_batch

Pair = namedtuple("Pair", "inputs labels")


def test_a_batch_of_tensors_loses_every_row_and_keeps_its_layout():
    batch = {"x": torch.ones(4, 3), "meta": [torch.arange(4), "names"], "pair": Pair(torch.zeros(4, 2), torch.ones(4))}
    empty = empty_batch(batch)
    assert empty["x"].shape == (0, 3) and empty["x"].dtype == torch.float32
    assert empty["meta"][0].shape == (0,) and empty["meta"][1] == "names"
    assert (
        isinstance(empty["pair"], Pair) and empty["pair"].inputs.shape == (0, 2) and empty["pair"].labels.shape == (0,)
    )
    assert batch["x"].shape == (4, 3), "the original batch is left alone"
    assert empty_batch((torch.ones(2, 5), torch.tensor(3.0)))[1].item() == 3.0  # 0-dim tensors are kept


def test_detr_targets_keep_their_images_and_per_image_metadata_but_lose_every_instance():
    images = torch.ones(2, 3, 8, 8)
    targets = [
        {
            "boxes": torch.rand(k, 4),
            "labels": torch.arange(k),
            "masks": torch.ones(k, 8, 8, dtype=torch.bool),
            "image_id": torch.tensor([i]),
            "orig_size": torch.tensor([8, 8]),
            "size": torch.tensor([8, 8]),
            "file": f"img{i}.jpg",
        }
        for i, k in enumerate((3, 1))
    ]
    got_images, got = empty_batch((images, targets))
    assert got_images is images  # the samples are there; none has an instance
    assert len(got) == 2
    for i, t in enumerate(got):
        assert list(t) == list(targets[i])
        assert t["boxes"].shape == (0, 4) and t["labels"].shape == (0,) and t["masks"].shape == (0, 8, 8)
        assert t["image_id"].tolist() == [i] and t["orig_size"].tolist() == [8, 8] and t["size"].tolist() == [8, 8]
        assert t["file"] == f"img{i}.jpg" and t["masks"].dtype == torch.bool


class Nested:
    """A batch type of the user's own (like DETR's NestedTensor)."""

    def __init__(self, tensors):
        self.tensors = tensors


def _empty_nested(value):
    return Nested(value.tensors[:0])


def test_a_registered_type_is_emptied_by_its_own_function(monkeypatch):
    monkeypatch.setattr(batches, "_EMPTY_BY_TYPE", {})  # the registry travels with every job: leave it as found
    batch = (Nested(torch.ones(2, 3)), torch.ones(2))
    assert not can_empty(Nested(torch.ones(2)))  # an unknown type: nothing to empty
    register_empty_batch(Nested, _empty_nested)
    empty = empty_batch(batch)
    assert isinstance(empty[0], Nested) and empty[0].tensors.shape == (0, 3) and empty[1].shape == (0,)
    with pytest.raises(TypeError, match="batch_type must be a class"):
        register_empty_batch("Nested", _empty_nested)


def test_fault_hooks_report_no_effect_when_nothing_changes():
    assert EmptyBatch(rank=0, step=0).on_batch(("text only", 3)) is None
    assert EmptyBatch(rank=0, step=0).on_batch(torch.ones(0, 2)) is None  # already empty
    drift = SchemaDrift(key="segment_mask", rank=1, step=2)
    assert drift.on_batch([{"labels": torch.ones(2)}]) is None
    dropped = drift.on_batch((torch.ones(2), [{"labels": torch.ones(2), "segment_mask": torch.ones(2)}]))
    assert list(dropped[1][0]) == ["labels"]
