import ddpfaults
from ddpfaults.faults import EmptyBatch


def test_training_survives_an_empty_batch_on_one_rank():
    result = ddpfaults.run_script("train.py", world_size=4, faults=[EmptyBatch(rank=1, step=3)])
    assert result.outcome == "completed", result.report()
