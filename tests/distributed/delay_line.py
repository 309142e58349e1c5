"""A delay line, run in a host's network namespace (netns_hosts.Hosts.slow_link): every packet its
iptables rules hand to netfilter's queue (NFQUEUE) is held `--delay-ms`, then let through in the
order it came, or dropped, a `--loss` share of them at random. This kernel has no netem; a queue
that userspace releases late is the delay it lacks. Dropped here, after the sender's call has
returned, a packet is lost silently, as on a wire (iptables' DROP in OUTPUT would fail the
sender's call with EPERM instead). It ends on SIGTERM, when its parent goes, or after `--for-s`
seconds at most, letting through what it holds.
"""
import argparse
import collections
import os
import random
import select
import signal
import time

from netfilterqueue import COPY_META, NetfilterQueue

MAX_HELD = 65536  # packets the kernel may queue for it; past that it drops them (more loss)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--queue", type=int, default=0, help="the NFQUEUE number to serve")
    parser.add_argument("--delay-ms", type=float, required=True, help="each packet's hold")
    parser.add_argument("--loss", type=float, default=0, help="the share of packets dropped")
    parser.add_argument("--ready", required=True, help="a file written once the queue is bound")
    parser.add_argument("--for-s", type=float, default=900, help="the longest it runs")
    args = parser.parse_args()
    draw = random.Random(0).random  # the same losses each run
    delay, parent, end = args.delay_ms / 1000, os.getppid(), time.monotonic() + args.for_s
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    held = collections.deque()  # (when to release, packet), oldest first: one delay for all
    queue = NetfilterQueue()
    # Its metadata alone: the verdict needs the packet's id, not its bytes.
    queue.bind(args.queue, lambda packet: held.append((time.monotonic() + delay, packet)),
               max_len=MAX_HELD, mode=COPY_META)
    with open(args.ready, "w") as ready:
        ready.write(f"{os.getpid()}\n")
    while not stop and os.getppid() == parent and time.monotonic() < end:
        now = time.monotonic()
        while held and held[0][0] <= now:
            packet = held.popleft()[1]
            if draw() < args.loss:
                packet.drop()
            else:
                packet.accept()
        wait = min(held[0][0] - now, 1.0) if held else 1.0  # a second at most: the checks above
        if select.select([queue.get_fd()], [], [], max(wait, 0))[0]:  # SIGTERM: Python retries
            queue.run(block=False)
    for _, packet in held:
        packet.accept()


if __name__ == "__main__":
    main()
