"""The image, built from docker/Dockerfile with podman (scripts/image/local.sh) and run the way
the cluster runs it, on the CPU: as uid 1000 with no capabilities and no privilege escalation,
volumes mounted as the pods mount them. What it ships; train and the tools starting; the smoke
Job's and the one-node Job's rendered commands run verbatim; SIGTERM, checkpoint and resume;
and the p3.16xlarge MPIJob rehearsed as the MPI Operator starts it (scripts/k8s/rehearse.py),
with a worker killed mid-run. Skips where podman is missing or cannot start containers."""
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# image, cluster, kubectl and render are fixtures.
from deploy_support import ROOT, build_dir, kubectl, render  # noqa: E402,F401
from image_support import (CPU_OVERRIDES, RUN_TIMEOUT_S, built_from_source,  # noqa: E402,F401
                           cluster, cpu_config, image, newest_checkpoint, restricted_pod,
                           steps_logged, wait_for, writable_dir)

PROGRAMS = ["train", "make-tfrecords", "index-tfrecords", "verify-tfrecords", "generate-dataset",
            "bench-input", "bench-allreduce", "torchrun"]
FINAL = re.compile(r"final: top-1 [\d.]+%")


def in_image(cluster, image, script, timeout=300):
    """(status, output) of a bash script run in the image as the pods run (uid 1000, restricted)."""
    c = cluster()
    pod = restricted_pod(image, ["-c", script])
    pod["containers"][0]["command"] = ["/bin/bash"]
    name = c.start("sh", pod)
    status = c.wait(name, timeout)
    return status, c.logs(name)


def test_runtime_image_holds_what_train_loads_and_no_build_tools(image, cluster):
    status, out = in_image(cluster, image, r"""
        id -u
        for tool in gcc g++ cc c++ nvcc cmake make pip pip3 mpicc mpicxx opal_wrapper; do
          command -v "$tool" && echo "found $tool"
        done
        for dir in /src /stage /tmp/docker /tmp/candidates /opt/build-cache /run/secrets/*; do
          [ -e "$dir" ] && echo "found $dir"
        done
        ldd /opt/resnet-trainer/bin/* | grep 'not found'
        python3 -c 'import pip' 2>/dev/null && echo "found pip module"
        for program in """ + " ".join(PROGRAMS) + r"""; do
          entrypoint "$program" --help >/dev/null 2>&1 || echo "fails $program"
        done
        true""")
    assert status == 0, out
    assert out.split()[0] == "1000"
    assert not re.findall(r"^(found|fails) .*|not found", out, re.M), out


def test_no_build_secret_in_either_image(image, cluster):
    """The CAs this machine adds to the public ones (a TLS-intercepting proxy's) reach the build
    as a secret; no file of the runtime image or the build stage (where the image was compiled
    here, IMAGE_FROM_SOURCE=1) holds one."""
    extra = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    if not extra:
        pytest.skip("this machine trusts no extra CA to look for")
    # The last line of each certificate's base64 body: its signature, unique to it.
    marks = [[line for line in p.read_text().splitlines() if line and "-----" not in line][-1]
             for p in extra]
    for tag in [image, image + "-build"] if built_from_source() else [image]:
        # Where a CA would be written: configuration, homes (the tests' build keeps its venv in
        # root's), scratch, the sources, and any certificate or pip configuration file under /opt
        # (the default build's venv). Names are passed NUL-separated: the venv holds files with
        # spaces in their names.
        script = ("printf '%s\\n' \"$@\" >/tmp/marks; "
                  "{ find /opt \\( -name '*.pem' -o -name '*.crt' -o -name 'pip.conf' \\) -print0; "
                  "find /etc /root /home /run /tmp /usr/local /src -type f ! -path /tmp/marks "
                  "-print0; } 2>/dev/null | xargs -0 -r grep -lF -f /tmp/marks; true")
        pod = restricted_pod(tag, ["-c", script, "marks", *marks])
        pod["containers"][0]["command"] = ["/bin/bash"]
        pod["securityContext"]["runAsUser"] = 0  # to read what only root may
        pod["securityContext"]["runAsNonRoot"] = False
        c = cluster()
        name = c.start("grep", pod)
        assert c.wait(name, 300) == 0
        assert c.logs(name).strip() == "", f"{tag} holds a build CA in: {c.logs(name)}"


def mapped(pid):
    """The libcudart and libnccl files mapped by process pid."""
    maps = open(f"/proc/{pid}/maps").read()
    return sorted(set(re.findall(r"(/\S*/lib(?:cudart|nccl)\.so[.\d]*)$", maps, re.M)))


