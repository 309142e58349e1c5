"""k8s/ agrees with itself, with configs/ and with the build: -np = workers x slots, GPUs per
worker = slots, the network settings of each instance type, the config each target names exists
and its data and output paths sit on the mounted volumes, and every command names a binary the
build produces (or a script the image installs)."""
import json
import re

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# kubectl, render and rendered are fixtures.
from deploy_support import (EFA_INTERFACES, MPIJOB_TARGETS, PYTORCHJOB_TARGETS, ROOT,  # noqa: E402,F401
                            containers, executables, job_kind, kubectl, read_config, render,
                            rendered)

BIN = "/opt/resnet-trainer/bin/"
# The targets that run the trainer, and the kustomization that names each one's config.
TRAINING = {**{target: f"k8s/overlays/{target}" for target in MPIJOB_TARGETS},
            **{target: f"k8s/pytorchjob/{target.split('-', 1)[1]}" for target in PYTORCHJOB_TARGETS},
            "one-node": "k8s/jobs/one-node", "smoke": "k8s/jobs/smoke"}
# Variables the seeds' launch lines set, per instance type (AWS's P3 and P3dn posts).
NETWORK = {
    "p3.16xlarge": ["NCCL_SOCKET_IFNAME=eth0", "NCCL_NSOCKS_PERTHREAD=4", "NCCL_SOCKET_NTHREADS=4"],
    "p3dn.24xlarge": ["FI_PROVIDER=efa", "FI_EFA_TX_MIN_CREDITS=64", "NCCL_SOCKET_IFNAME=eth0"],
    # aws-ofi-nccl v1.21's doc/efa-env-var.md: the plugin sets the rest itself on p4d and p5.
    "p4d.24xlarge": ["FI_PROVIDER=efa", "NCCL_SOCKET_IFNAME=eth0", "FI_EFA_USE_HUGE_PAGE=0"],
    "p5.48xlarge": ["FI_PROVIDER=efa", "NCCL_SOCKET_IFNAME=eth0", "FI_EFA_USE_HUGE_PAGE=0"],
}


def the(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def words(container):
    return container.get("command", []) + container.get("args", [])


def mpirun_np(container):
    """-np of an `entrypoint mpirun ...` container, and the words after mpirun."""
    w = words(container)
    assert "mpirun" in w, f"{container['name']} runs no mpirun: {w}"
    args = w[w.index("mpirun") + 1:]
    assert "-np" in args, f"mpirun without -np: {args}"
    return int(args[args.index("-np") + 1]), args


def gpus(container):
    return int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def runs_train(container):
    w = words(container)
    return BIN + "train" in w or (w[:1] == [BIN + "entrypoint"] and w[1:2] == ["train"])


@pytest.mark.parametrize("workers", [None, 3, 20])
@pytest.mark.parametrize("target", MPIJOB_TARGETS)
def test_np_is_workers_times_slots(target, workers, render, rendered):
    docs = rendered(target) if workers is None else render(target, "--workers", str(workers))
    job = the(docs, "MPIJob")
    spec = job["spec"]
    replicas = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    if workers is not None:
        assert replicas == workers
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    np, _ = mpirun_np(launcher)
    assert np == replicas * spec["slotsPerWorker"]


@pytest.mark.parametrize("target", MPIJOB_TARGETS)
def test_gpus_per_worker_equal_slots(target, rendered):
    spec = the(rendered(target), "MPIJob")["spec"]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert gpus(worker) == spec["slotsPerWorker"] == 8


@pytest.mark.parametrize("target", MPIJOB_TARGETS)
def test_mpijob_policies(target, rendered):
    spec = the(rendered(target), "MPIJob")["spec"]
    assert spec["launcherCreationPolicy"] == "WaitForWorkersReady"
    assert spec["runPolicy"]["cleanPodPolicy"] == "Running"
    assert spec["runPolicy"]["backoffLimit"] >= 1
    # The image's user keeps its SSH setup there (docker/configure-ssh.sh).
    assert spec["sshAuthMountPath"] == "/home/mpiuser/.ssh"
    ssh = (ROOT / "docker" / "configure-ssh.sh").read_text()
    assert "HostKey $home/.ssh/id_rsa" in ssh
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]
    assert worker["containers"][0]["readinessProbe"]["tcpSocket"]["port"] == 2222
    assert worker["nodeSelector"]["node.kubernetes.io/instance-type"] == target


@pytest.mark.parametrize("target", MPIJOB_TARGETS + ["one-node"])
def test_mpirun_binds_to_socket_and_maps_by_slot(target, rendered):
    launchers = [c for _, _, c in containers(the(rendered(target), job_kind(target)))
                 if "mpirun" in words(c)]
    assert launchers
    for c in launchers:
        _, args = mpirun_np(c)
        line = " ".join(args)
        assert "--bind-to socket" in line and "--map-by slot" in line
        assert "-x NCCL_DEBUG=INFO" in line  # logs which transport NCCL uses


