#!/usr/bin/env python3
"""Runs a target rendered by scripts/k8s/render.sh (an MPIJob, or a batch/v1 Job) in podman
containers on this machine, started the way the cluster starts its pods, and exits with the
status of the launcher (or the Job's pod). Prints every podman command it runs.

  scripts/k8s/render.sh p3.16xlarge --image IMAGE --workers 2 --slots 2 --config CPU.toml > job.yaml
  scripts/k8s/rehearse.py job.yaml --claim fsx-claim=DIR   # DIR/imagenet the data, DIR/runs output

As the kubelet would: each container's command and args verbatim (command replaces the image's
entrypoint, args its CMD) and its environment; the pod's user and the container's security
settings (dropped capabilities, no-new-privileges, non-root check); a PersistentVolumeClaim as a
folder given by --claim (with subPath, made when missing, and readOnly), a ConfigMap or Secret as
a read-only, root-owned folder laid out like the kubelet's (files behind ..data links), an
in-memory emptyDir as tmpfs; the readiness probe (tcpSocket); the grace period on stop.
As the Kubeflow MPI Operator v0.8.2 would (pkg/controller/mpi_job_controller.go): the workers
first, as <job>-worker-<i> with the DNS name <job>-worker-<i>.<job>.<namespace>.svc; the SSH
Secret (an ECDSA P-521 key in PEM as id_rsa, the public key as id_rsa.pub and authorized_keys;
mode 0644 unless mounted at /root/.ssh) at sshAuthMountPath of every pod; the launcher only once
every worker is ready (WaitForWorkersReady), with the hostfile and discover_hosts.sh at /etc/mpi
and the operator's environment; when the launcher ends, the workers are deleted (cleanPodPolicy).
As the headless Service <job> would: every pod of the job resolves every pod's name,
<pod>.<job>.<namespace>.svc and the same with .cluster.local, to that pod's address; a pod resolves
its own hostname too. Podman's DNS is not used (Debian 12's podman resolves names on its networks
only with a DNS plugin that nothing installs): each container gets a fixed address on the job's
network, the same for a pod started again under the same name, and every name of the job as an
/etc/hosts line (--add-host), so the rehearsal behaves the same with or without the plugin. Before
the launcher starts, a short-lived container on the launcher's network, with its /etc/hosts, checks
that every hostfile host resolves, and the rehearsal stops at once naming any that does not (the
launcher's entrypoint would wait 15 minutes for it, ENTRYPOINT_WAIT_S).
Not rehearsed: GPUs and other resources, scheduling (node selectors, tolerations), the Service's
DNS server itself (names through the search path such as <pod>.<job>, another pod's bare
hostname, records that change while the job runs: a restarted pod keeps its address here, where
the cluster would give it a new one), restarts (restartPolicy, backoffLimit).
"""
import argparse
import ipaddress
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

NAMESPACE = "default"
# The kubelet's layout of a ConfigMap or Secret volume: a timestamped folder, ..data linking to it,
# and each file a link through ..data (so that updates are atomic).
DATA_DIR = "..2025_01_01_00_00_00.000000000"


def log(*words):
    print("+", " ".join(str(w) for w in words), file=sys.stderr, flush=True)


def podman(*args, timeout=120, check=True, quiet=False):
    """Runs podman; returns its stdout. Every call has a time limit."""
    if not quiet:
        log("podman", *args)
    proc = subprocess.run(["podman", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"podman {' '.join(map(str, args))} failed ({proc.returncode}):\n"
                           f"{proc.stderr}")
    return proc.stdout


def exit_status(name):
    """A container's exit status once it has stopped, else None (created or still running)."""
    state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", name,
                   quiet=True).split()
    return int(state[1]) if state[0] in ("exited", "stopped") else None


