"""The chaos test's accounting of what a run trained across rounds (tests/run/chaos_history.py), on
histories the chaos scenarios produced."""
from collections import Counter

from chaos_history import trained_per_epoch


def test_a_resume_that_makes_fewer_steps_supersedes_the_later_ones():
    """CHAOS_SEED=20261174's history: 6 records in steps of 2, alone; killed after its sixth step
    with the last checkpoint after the fourth (epoch 1, image 2); relaunched at a batch of 3, which
    trains the 4 images left as one step, the fifth (a single image left joins the step before).
    The first round's sixth step was trained again by the relaunch's fifth and must not count."""
    first = ["0 0 0 1", "0 1 2 3", "0 2 4 5", "1 3 3 5", "1 4 1 2", "1 5 0 4"]
    relaunch = ["1 4 0 1 2 4"]
    epochs = trained_per_epoch({0: first + relaunch}, [[0, 1], [4, 1]])
    assert epochs == {0: Counter(range(6)), 1: Counter(range(6))}


def test_a_rank_outside_the_resumed_world_keeps_only_its_steps_before_the_resume():
    """Two ranks for three steps (the checkpoint after two), then one rank from there: rank 1's
    third step is gone with its round, though no line of rank 1 says so."""
    traces = {0: ["0 0 0", "0 1 2", "0 2 4", "0 2 4 5"], 1: ["0 0 1", "0 1 3", "0 2 5"]}
    epochs = trained_per_epoch(traces, [[0, 2], [2, 1]])
    assert epochs == {0: Counter(range(6))}
