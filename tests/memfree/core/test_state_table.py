"""The state table on its own: whatever the steps, capacities, widths and fresh starts of the
key ids, a step's rows are the rows its states fill (on the host and from the copy a device
keeps, here on the CPU), and the table holds no more rows than its capacity or one step's
states ask for: past its capacity it gives up the rows used least recently, and it grows only
when a step uses every row it holds."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memfree.core.state_table import StateTable, is_banned


def fill(row: np.ndarray, key: int, width: int) -> None:
    """A state's banned row: fixed by its key, different for every key."""
    row[:] = np.random.default_rng(key).random(width) < 0.3


step_strategy = st.tuples(
    st.lists(st.integers(0, 60), min_size=1, max_size=24),  # the rows' keys
    st.booleans(),  # a fresh start of the key ids before it
    st.sampled_from([None, 1, 2, 5, 40]),  # a new capacity before it
)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.sampled_from([1, 2, 3, 8, 64]),
    widths=st.sampled_from([(37,), (37, 45), (16, 16, 9)]),
    mirror=st.booleans(),
    steps=st.lists(step_strategy, min_size=1, max_size=30),
)
def test_a_steps_rows_are_its_states_rows_and_the_table_stays_within_its_bound(
    capacity: int,
    widths: tuple[int, ...],
    mirror: bool,
    steps: list[tuple[list[int], bool, int | None]],
) -> None:
    table = StateTable(fill, capacity=capacity)
    table.mirror_always = mirror
    keys = list(range(61))
    generation, bound = 0, capacity
    for number, (row_keys, fresh, new_capacity) in enumerate(steps):
        width = widths[number * len(widths) // len(steps)]
        if fresh:
            generation += 1
        if new_capacity is not None:
            table.capacity = new_capacity
            bound = max(bound, new_capacity)
        key_ids = np.array(row_keys, dtype=np.int64)
        wanted = list(range(0, len(row_keys), 3))
        got, host = table.gather(key_ids, keys, generation, width, torch.device("cpu"), wanted)
        expected = np.zeros((len(row_keys), width), dtype=bool)
        for index, key in enumerate(row_keys):
            fill(expected[index], key, width)
        assert np.array_equal(got.numpy(), expected)
        for index in wanted:
            tokens = range(width)
            assert [is_banned(host[index], t) for t in tokens] == expected[index].tolist()
        # Rows past the bound only while one step's states need them all.
        bound = max(bound, len(set(row_keys)))
        assert table._filled <= bound