def container_log(name):
    proc = subprocess.run(["podman", "logs", name], capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr


def hostfile_hosts(text):
    """The hosts of a hostfile, read as the image's entrypoint reads them (wait_for_hosts): lines
    are "host slots=N" (OpenMPI) or "host:N" (Intel MPI, MPICH); # starts a comment line."""
    hosts = [re.split(r"[\s:]", line, maxsplit=1)[0] for line in text.splitlines()]
    return [h for h in hosts if h and not h.startswith("#")]


def write_volume(folder, files):
    """files: {name: (text, mode)} -> folder, as the kubelet lays out a ConfigMap or Secret."""
    folder.mkdir(parents=True)
    data = folder / DATA_DIR
    data.mkdir()
    for name, (text, mode) in files.items():
        (data / name).write_text(text)
        (data / name).chmod(mode)
        (folder / name).symlink_to(Path("..data") / name)
    (folder / "..data").symlink_to(DATA_DIR)
    folder.chmod(0o1777)  # a tmpfs mount, world-writable and sticky, as the kubelet makes it


def size(quantity):
    """A Kubernetes quantity (64Gi, 512Mi) as podman writes sizes (64g, 512m)."""
    units = {"Ki": "k", "Mi": "m", "Gi": "g", "K": "k", "M": "m", "G": "g"}
    for suffix, unit in units.items():
        if str(quantity).endswith(suffix):
            return str(quantity)[:-len(suffix)] + unit
    return str(quantity)


REHEARSAL_LABEL = "resnet-trainer-rehearsal"  # its value: the rehearsal's prefix


def delete_rehearsal(prefix, grace=60):
    """Stops the containers of the rehearsal with this prefix (SIGTERM, SIGKILL after grace s)
    and removes them and its network."""
    names = podman("ps", "-a", "--filter", f"label={REHEARSAL_LABEL}={prefix}", "--format",
                   "{{.Names}}", check=False, quiet=True).split()
    if names:
        podman("stop", "-t", grace, *names, timeout=grace + 60, check=False)
        podman("rm", "-f", *names, timeout=120, check=False)
    podman("network", "rm", "-f", f"{prefix}net", check=False)


class Cluster:
    """The pods of one rendered target, as podman containers on a network of their own. Every
    container and the network carry one label, and delete() removes them all."""

    def __init__(self, docs, claims, workdir, prefix="rehearsal-", node_env=()):
        """node_env: NAME=VALUE variables every container starts with, under the pod's own (as
        a node's container runtime may set)."""
        self.docs = docs
        self.node_env = list(node_env)
        self.claims = {name: Path(path) for name, path in claims.items()}
        self.workdir = Path(workdir)
        self.prefix = prefix
        self.label = f"{REHEARSAL_LABEL}={prefix}"
        self.network = f"{prefix}net"
        self.config_maps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
        self.delete(grace=0)  # what an interrupted run with the same prefix left
        # Podman picks a subnet that no other network uses (another test's, the host's).
        podman("network", "create", "--label", self.label, self.network)
        subnet = json.loads(podman("network", "inspect", self.network, quiet=True))[0]["subnets"][0]
        gateway = ipaddress.ip_address(subnet["gateway"])
        self.free = [a for a in ipaddress.ip_network(subnet["subnet"]).hosts() if a != gateway]
        self.addresses = {}  # container name (without the prefix) -> its address

    def address(self, name):
        """The fixed address of the container `name` on the network. Every container gets one, so
        that the other pods' /etc/hosts can name it before it starts; podman's address management
        then hands out none itself that could collide. A pod started again under the same name
        gets the same address, which the others' /etc/hosts lines still point at."""
        if name not in self.addresses:
            self.addresses[name] = str(self.free[len(self.addresses)])
        return self.addresses[name]

    @staticmethod
    def host_args(hosts):
        """{name: address} as /etc/hosts lines (--add-host), which resolve with or without a DNS
        server on the network."""
        return [arg for name, address in hosts.items()
                for arg in ("--add-host", f"{name}:{address}")]

    def volume_args(self, pod, container, extra):
        """podman arguments that mount the container's volumes; extra: {mountPath: (dir, ro)}."""
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        args = []
        for mount in container.get("volumeMounts", []):
            volume, path = volumes[mount["name"]], mount["mountPath"]
            ro = ":ro" if mount.get("readOnly") else ""
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                if claim not in self.claims:
                    raise SystemExit(f"k8s-rehearse: no folder for claim {claim}. "
                                     f"Fix: --claim {claim}=DIR")
                source = self.claims[claim] / mount.get("subPath", "")
                # As the kubelet does, a subPath the volume lacks is made (empty) before the mount
                # (/fsx/weights when no weights were imported).
                source.mkdir(parents=True, exist_ok=True)
                args += ["-v", f"{source}:{path}{ro}"]
            elif "configMap" in volume:
                args += ["-v", f"{self.config_map(volume['configMap']['name'])}:{path}:ro"]
            elif volume.get("emptyDir", {}).get("medium") == "Memory":
                limit = size(volume["emptyDir"].get("sizeLimit", "64Mi"))
                args += ([f"--shm-size={limit}"] if path == "/dev/shm"
                         else ["--tmpfs", f"{path}:rw,size={limit},mode=1777"])
            elif "emptyDir" in volume:
                args += ["--tmpfs", f"{path}:rw,mode=1777"]
            else:
                raise SystemExit(f"k8s-rehearse: volume {mount['name']} is of a kind this "
                                 f"rehearsal does not make: {sorted(volume)}")
        for path, (folder, read_only) in extra.items():
            args += ["-v", f"{folder}:{path}{':ro' if read_only else ''}"]
        return args

    def config_map(self, name):
        folder = self.workdir / f"configmap-{name}"
        if not folder.exists():
            data = self.config_maps[name]["data"]
            write_volume(folder, {key: (text, 0o644) for key, text in data.items()})
        return folder

    def security_args(self, pod, container, image):
        """The pod's and the container's securityContext as podman options."""
        pod_sc, sc = pod.get("securityContext", {}), container.get("securityContext", {})
        user = sc.get("runAsUser", pod_sc.get("runAsUser"))
        group = sc.get("runAsGroup", pod_sc.get("runAsGroup"))
        args = ["--user", f"{user}:{group}" if group is not None else str(user)] if user is not None else []
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")):
            # The kubelet refuses to start such a container as root.
            effective = user if user is not None else json.loads(
                podman("image", "inspect", image, quiet=True))[0]["Config"].get("User", "0")
            if str(effective).split(":")[0] in ("0", "root", ""):
                raise SystemExit(f"k8s-rehearse: {container['name']} has runAsNonRoot but would "
                                 "run as root")
        if sc.get("privileged"):
            raise SystemExit(f"k8s-rehearse: {container['name']} is privileged; not rehearsed")
        for cap in sc.get("capabilities", {}).get("drop", []):
            args += ["--cap-drop", cap]
        for cap in sc.get("capabilities", {}).get("add", []):
            args += ["--cap-add", cap]
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        seccomp = sc.get("seccompProfile", pod_sc.get("seccompProfile", {})).get("type")
        if seccomp == "Unconfined":
            args += ["--security-opt", "seccomp=unconfined"]  # else podman's default profile
        if sc.get("readOnlyRootFilesystem"):
            args += ["--read-only"]
        return args

    def start(self, name, pod, container=None, env=(), extra_mounts=None, hosts=None,
              hostname=None):
        """Starts one container of a pod spec, detached; returns the container's name.
        hosts: {name: address} that resolve in the container."""
        container = container or pod["containers"][0]
        for var in container.get("env", []):
            if "value" not in var:
                raise SystemExit(f"k8s-rehearse: env {var['name']} is not a plain value")
        environment = self.node_env + [f"{v['name']}={v['value']}"
                                       for v in container.get("env", [])] + list(env)
        command = container.get("command", [])
        words = command[1:] + container.get("args", [])
        args = ["run", "-d", "--name", self.prefix + name, "--label", self.label,
                "--network", self.network, "--ip", self.address(name),
                "--hostname", hostname or name] + self.host_args(hosts or {})
        for var in environment:
            args += ["--env", var]
        args += self.security_args(pod, container, container["image"])
        args += self.volume_args(pod, container, extra_mounts or {})
        if command:
            args += ["--entrypoint", command[0]]
        podman(*args, container["image"], *words)
        return self.prefix + name

    def run_once(self, name, image, command, hosts=None, timeout=120):
        """Runs command in a short-lived container on the network, with the given hosts in its
        /etc/hosts; returns its output."""
        return podman("run", "--rm", "--name", self.prefix + name, "--label", self.label,
                      "--network", self.network, "--ip", self.address(name),
                      *self.host_args(hosts or {}), "--entrypoint", command[0], image,
                      *command[1:], timeout=timeout)

    def wait(self, name, timeout):
        """The container's exit status, once it has stopped (TimeoutError after timeout s)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = exit_status(name)
            if status is not None:
                return status
            time.sleep(1)
        raise TimeoutError(f"{name} still runs after {timeout} s")

    def logs(self, name):
        return container_log(name)

    def running(self):
        return podman("ps", "--filter", f"label={self.label}", "--format", "{{.Names}}",
                      quiet=True).split()

    def stop(self, name, grace):
        podman("stop", "-t", grace, name, timeout=grace + 60)

    def delete(self, grace=60):
        """Stops every container (SIGTERM, SIGKILL after grace s) and removes them and the network."""
        delete_rehearsal(self.prefix, grace)


class MPIJob:
    """An MPIJob's pods, started as the MPI Operator v0.8.2 starts them."""

    def __init__(self, cluster, docs):
        self.cluster = cluster
        self.job = next(d for d in docs if d["kind"] == "MPIJob")
        spec = self.job["spec"]
        self.name = self.job["metadata"]["name"]
        self.slots = spec.get("slotsPerWorker", 1)
        self.replicas = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
        self.launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]
        self.worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
        self.ssh_path = spec["sshAuthMountPath"]
        self.ssh_dir = self.ssh_secret()
        self.workers = [f"{self.name}-worker-{i}" for i in range(self.replicas)]
        self.launcher_name = f"{self.name}-launcher"

    def dns(self, pod_name):
        return f"{pod_name}.{self.name}.{NAMESPACE}.svc"

    def hosts(self):
        """{name: address} of every pod of the job under the names its Service's records give it
        (with and without .cluster.local), as every pod of the job resolves them. Not the bare
        hostnames: the cluster's DNS does not resolve another pod's (its search path does not
        reach the Service's subdomain), so a hostfile using one must fail here too."""
        pods = self.workers + [self.launcher_name]
        address = self.cluster.address
        return {name: address(pod) for pod in pods
                for name in (self.dns(pod), self.dns(pod) + ".cluster.local")}

    def check_hosts(self, hostfile):
        """Stops the rehearsal in seconds, naming them, when hosts of the hostfile do not resolve
        where the launcher will run (its network, its /etc/hosts), where the launcher's entrypoint
        would wait 15 minutes for them (ENTRYPOINT_WAIT_S) before it gives up."""
        names = hostfile_hosts(Path(hostfile).read_text())
        image = self.launcher["containers"][0]["image"]
        script = 'for host; do getent hosts "$host" >/dev/null || echo "$host"; done'
        unresolved = self.cluster.run_once(f"{self.launcher_name}-resolve", image,
                                           ["/bin/sh", "-c", script, "sh", *names],
                                           hosts=self.hosts()).split()
        if unresolved:
            raise SystemExit(
                f"k8s-rehearse: {', '.join(unresolved)} from the hostfile "
                f"{'does' if len(unresolved) == 1 else 'do'} not resolve on the launcher's network "
                f"{self.cluster.network}, so mpirun could not reach it there. The job's "
                f"pods resolve as {', '.join(sorted(self.hosts()))} (/etc/hosts lines from "
                f"--add-host; the rehearsal uses no DNS server). Fix: a hostfile line names a "
                f"worker as the MPI Operator writes it, {self.dns(self.name + '-worker-<i>')}; "
                f"if those names fail too, the image's /etc/nsswitch.conf must look up hosts in "
                f"files.")

    def ssh_secret(self):
        """The operator's Secret <job>-ssh: a new ECDSA P-521 key, PEM, made with the image's
        ssh-keygen (the operator uses Go's crypto; the files are the same formats)."""
        keys = Path(tempfile.mkdtemp(dir=self.cluster.workdir, prefix="key-"))
        keys.chmod(0o777)
        image = self.launcher["containers"][0]["image"]
        podman("run", "--rm", "--user", "0", "-v", f"{keys}:/keys", "--entrypoint", "ssh-keygen",
               image, "-q", "-t", "ecdsa", "-b", "521", "-m", "PEM", "-N", "", "-f", "/keys/id")
        private = (keys / "id").read_text()
        public = " ".join((keys / "id.pub").read_text().split()[:2]) + "\n"  # no comment
        mode = 0o600 if self.ssh_path == "/root/.ssh" else 0o644
        folder = self.cluster.workdir / "secret-ssh"
        write_volume(folder, {"id_rsa": (private, mode), "id_rsa.pub": (public, mode),
                              "authorized_keys": (public, mode)})
        return folder

    def hostfile_dir(self):
        folder = self.cluster.workdir / "configmap-mpi-config"
        if not folder.exists():
            hosts = "".join(f"{self.dns(w)} slots={self.slots}\n" for w in self.workers)
            discover = "#!/bin/sh\n" + "".join(f"echo {self.dns(w)}\n" for w in self.workers)
            write_volume(folder, {"hostfile": (hosts, 0o444), "discover_hosts.sh": (discover, 0o555)})
        return folder

    def start_worker(self, i):
        name = self.workers[i]
        return self.cluster.start(
            name, self.worker, env=["K_MPI_JOB_ROLE=worker"], hostname=name, hosts=self.hosts(),
            extra_mounts={self.ssh_path: (self.ssh_dir, True)})

    def wait_ready(self, timeout=120):
        """Every worker's readiness probe (tcpSocket) answers, as WaitForWorkersReady waits."""
        port = self.worker["containers"][0]["readinessProbe"]["tcpSocket"]["port"]
        deadline = time.monotonic() + timeout
        for name in self.workers:
            container = self.cluster.prefix + name
            probe = ["podman", "exec", container, "bash", "-c",
                     f"exec 3<>/dev/tcp/127.0.0.1/{port}"]
            while subprocess.run(probe, capture_output=True, timeout=30).returncode != 0:
                # A worker that has ended will never be ready: say so now, not at the deadline.
                status = exit_status(container)
                if status is not None:
                    raise RuntimeError(f"worker {name} exited with status {status} before it was "
                                       f"ready:\n{container_log(container)[-3000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {name} is not ready after {timeout} s")
                time.sleep(1)
        log("every worker is ready")

    def start_launcher(self):
        env = ["K_MPI_JOB_ROLE=launcher", "OMPI_MCA_orte_keep_fqdn_hostnames=true",
               "OMPI_MCA_orte_default_hostfile=/etc/mpi/hostfile",
               "OMPI_MCA_plm_rsh_args=-o ConnectionAttempts=10",
               f"OMPI_MCA_orte_set_default_slots={self.slots}",
               "NVIDIA_VISIBLE_DEVICES=", "NVIDIA_DRIVER_CAPABILITIES="]
        hostfile_dir = self.hostfile_dir()
        self.check_hosts(hostfile_dir / "hostfile")
        return self.cluster.start(
            self.launcher_name, self.launcher, env=env, hostname=self.launcher_name,
            hosts=self.hosts(),
            extra_mounts={self.ssh_path: (self.ssh_dir, True), "/etc/mpi": (hostfile_dir, True)})

    def run(self, timeout):
        """Workers, then the launcher; returns (launcher's exit status, its log)."""
        for i in range(self.replicas):
            self.start_worker(i)
        self.wait_ready()
        launcher = self.start_launcher()
        status = self.cluster.wait(launcher, timeout)
        return status, self.cluster.logs(launcher)


def run_job(cluster, docs, timeout):
    """A batch/v1 Job's pod; returns (its exit status, its log)."""
    job = next(d for d in docs if d["kind"] == "Job")
    name = cluster.start(job["metadata"]["name"], job["spec"]["template"]["spec"])
    status = cluster.wait(name, timeout)
    return status, cluster.logs(name)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest", help="the output of scripts/k8s/render.sh")
    parser.add_argument("--claim", action="append", default=[], metavar="NAME=DIR",
                        help="the folder that stands in for a PersistentVolumeClaim")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds the job may run")
    args = parser.parse_args()
    docs = [d for d in yaml.safe_load_all(Path(args.manifest).read_text()) if d]
    claims = dict(c.split("=", 1) for c in args.claim)
    with tempfile.TemporaryDirectory(prefix="k8s-rehearse-") as workdir:
        cluster = Cluster(docs, claims, workdir)
        try:
            if any(d["kind"] == "MPIJob" for d in docs):
                status, output = MPIJob(cluster, docs).run(args.timeout)
            else:
                status, output = run_job(cluster, docs, args.timeout)
            print(output)
        finally:
            cluster.delete()
    return status


if __name__ == "__main__":
    sys.exit(main())
