"""What a run's surviving history trained, from the sample traces its rounds appended: the
accounting the chaos test's every-image-once check rests on."""
import re
from collections import Counter, defaultdict

RANK0 = re.compile(r"^\[[^]]+\] \[\S+ 0/\d+\]")  # a line rank 0 logged


def rounds_of(lines):
    """[first step, world size] of each round, in order, from the run's log lines merged in time
    order: a round starts with rank 0's "world:" line and, when it resumed, its "resumed from
    ... step S" line."""
    found = []
    for line in lines:
        if not RANK0.match(line):
            continue
        if world := re.search(r"world: (\d+) rank\(s\)", line):
            found.append([0, int(world[1])])
        elif resumed := re.search(r"resumed from \S+: epoch \d+, image \d+ of \d+, step (\d+)",
                                  line):
            if found:
                found[-1][0] = int(resumed[1])
    return found


def trained_per_epoch(traces, rounds):
    """{epoch: Counter of ids} that the run's surviving history trained, from each rank's trace
    lines ({rank: ["epoch step id..."]}, appended by every round; a step is counted from 0, the
    steps done before it) and the rounds ([first step, world size], as rounds() reads them). A
    round that resumed from a checkpoint after S steps replaces whatever earlier rounds trained
    from step S on, whether or not it runs those step numbers again (a resume at another global
    batch makes other steps): in a rank's file, a step at or below one already written starts a
    new round and drops the steps from it on; a rank beyond the world of the round that owns a
    step had no share in it."""
    epochs = defaultdict(Counter)
    for rank, lines in traces.items():
        kept = {}
        for line in lines:
            epoch, step, *ids = map(int, line.split())
            if kept and step <= max(kept):
                kept = {s: v for s, v in kept.items() if s < step}
            kept[step] = (epoch, ids)
        for step, (epoch, ids) in kept.items():
            if rank < [w for first, w in rounds if first <= step][-1]:
                epochs[epoch].update(ids)
    return epochs