@pytest.mark.parametrize("target", MPIJOB_TARGETS + ["one-node"])
def test_ranks_get_time_to_checkpoint_before_sigkill(target, rendered):
    """mpirun's daemons stop the ranks with SIGCONT, SIGTERM and SIGKILL, odls_base_sigkill_timeout
    seconds apart (OpenMPI 4's odls; the default of 1 s is too short for a checkpoint); the pods'
    grace period must outlast both steps, and a job that lost a worker must end within a minute."""
    for _, pod, c in containers(the(rendered(target), job_kind(target))):
        if "mpirun" in words(c):
            _, args = mpirun_np(c)
            timeout = int(args[args.index("odls_base_sigkill_timeout") + 1])
            assert 15 <= timeout and 2 * timeout <= 45
    pods = [pod for _, pod, _ in containers(the(rendered(target), job_kind(target)))]
    for pod in pods:
        assert pod.get("terminationGracePeriodSeconds", 30) > 2 * timeout


@pytest.mark.parametrize("target", MPIJOB_TARGETS)
def test_network_settings_of_the_instance_type(target, rendered):
    spec = the(rendered(target), "MPIJob")["spec"]
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    _, args = mpirun_np(launcher)
    exported = [args[i + 1] for i, a in enumerate(args) if a == "-x"]
    for setting in NETWORK[target]:
        assert setting in exported, f"mpirun does not pass -x {setting}"
    assert "LD_LIBRARY_PATH" in exported  # the EFA plugin's folder reaches the ranks
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    efa = int(worker["resources"]["limits"].get("vpc.amazonaws.com/efa", 0))
    assert efa == EFA_INTERFACES[target]
    if target == "p3.16xlarge":
        assert not any(a.startswith("FI_") for a in exported)


def test_one_node_job_runs_one_rank_per_gpu(rendered):
    job = the(rendered("one-node"), "Job")
    (_, _, trainer), = containers(job)
    np, _ = mpirun_np(trainer)
    assert np == gpus(trainer) == 8


def test_smoke_job_uses_one_gpu_without_mpirun(rendered):
    (_, _, trainer), = containers(the(rendered("smoke"), "Job"))
    assert gpus(trainer) == 1
    assert "mpirun" not in words(trainer) and runs_train(trainer)


def train_pods(target, docs):
    """(pod spec, container) where `train` itself runs: an MPIJob's or PyTorchJob's workers, a
    Job's pod."""
    for role, pod, c in containers(the(docs, job_kind(target))):
        if role == "Worker" or (role == "Job" and runs_train(c)):
            yield pod, c


@pytest.mark.parametrize("target", TRAINING)
def test_shm_is_an_in_memory_empty_dir(target, rendered):
    for pod, c in train_pods(target, rendered(target)):
        volumes = {v["name"]: v for v in pod["volumes"]}
        shm = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert shm, f"{c['name']} does not mount /dev/shm"
        assert volumes[shm[0]["name"]]["emptyDir"]["medium"] == "Memory"


def config_file(target):
    """The configs/ file the target's kustomization names for trainer-config."""
    kustomization = yaml.safe_load((ROOT / TRAINING[target] / "kustomization.yaml").read_text())
    generator, = [g for g in kustomization["configMapGenerator"] if g["name"] == "trainer-config"]
    entry, = generator["files"]
    key, _, path = entry.partition("=")
    assert key == "trainer.toml"
    path = (ROOT / TRAINING[target] / path).resolve()
    assert path.parent == ROOT / "configs", f"{target} takes its config from outside configs/"
    return path


@pytest.mark.parametrize("target", TRAINING)
def test_config_named_exists_in_configs_and_is_the_one_mounted(target, rendered):
    path = config_file(target)
    assert path.is_file(), f"{target} names {path.relative_to(ROOT)}, which does not exist"
    config_maps = [d for d in rendered(target) if d["kind"] == "ConfigMap"
                   and d["metadata"]["name"].startswith("trainer-config")]
    assert len(config_maps) == 1
    assert config_maps[0]["data"]["trainer.toml"] == path.read_text()


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def train_command(target, docs):
    """The words from `train` on, in the container that launches it (an MPIJob's launcher)."""
    for _, _, c in containers(the(docs, job_kind(target))):
        if runs_train(c):
            w = words(c)
            return w[w.index(BIN + "train") if BIN + "train" in w else w.index("train"):]
    raise AssertionError(f"no container of {target} runs train")


