"""How scripts/k8s/rehearse.py names the pods of an MPIJob, with only the small Debian base image
(bash and getent, no trainer, no sshd): every pod resolves every pod's Service names
(<pod>.<job>.default.svc, and with .cluster.local) to that pod's address, on this machine's podman
whether or not it has a DNS plugin (Debian 12's has none unless installed by hand); a pod started
again under its name keeps its address; a hostfile host that does not resolve stops the
rehearsal in seconds, before the launcher starts; and the image tests' waits end with the log of
the container that was to bring about what they wait for, once it has exited. A minute or two the first time (the base image
is made by debootstrap), seconds after. Skips where podman is missing or cannot start containers."""
import subprocess
import time

import pytest

pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# cluster is a fixture.
from image_support import (base_image, cluster, rehearse, restricted_pod,  # noqa: E402,F401
                           wait_for, writable_dir)

JOB = "names"
# A worker that idles until stopped (bash as PID 1 ignores SIGTERM unless it traps it).
IDLE = "trap 'exit 0' TERM; sleep 600 & wait"


@pytest.fixture(scope="module")
def base():
    return base_image()


def bash_pod(image, script):
    """A restricted pod (uid 1000, no capabilities) running a bash script."""
    pod = restricted_pod(image, ["-c", script])
    pod["containers"][0]["command"] = ["/bin/bash"]
    return pod


def mpijob(image, launcher_script, workers=2):
    """An MPIJob as scripts/k8s/render.sh writes one, cut to what naming needs."""
    return [{"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": JOB},
             "spec": {"slotsPerWorker": 1, "sshAuthMountPath": "/home/trainer/.ssh",
                      "mpiReplicaSpecs": {
                          "Launcher": {"replicas": 1,
                                       "template": {"spec": bash_pod(image, launcher_script)}},
                          "Worker": {"replicas": workers,
                                     "template": {"spec": bash_pod(image, IDLE)}}}}}]


@pytest.fixture
def no_ssh_keys(monkeypatch):
    """The operator's SSH Secret, empty: the base image has no ssh-keygen, and nothing here
    logs in."""
    def empty_secret(job):
        folder = job.cluster.workdir / "secret-ssh"
        rehearse.write_volume(folder, {})
        return folder
    monkeypatch.setattr(rehearse.MPIJob, "ssh_secret", empty_secret)


def address(container):
    """The container's address on its one network, as podman gave it."""
    return subprocess.run(
        ["podman", "inspect", "--format",
         "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", container],
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def resolve(container, names):
    """{name: address or None} as getent resolves the names inside a running container."""
    script = 'for n; do echo "$n $(getent hosts "$n" | cut -d" " -f1)"; done'
    proc = subprocess.run(["podman", "exec", container, "bash", "-c", script, "sh", *names],
                          capture_output=True, text=True, timeout=60, check=True)
    found = dict((line.split() + [None])[:2] for line in proc.stdout.splitlines())
    return {name: found.get(name) for name in names}


def test_every_pod_resolves_every_pods_service_names(base, cluster, no_ssh_keys):
    # The launcher prints what each hostfile host and its own Service names resolve to.
    launcher_script = ('for h in $(sed "s/ .*//" /etc/mpi/hostfile) "$(hostname).names.default.svc"'
                       '; do echo "$h $(getent hosts "$h" | cut -d" " -f1)"; done')
    docs = mpijob(base, launcher_script)
    c = cluster(docs)
    job = rehearse.MPIJob(c, docs)
    workers = [job.start_worker(i) for i in range(job.replicas)]
    launcher = job.start_launcher()
    assert c.wait(launcher, 120) == 0, c.logs(launcher)
    resolved = dict(line.split(" ", 1) for line in c.logs(launcher).splitlines())
    expected = {job.dns(w): address(c.prefix + w) for w in job.workers}
    expected[job.dns(job.launcher_name)] = job.hosts()[job.dns(job.launcher_name)]
    assert resolved == expected, c.logs(launcher)

    # From a worker: the other worker and the launcher by their Service names, with and without
    # .cluster.local, and itself by its hostname; another pod's bare hostname does not resolve,
    # as the cluster's DNS does not resolve it.
    other = job.workers[1]
    names = [job.dns(other), job.dns(other) + ".cluster.local",
             job.dns(job.launcher_name) + ".cluster.local", job.workers[0], other]
    assert resolve(workers[0], names) == {
        job.dns(other): address(workers[1]),
        job.dns(other) + ".cluster.local": address(workers[1]),
        job.dns(job.launcher_name) + ".cluster.local": job.hosts()[job.dns(job.launcher_name)],
        job.workers[0]: address(workers[0]),
        other: None}

    # A worker started again under its name keeps its address, where the others' records point.
    before = address(workers[1])
    subprocess.run(["podman", "rm", "-f", "-t", "0", workers[1]], capture_output=True,
                   timeout=120, check=True)
    job.start_worker(1)
    assert address(workers[1]) == before
    assert resolve(workers[0], [job.dns(other)]) == {job.dns(other): before}


def test_an_unknown_hostfile_host_stops_the_rehearsal_in_seconds(base, cluster, no_ssh_keys,
                                                                 monkeypatch):
    docs = mpijob(base, "echo the launcher started")
    c = cluster(docs)
    job = rehearse.MPIJob(c, docs)
    for i in range(job.replicas):
        job.start_worker(i)
    # A hostfile naming one worker right and one host that no pod of the job is.
    folder = c.workdir / "bad-mpi-config"
    rehearse.write_volume(folder, {"hostfile": (f"{job.dns(job.workers[0])} slots=1\n"
                                                f"ghost.{JOB}.default.svc slots=1\n", 0o444)})
    monkeypatch.setattr(job, "hostfile_dir", lambda: folder)
    start = time.monotonic()
    with pytest.raises(SystemExit) as failed:
        job.start_launcher()
    took = time.monotonic() - start
    message = str(failed.value)
    assert message.startswith(f"k8s-rehearse: ghost.{JOB}.default.svc from the hostfile does not "
                              "resolve"), message
    assert "Fix:" in message and f"{JOB}-worker-<i>.{JOB}.default.svc" in message, message
    # The entrypoint would have retried for 5 minutes; the check takes one short container.
    assert took < 60, f"the check took {took:.0f} s"
    # The launcher never started.
    started = subprocess.run(["podman", "ps", "-a", "--filter", f"label={c.label}", "--format",
                              "{{.Names}}"], capture_output=True, text=True, timeout=60).stdout
    assert c.prefix + job.launcher_name not in started.split(), started


def test_a_wait_ends_with_the_log_once_its_container_has_exited(base, cluster, tmp_path):
    out = writable_dir(tmp_path / "out")
    c = cluster(claims={"out": out})
    # What a container made just before exiting counts.
    pod = restricted_pod(base, ["-c", "echo done > /out/made"], {"/out": "out"})
    pod["containers"][0]["command"] = ["/bin/bash"]
    name = c.start("makes", pod)
    wait_for(lambda: (out / "made").exists(), 120, "the file", container=name)
    # A container that ends without making it: the wait fails then, not at its time limit.
    name = c.start("quits", bash_pod(base, "echo giving up; exit 3"))
    start = time.monotonic()
    with pytest.raises(pytest.fail.Exception) as failed:
        wait_for(lambda: (out / "never").exists(), 600, "a file it never makes", container=name)
    assert time.monotonic() - start < 60
    assert "exited with status 3 before a file it never makes" in str(failed.value)
    assert "giving up" in str(failed.value)