def test_smoke_job_runs_verbatim_with_a_checkpoint_torch_loads(image, cluster, render, tmp_path):
    docs = render("smoke", "--image", image)
    fsx = tmp_path / "fsx"
    writable_dir(fsx / "imagenet")
    runs = writable_dir(fsx / "runs")
    c = cluster(docs, {"fsx-claim": fsx})
    status, log = rehearse_job(c, docs)
    assert status == 0 and FINAL.search(log), log[-3000:]
    _, checkpoint = newest_checkpoint(runs / "smoke")
    assert checkpoint, f"no checkpoint in {runs / 'smoke'}"
    import torch
    import torchvision
    state = torch.load(checkpoint)  # PyTorch's safe defaults (weights_only)
    net = torchvision.models.resnet50(num_classes=10)
    net.load_state_dict(state["model"], strict=True)


def rehearse_job(c, docs):
    from image_support import rehearse
    return rehearse.run_job(c, docs, RUN_TIMEOUT_S)


def test_sigterm_checkpoints_exits_143_and_the_same_command_resumes(image, cluster, tmp_path):
    runs = writable_dir(tmp_path / "runs")
    command = ["--config", "/opt/resnet-trainer/configs/smoke.toml", "--output_dir", "/runs/stop",
               "--resume", "auto", "--generated_train_images", "640", "--epochs", "2",
               "--checkpoint_every_steps", "5", "--log_every_steps", "5"]
    pod = restricted_pod(image, command, {"/runs": "runs"})
    pod["terminationGracePeriodSeconds"] = 60
    c = cluster(claims={"runs": runs})
    name = c.start("train", pod)
    wait_for(lambda: newest_checkpoint(runs / "stop")[0] >= 5, RUN_TIMEOUT_S, "a checkpoint",
             container=name)
    inside = container_maps(name)
    c.stop(name, grace=60)
    assert c.wait(name, 120) == 143, c.logs(name)[-3000:]
    stopped, _ = newest_checkpoint(runs / "stop")
    assert stopped >= 5
    logged = len(steps_logged(runs / "stop"))
    again = c.start("train-again", pod)
    assert c.wait(again, RUN_TIMEOUT_S) == 0, c.logs(again)[-3000:]
    assert FINAL.search(c.logs(again)) and newest_checkpoint(runs / "stop")[0] == 40
    resumed = steps_logged(runs / "stop")[logged:]
    assert resumed and min(resumed) > stopped, f"stopped at {stopped}, then logged {resumed}"
    # One CUDA runtime and one NCCL, the torch wheel's, as the host's build maps them.
    assert [os.path.basename(p) for p in inside] == ["libcudart.so.13", "libnccl.so.2"], inside
    assert all("/opt/resnet-trainer/lib/nvidia/" in p for p in inside), inside


def container_maps(name):
    """mapped() of the train process in a container, read from the host."""
    pid = subprocess.run(["podman", "inspect", "--format", "{{.State.Pid}}", name],
                         capture_output=True, text=True, timeout=60).stdout.strip()
    # PID 1 is the entrypoint; train is its child.
    child = open(f"/proc/{pid}/task/{pid}/children").read().split()[0]
    return mapped(child)


def test_the_host_build_maps_the_same_cuda_runtime_and_nccl(tmp_path):
    train = build_dir() / "train"
    proc = subprocess.Popen([train, "--config", ROOT / "configs" / "smoke.toml", "--max_steps",
                             "1", "--output_dir", tmp_path], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: len(mapped(proc.pid)) >= 2 or proc.poll() is not None, 60,
                 "train to load its libraries")
        outside = mapped(proc.pid)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert [os.path.basename(p) for p in outside] == ["libcudart.so.13", "libnccl.so.2"], outside
    assert all("/site-packages/nvidia/" in p for p in outside), outside


# --- the cluster targets, rehearsed ------------------------------------------------------------

@pytest.fixture(scope="module")
def dataset(image, tmp_path_factory):
    """A small ImageNet-layout TFRecord dataset, made and verified by the image's own tools."""
    from image_support import rehearse, restricted_pod as pod_of
    out = writable_dir(tmp_path_factory.mktemp("data") / "imagenet")
    c = rehearse.Cluster([], {"data": out}, tmp_path_factory.mktemp("gen"),
                         prefix=f"rt{os.getpid()}-data-")
    try:
        script = ("generate-dataset --tfrecords /data --classes 10 --images-per-class 32 "
                  "--val-per-class 8 --width 48 --height 40 --train-shards 4 --val-shards 2 && "
                  "verify-tfrecords '/data/train-*' && verify-tfrecords '/data/validation-*'")
        spec = pod_of(image, ["-c", script], {"/data": "data"})
        spec["containers"][0]["command"] = ["/bin/bash"]
        name = c.start("gen", spec)
        assert c.wait(name, 300) == 0, c.logs(name)
    finally:
        c.delete(grace=5)
    assert len([p for p in out.glob("train-*-of-*") if not p.suffix]) == 4  # and index files
    return out


