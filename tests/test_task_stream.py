import pytest

from grpo.train.task_stream import TaskStream


def test_batches_cover_each_epoch_once_then_reshuffle():
    stream = TaskStream(list(range(6)), batch_size=4, seed=3)
    first, second, third = stream.next_batch(), stream.next_batch(), stream.next_batch()
    epoch0 = first + second[:2]
    assert sorted(epoch0) == [0, 1, 2, 3, 4, 5]
    epoch1 = second[2:] + third
    assert sorted(epoch1) == [0, 1, 2, 3, 4, 5]
    assert epoch0 != epoch1  # reshuffled with a new epoch seed


def test_resume_serves_the_same_tasks_as_an_uninterrupted_run():
    uninterrupted = TaskStream(list(range(10)), batch_size=3, seed=7)
    expected = [uninterrupted.next_batch() for _ in range(6)]
    first = TaskStream(list(range(10)), batch_size=3, seed=7)
    served = [first.next_batch() for _ in range(4)]
    resumed = TaskStream(list(range(10)), batch_size=3, seed=7)
    resumed.load_state_dict(first.state_dict())
    served += [resumed.next_batch() for _ in range(2)]
    assert served == expected


def test_no_shuffle_keeps_file_order_and_empty_dataset_is_an_error():
    assert TaskStream(["a", "b", "c"], batch_size=2, shuffle=False).next_batch() == ["a", "b"]
    with pytest.raises(ValueError, match="empty"):
        TaskStream([], batch_size=2)


def test_resume_with_a_different_dataset_size_is_refused():
    stream = TaskStream(list(range(5)), batch_size=2)
    other = TaskStream(list(range(6)), batch_size=2)
    with pytest.raises(ValueError, match="5 training tasks"):
        other.load_state_dict(stream.state_dict())
