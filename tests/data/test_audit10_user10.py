"""Audit 10 (user10): a worker process that dies is explained, not a bare Grain error."""

import pytest

from fnnc.data import workers
from fnnc.errors import DataError

GRAIN = (
    "Worker process was terminated unexpectedly with exit code 1. Search the logs above "
    "for the source of the crash."
)


class Dies:
    """A stream as Grain's mp_prefetch gives it: one element, then its worker dies."""

    def __init__(self, error):
        self.items, self.error, self.closed = [7], error, False

    def __next__(self):
        if self.items:
            return self.items.pop()
        raise self.error

    def get_state(self):
        return {"grain": 1}

    def close(self):
        self.closed = True


def test_a_dead_worker_says_to_guard_the_script_and_keeps_grains_error_as_cause():
    # a script without `if __name__ == "__main__":` ended in 240 lines and Grain's
    # "Worker process was terminated unexpectedly" RuntimeError, fnnc's advice unsaid
    died = RuntimeError(GRAIN)
    it = workers._Explained(Dies(died))
    assert next(it) == 7 and it.get_state() == {"grain": 1}
    with pytest.raises(
        DataError, match=r'died \(Worker process was .*if __name__ == "__main__"'
    ) as info:
        next(it)
    assert info.value.__cause__ is died
    it.close()
    assert it._it.closed


def test_other_runtime_errors_and_the_end_of_the_stream_pass_through():
    other = RuntimeError("something else")
    it = workers._Explained(Dies(other))
    next(it)
    with pytest.raises(RuntimeError, match="something else") as info:
        next(it)
    assert info.value is other
    it = workers._Explained(Dies(StopIteration()))
    assert list(it) == [7]