@pytest.fixture(scope="module")
def cpu_toml(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "p3-on-cpu.toml"
    path.write_text(cpu_config(ROOT / "configs" / "p3.16xlarge.toml", **CPU_OVERRIDES))
    return path


def fsx_volume(root, dataset):
    """The FSx claim as stage-data leaves it: imagenet/ (read-only in the pods), runs/ for uid 1000."""
    shutil.copytree(dataset, root / "imagenet")
    writable_dir(root / "runs")
    return root


def output_dir(docs, fsx):
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["trainer.toml"]
    path = re.search(r'^output_dir\s*=\s*"([^"]+)"', config, re.M).group(1)
    return fsx / "runs" / os.path.relpath(path, "/fsx/runs")


def test_mpijob_trains_on_every_rank_over_ssh(image, dataset, cpu_toml, cluster, render,
                                              tmp_path):
    from image_support import rehearse
    docs = render("p3.16xlarge", "--image", image, "--workers", "2", "--slots", "2",
                  "--config", str(cpu_toml))
    fsx = fsx_volume(tmp_path / "fsx", dataset)
    job = rehearse.MPIJob(cluster(docs, {"fsx-claim": fsx}), docs)
    status, log = job.run(RUN_TIMEOUT_S)
    assert status == 0 and FINAL.search(log), log[-4000:]
    # Rank 0 logs the world: both workers' hosts.
    assert all(w in log for w in job.workers), log[-4000:]
    assert newest_checkpoint(output_dir(docs, fsx))[0] > 0


def test_the_acceptance_job_all_reduces_across_the_workers_over_ssh(image, cluster, render,
                                                                    tmp_path):
    """allreduce-p3.16xlarge as rendered, but for a sweep and a gate the CPU takes (1 MiB, MPI
    over the containers' network): every rank's sums right, the verdict in the launcher's
    status."""
    from image_support import rehearse
    docs = render("allreduce-p3.16xlarge", "--image", image, "--workers", "2", "--slots", "2")
    job_doc = next(d for d in docs if d["kind"] == "MPIJob")
    args = job_doc["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0][
        "args"]
    assert args[-4:] == ["--max-bytes", "2G", "--min-busbw", "1.5"]
    args[-3], args[-1] = "1M", "0.0001"
    fsx = tmp_path / "fsx"
    (fsx / "runs").mkdir(parents=True)
    job = rehearse.MPIJob(cluster(docs, {"fsx-claim": fsx}), docs)
    status, log = job.run(RUN_TIMEOUT_S)
    assert status == 0, log[-4000:]
    assert "# 4 rank(s), CPU" in log and re.search(r"# busbw at 1048576 bytes: .*: ok$", log, re.M)
    rows = [line.split() for line in log.splitlines() if re.match(r"\s+1048576\s", line)]
    assert rows and rows[-1][-1] == "0", log[-4000:]  # no element summed wrong


def test_a_killed_worker_ends_the_job_and_a_restart_resumes(image, dataset, cluster, render,
                                                            tmp_path):
    from image_support import rehearse
    # Long enough to be killed mid-run after the first checkpoint.
    config = tmp_path / "p3-on-cpu-longer.toml"
    config.write_text(cpu_config(ROOT / "configs" / "p3.16xlarge.toml",
                                 **{**CPU_OVERRIDES, "epochs": 4}))
    docs = render("p3.16xlarge", "--image", image, "--workers", "2", "--slots", "2",
                  "--config", str(config))
    fsx = fsx_volume(tmp_path / "fsx", dataset)
    runs = output_dir(docs, fsx)
    c = cluster(docs, {"fsx-claim": fsx})
    job = rehearse.MPIJob(c, docs)
    for i in range(job.replicas):
        job.start_worker(i)
    job.wait_ready()
    launcher = job.start_launcher()
    # The launcher's mpirun ends when any rank or worker does: stop waiting then.
    wait_for(lambda: newest_checkpoint(runs)[0] >= 5, RUN_TIMEOUT_S, "a checkpoint",
             container=launcher)
    subprocess.run(["podman", "kill", c.prefix + job.workers[1]], check=True, timeout=60)
    killed = time.monotonic()
    try:
        status = c.wait(launcher, 60)
    except TimeoutError:
        pytest.fail("the launcher still runs 60 s after a worker was killed:\n"
                    + c.logs(launcher)[-3000:])
    print(f"launcher ended {time.monotonic() - killed:.0f} s after the kill, status {status}")
    assert status != 0, c.logs(launcher)[-3000:]
    # mpirun took the ranks on the surviving worker down with it.
    wait_for(lambda: "train" not in processes(c.prefix + job.workers[0]), 30,
             "the surviving worker's ranks to end")
    c.delete(grace=60)  # cleanPodPolicy: Running
    assert c.running() == []
    # Started again (a retry of the launcher, or kubectl apply): resumes from the newest checkpoint.
    step, _ = newest_checkpoint(runs)
    logged = len(steps_logged(runs))
    again = rehearse.MPIJob(cluster(docs, {"fsx-claim": fsx}), docs)
    status, log = again.run(RUN_TIMEOUT_S)
    assert status == 0 and FINAL.search(log), log[-4000:]
    resumed = steps_logged(runs)[logged:]
    assert resumed and min(resumed) > step, f"newest checkpoint {step}, then logged {resumed}"


def processes(container):
    """The command names running in a container."""
    proc = subprocess.run(["podman", "exec", container, "bash", "-c",
                           "cat /proc/[0-9]*/comm 2>/dev/null"], capture_output=True, text=True,
                          timeout=60)
    return proc.stdout.split()


def test_one_node_job_runs_verbatim(image, dataset, cpu_toml, cluster, render, tmp_path):
    from image_support import rehearse
    docs = render("one-node", "--image", image, "--slots", "2", "--config", str(cpu_toml))
    fsx = fsx_volume(tmp_path / "fsx", dataset)
    status, log = rehearse.run_job(cluster(docs, {"fsx-claim": fsx}), docs, RUN_TIMEOUT_S)
    assert status == 0 and FINAL.search(log), log[-4000:]


# --- torchrun, as Kubeflow's PyTorchJob runs the trainer ----------------------------------------

def process_tree(pid):
    """pid and its descendants."""
    tree, pending = [], [int(pid)]
    while pending:
        p = pending.pop()
        tree.append(p)
        try:
            pending += [int(c) for t in os.listdir(f"/proc/{p}/task")
                     for c in open(f"/proc/{p}/task/{t}/children").read().split()]
        except OSError:  # it has ended meanwhile
            pass
    return tree


def libraries(pid):
    """The LibTorch, CUDA runtime and NCCL files process pid maps ([] once it has ended)."""
    try:
        maps = open(f"/proc/{pid}/maps").read()
    except OSError:
        return []
    return sorted(set(re.findall(r"(/\S*/lib(?:torch|c10|cudart|nccl)\S*\.so[.\d]*)$", maps, re.M)))


def test_torchrun_trains_two_cpu_ranks_with_one_copy_of_the_libraries(image, cluster, tmp_path):
    """What a PyTorchJob's pods run: the image's torchrun (its Python, the torch package staged
    beside the trainer's libraries) starting `train` twice on the CPU, the ranks meeting at the
    agent's store and reducing with Gloo; torchrun and both ranks map the one copy of LibTorch,
    the CUDA runtime and NCCL."""
    runs = writable_dir(tmp_path / "runs")
    command = ["torchrun", "--no-python", "--nproc-per-node", "2", "/opt/resnet-trainer/bin/train",
               "--config", "/opt/resnet-trainer/configs/smoke.toml", "--output_dir", "/runs/tr",
               "--generated_train_images", "640", "--generated_val_images", "100",
               "--image_size", "32", "--epochs", "1", "--log_every_steps", "2"]
    c = cluster(claims={"runs": runs})
    name = c.start("torchrun", restricted_pod(image, command, {"/runs": "runs"}))
    pid = subprocess.run(["podman", "inspect", "--format", "{{.State.Pid}}", name],
                         capture_output=True, text=True, timeout=60).stdout.strip()
    seen = {}  # command name -> {pid: the libraries it maps}

    def loaded_or_ended():
        for p in process_tree(pid):
            try:
                comm = open(f"/proc/{p}/comm").read().strip()
            except OSError:
                continue
            found = libraries(p)
            if comm in ("train", "torchrun") and any("libnccl" in f for f in found):
                seen.setdefault(comm, {})[p] = found
        both = len(seen.get("train", {})) == 2 and "torchrun" in seen
        return both or not os.path.exists(f"/proc/{pid}")

    wait_for(loaded_or_ended, RUN_TIMEOUT_S, "torchrun and two ranks to load their libraries")
    status = c.wait(name, RUN_TIMEOUT_S)
    log = c.logs(name)
    assert status == 0 and FINAL.search(log), log[-4000:]
    assert "world: 2 rank(s) on 1 host(s)" in log, log[-4000:]
    assert "Failed to initialize NumPy" not in log, log[:2000]  # the image has none: no warning
    assert len(seen.get("train", {})) == 2 and "torchrun" in seen, seen
    for comm, processes in seen.items():
        for p, files in processes.items():
            names = [os.path.basename(f) for f in files]
            assert names.count("libcudart.so.13") == 1 and names.count("libnccl.so.2") == 1, files
            assert all(f.startswith("/opt/resnet-trainer/lib/") for f in files), (comm, files)
