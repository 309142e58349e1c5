#!/usr/bin/env python3
"""The gradient path under a capped link, against PyTorch DDP: two hosts made of network
namespaces (tests/distributed/netns_hosts.py; needs root, iproute2 and ebtables), one rank on
each, every host's link capped both ways by tc's token bucket at each rate in turn. At each
cap, in the same run: `train --benchmark true` on the CPU under mpirun (its gradient buckets
summed with MPI), and torchvision's same model under DistributedDataParallel on Gloo, launched
by torchrun (scripts/bench/ddp_step.py), with the same batch, image size and bucket size. Prints
a Markdown table: step time, compute alone, the all-reduce past backward, and how much of the
all-reduce each hides behind backward.

  sudo scripts/bench/capped_link.py --caps none 1gbit 300mbit --arch resnet18
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "distributed"))
from netns_hosts import Hosts, missing_tools  # noqa: E402

ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
       "OMPI_MCA_btl_vader_single_copy_mechanism": "none", "OMP_NUM_THREADS": "1"}
COLOURS = re.compile(r"\x1b\[[0-9;]*m")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--caps", nargs="+", default=["none", "1gbit", "300mbit"],
                   help="tc rates for every host's link, both ways; none: uncapped")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--bucket-mb", type=int, default=25)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--build", default=os.environ.get("TRAINER_BUILD_DIR", ROOT / "build"))
    p.add_argument("--python", default=sys.executable, help="a Python with torch and torchvision")
    return p.parse_args()


def run(argv, timeout=900):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **ENV})
    text = COLOURS.sub("", out.stdout + out.stderr)
    if out.returncode != 0:
        sys.exit(f"{argv[0]} ... failed ({out.returncode}):\n{text[-3000:]}")
    return text


def train_args(folder, args):
    return ["--device", "cpu", "--arch", args.arch, "--num_classes", "1000",
            "--data_source", "synthetic", "--image_size", str(args.image_size),
            "--batch_size", str(args.batch_size), "--bucket_mb", str(args.bucket_mb),
            "--benchmark", "true", "--benchmark_warmup_steps", "3",
            "--benchmark_steps", str(args.steps), "--output_dir", str(folder / "run")]


def benchmark_line(text):
    """train's step median, compute and all-reduce past backward, ms."""
    found = re.search(r"step median ([\d.]+) ms.*forward and backward ([\d.]+) ms, gradient "
                      r"all-reduce past backward ([\d.]+) ms", text)
    if not found:
        sys.exit(f"no benchmark line from train:\n{text[-3000:]}")
    return [float(g) for g in found.groups()]


def trainer_mpirun(hosts, folder, args):
    """Ranks on hosts[1:], mpirun on hosts[0]: its buckets summed with MPI."""
    hostfile = folder / "hostfile"
    hostfile.write_text("".join(f"{h} slots=1\n" for h in hosts.names[1:]))
    train = Path(args.build) / "train"
    # --bind-to none: the hosts share this machine's cores, and each daemon would bind its one
    # rank to the same first core.
    argv = ["mpirun", "--hostfile", str(hostfile), "--mca", "plm_rsh_agent",
            str(hosts.rsh_agent(folder)), "-np", "2", "--bind-to", "none", "-x",
            "OMP_NUM_THREADS", str(train), *train_args(folder, args)]
    return benchmark_line(run(hosts.on(hosts.names[0], argv)))


def torchrun(hosts, python, program, timeout=900):
    """One torchrun agent on each of hosts[1:], meeting at the first (a new port each launch, so
    that none meets the last one's store); rank 0's output. An agent that fails ends the rest."""
    torchrun.port += 1
    print(f"capped_link.py: torchrun {' '.join(program[:2])} at port {torchrun.port}",
          file=sys.stderr, flush=True)
    procs, logs = [], []
    for index, host in enumerate(hosts.names[1:]):
        argv = [str(Path(python).parent / "torchrun"), "--nnodes", "2", "--nproc-per-node", "1",
                "--node-rank", str(index), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"{hosts.names[1]}:{torchrun.port}", "--rdzv-id", f"bench{torchrun.port}",
                *program]
        logs.append(tempfile.TemporaryFile("w+"))
        procs.append(subprocess.Popen(hosts.on(host, argv), stdout=logs[-1],
                                      stderr=subprocess.STDOUT, text=True,
                                      env={**os.environ, **ENV}, start_new_session=True))
        if index == 0:
            time.sleep(2)  # the first agent serves the rendezvous
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in procs):
        failed = any(p.returncode not in (None, 0) for p in procs)
        if failed or time.monotonic() > deadline:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, 9)
            break
        time.sleep(0.5)
    outs = []
    for p, log in zip(procs, logs):
        p.wait()
        log.seek(0)
        outs.append(COLOURS.sub("", log.read()))
        if p.returncode != 0:
            sys.exit(f"torchrun failed ({p.returncode}):\n" + "\n".join(o[-2000:] for o in outs))
    return outs[0]


torchrun.port = 29400


def trainer_torchrun(hosts, folder, args):
    """The same ranks under torchrun: its buckets summed with Gloo, as DDP's are."""
    return benchmark_line(torchrun(hosts, args.python, ["--no-python", str(Path(args.build) / "train"),
                                           *train_args(folder, args)]))


def ddp(hosts, args):
    """ddp_step.py's figures."""
    out = torchrun(hosts, args.python, [str(ROOT / "scripts" / "bench" / "ddp_step.py"), "--arch", args.arch,
                           "--batch-size", str(args.batch_size), "--image-size",
                           str(args.image_size), "--bucket-mb", str(args.bucket_mb), "--steps",
                           str(args.steps)])
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def main():
    args = parse_args()
    why = missing_tools()
    if why:
        sys.exit(why)
    print(f"{args.arch}, batch {args.batch_size} per rank, {args.image_size} px, 2 ranks on the "
          f"CPU (one thread each), bucket {args.bucket_mb} MB, median of {args.steps} steps, ms\n")
    print("| link cap | launcher | this trainer: step | compute | all-reduce past backward | "
          "DDP (Gloo): step | compute (no_sync) | all-reduce alone | hidden | speed vs DDP |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    # SIGTERM unwinds as an exception would, so the namespaces are deleted.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("capped_link.py: stopped by SIGTERM"))
    with tempfile.TemporaryDirectory() as tmp, Hosts(["l", "a", "b"],
                                                     prefix=f"cl{os.getpid() % 10000}") as hosts:
        for cap in args.caps:
            hosts.heal()
            for host in hosts.names[1:] if cap != "none" else []:
                hosts.cap(host, cap)
            folder = Path(tmp) / cap
            folder.mkdir()
            # On the CPU the trainer sums its buckets once backward is done
            # (GradientReducer::launch, blocking): none of it is hidden, by construction.
            ours = {"mpirun (MPI)": trainer_mpirun(hosts, folder, args),
                    "torchrun (Gloo)": trainer_torchrun(hosts, folder, args)}
            peer = ddp(hosts, args)
            for launcher, (step, compute, past) in ours.items():
                print(f"| {cap} | {launcher} | {step:.0f} | {compute:.0f} | {past:.0f} | "
                      f"{peer['step']:.0f} | {peer['no_sync']:.0f} | {peer['allreduce']:.0f} | "
                      f"{100 * peer['overlap']:.0f}% | {peer['step'] / step:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