def effective_config(target, docs):
    """The mounted trainer.toml with the command line's `--key value` overrides applied."""
    config = read_config(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["trainer.toml"])
    command = train_command(target, docs)
    for i, word in enumerate(command[:-1]):
        if word.startswith("--") and word != "--config":
            config[word[2:]] = command[i + 1]
    return config


@pytest.mark.parametrize("target", TRAINING)
def test_config_paths_sit_under_the_mounted_volumes(target, rendered):
    docs = rendered(target)
    config = effective_config(target, docs)
    command = train_command(target, docs)
    for pod, c in train_pods(target, docs):
        mounts = c["volumeMounts"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        # --config points at the trainer-config volume.
        config_mount = [m for m in mounts
                        if volumes[m["name"]].get("configMap", {}).get("name", "")
                        .startswith("trainer-config")]
        assert config_mount, f"{target} does not mount trainer-config where train runs"
        assert command[command.index("--config") + 1] == config_mount[0]["mountPath"] + "/trainer.toml"
        read_only = [m["mountPath"] for m in mounts if m.get("readOnly")]
        writable = [m["mountPath"] for m in mounts if not m.get("readOnly")
                    and "persistentVolumeClaim" in volumes[m["name"]]]
        # Generated and synthetic data read no files.
        if config.get("data_source") not in ("synthetic", "generated"):
            for key in ("train_data", "val_data"):
                assert key in config, f"{target} reads {config.get('data_source')} data, no {key}"
                assert any(under(config[key], m) for m in read_only), (
                    f"{key} = {config[key]} is not under a read-only mount of {target}: "
                    f"{read_only}")
        assert "output_dir" in config, f"{target}'s config sets no output_dir"
        assert any(under(config["output_dir"], m) for m in writable), (
            f"output_dir = {config['output_dir']} is not on the writable volume: {writable}")


@pytest.mark.parametrize("target", MPIJOB_TARGETS + PYTORCHJOB_TARGETS + ["one-node"])
def test_training_resumes_from_the_newest_checkpoint(target, rendered):
    # train's default is auto: a config that sets no resume resumes too.
    assert effective_config(target, rendered(target)).get("resume", "auto") == "auto"


@pytest.mark.parametrize("target", TRAINING)
def test_no_command_passes_resume(target, rendered):
    # A flag wins over the config file: `--resume` here would silently override the config's
    # `resume = FILE`. Without it the config's value holds, and its default (auto) resumes.
    command = train_command(target, rendered(target))
    assert not any(w == "--resume" or w.startswith("--resume=") for w in command), (
        f"{target} passes resume on the command line: {command}")


def image_scripts():
    """Names the Dockerfile installs into the image's bin/ from docker/ (entrypoint, ...)."""
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    return set(re.findall(r"^COPY\s+docker/\S+\s+" + re.escape(BIN) + r"(\S+)$", dockerfile, re.M))


@pytest.mark.parametrize("target", MPIJOB_TARGETS + PYTORCHJOB_TARGETS + ["one-node", "smoke",
                                                                        "stage-data"])
def test_commands_name_binaries_the_build_produces(target, rendered):
    built = executables()
    ours = built | image_scripts()
    assert "train" in built
    runs = []
    for _, _, c in [x for d in rendered(target) for x in containers(d)]:
        w = words(c)
        for word in w:
            if word.startswith(BIN):
                assert word[len(BIN):] in ours, f"{c['name']} runs {word}: not built nor installed"
        if w[:1] == [BIN + "entrypoint"]:
            program = w[1]
            # What the entrypoint runs: ours by bare name, or a launcher the image installs
            # (mpirun, torchrun), or a system program by path (sshd).
            launcher = program in ("mpirun", "torchrun")
            assert launcher or program.startswith("/") or program in ours, (
                f"{c['name']}: the entrypoint would run {program}, which the build does not make")
            runs.append(program)
    assert runs, f"no container of {target} uses the image's entrypoint"
    if target in TRAINING:
        assert any(runs_train(c) for d in rendered(target) for _, _, c in containers(d))


def test_image_entrypoint_and_default_command_are_built():
    built = executables()
    dockerfile = (ROOT / "docker" / "Dockerfile").read_text()
    entrypoint = json.loads(re.search(r"^ENTRYPOINT\s+(\[.*\])$", dockerfile, re.M).group(1))
    assert entrypoint == [BIN + "entrypoint"] and "entrypoint" in image_scripts()
    cmd = json.loads(re.search(r"^CMD\s+(\[.*\])$", dockerfile, re.M).group(1))
    assert cmd[0] in built
    # The programs the entrypoint falls back to (`set -- train ...`) are built too.
    defaults = re.findall(r"set -- ([\w-]+) ", (ROOT / "docker" / "entrypoint.sh").read_text())
    assert defaults and set(defaults) <= built


# --- the file system: a new one (fsx) or an existing one (fsx-existing), and what the pods see --

EXISTING = {"FSX_FILE_SYSTEM_ID": "fs-0123456789abcdef0",
            "FSX_DNS_NAME": "fs-0123456789abcdef0.fsx.us-west-2.amazonaws.com",
            # All digits, as a mount name may be: it must stay a string.
            "FSX_MOUNT_NAME": "20480512"}


def test_an_existing_file_system_is_kept_and_the_claim_binds_to_it(render):
    docs = render("fsx-existing", env=EXISTING)
    volume, claim = the(docs, "PersistentVolume"), the(docs, "PersistentVolumeClaim")
    # Static provisioning as the FSx CSI driver documents it, and Retain: nothing that deletes the
    # claim or the volume object deletes the file system.
    assert volume["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert volume["spec"]["csi"] == {
        "driver": "fsx.csi.aws.com", "volumeHandle": EXISTING["FSX_FILE_SYSTEM_ID"],
        "volumeAttributes": {"dnsname": EXISTING["FSX_DNS_NAME"],
                             "mountname": EXISTING["FSX_MOUNT_NAME"]}}
    # The claim every pod mounts, bound to this volume by name, with no StorageClass that could
    # provision another file system for it.
    assert claim["metadata"]["name"] == "fsx-claim"
    assert claim["spec"]["volumeName"] == volume["metadata"]["name"]
    assert claim["spec"]["storageClassName"] == volume["spec"]["storageClassName"] == ""
    assert claim["spec"]["accessModes"] == volume["spec"]["accessModes"] == ["ReadWriteMany"]
    requested = claim["spec"]["resources"]["requests"]["storage"]
    assert requested == volume["spec"]["capacity"]["storage"]
    # The same claim name and mount options as the file system the fsx target makes.
    new = render("fsx")
    assert the(new, "PersistentVolumeClaim")["metadata"]["name"] == "fsx-claim"
    assert volume["spec"]["mountOptions"] == the(new, "StorageClass")["mountOptions"]


def test_an_existing_file_system_unset_renders_placeholders(rendered):
    volume = the(rendered("fsx-existing"), "PersistentVolume")
    assert "REPLACE-ME" in volume["spec"]["csi"]["volumeHandle"]
    assert set(volume["spec"]["csi"]["volumeAttributes"].values()) == {"REPLACE-ME"}


@pytest.mark.parametrize("env,exported_to", [
    ({"FSX_S3_IMPORT_PATH": "s3://my-bucket"}, "s3://my-bucket"),
    ({"FSX_S3_IMPORT_PATH": "s3://my-bucket/imagenet-2012"}, "s3://my-bucket"),
    ({"FSX_S3_IMPORT_PATH": "s3://my-bucket", "FSX_S3_EXPORT_PATH": "s3://my-bucket/exports"},
     "s3://my-bucket/exports"),
])
def test_a_new_file_system_is_scratch_that_exports_to_its_import_bucket(render, env,
                                                                         exported_to):
    # Deleting the claim deletes the file system: what is kept must go to S3, and FSx exports
    # only to the bucket it imports from (by default its root: /fsx/runs/RUN -> s3://B/runs/RUN).
    storage_class = the(render("fsx", env=env), "StorageClass")
    assert storage_class["reclaimPolicy"] == "Delete"
    assert storage_class["parameters"]["deploymentType"] == "SCRATCH_2"
    # Not the 2.10 FSx picks when none is named: AL2023's kernels want a current server.
    assert storage_class["parameters"]["fileSystemTypeVersion"] == "2.15"
    assert storage_class["parameters"]["s3ImportPath"] == env["FSX_S3_IMPORT_PATH"]
    assert storage_class["parameters"]["s3ExportPath"] == exported_to


def pretrained_paths():
    """The /fsx/weights files docs/pretrained.md passes to init_weights."""
    paths = set(re.findall(r"/fsx/weights/[\w.-]+", (ROOT / "docs" / "pretrained.md").read_text()))
    assert paths, "docs/pretrained.md names no file under /fsx/weights"
    return paths


@pytest.mark.parametrize("target", TRAINING)
def test_weights_are_mounted_where_the_docs_put_them(target, rendered):
    # init_weights reads /fsx/weights/... in docs/pretrained.md: every pod where train runs sees
    # that folder, read-only, from the claim's weights/ (the bucket's weights/ prefix).
    for pod, c in train_pods(target, rendered(target)):
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = [m for m in c["volumeMounts"] if m["mountPath"] == "/fsx/weights"]
        assert len(mounts) == 1, f"{target}: {c['name']} does not mount /fsx/weights"
        mount, = mounts
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == "fsx-claim"
        assert mount.get("subPath") == "weights" and mount.get("readOnly") is True
        for path in pretrained_paths():
            assert under(path, mount["mountPath"])
