"""docs/eks.md's own commands: every block parses and names scripts that exist, the eksctl cluster
config it writes (add-ons, node groups, the GPU nodes' AMI release pinned), and every target it
applies renders and finds nodes by the time it is applied."""
import os
import re
import subprocess

import pytest
from deploy_support import (ROOT, kubectl, pod_templates, render,  # noqa: F401 (fixtures)
                            rendered)

GUIDE = ROOT / "docs" / "eks.md"


def guide_blocks():
    return re.findall(r"```bash\n(.*?)```", GUIDE.read_text(), re.S)


def test_every_command_block_of_the_guide_parses_and_names_scripts_that_exist():
    blocks = guide_blocks()
    assert len(blocks) >= 10
    for block in blocks:
        check = subprocess.run(["bash", "-n"], input=block, capture_output=True, text=True)
        assert check.returncode == 0, f"{check.stderr}\nin:\n{block}"
    for script in set(re.findall(r"scripts/[\w.-]+\.(?:sh|py)", GUIDE.read_text())):
        assert os.access(ROOT / script, os.X_OK), f"docs/eks.md names {script}, not an executable"


def test_every_chart_and_manifest_the_guide_installs_is_pinned():
    # A release chosen and read (aws/eks-charts' aws-efa-k8s-device-plugin v0.5.30 lists p3dn,
    # p4d and p5 among the instance types it runs on), not whatever is newest on the day.
    text = "\n".join(guide_blocks())
    installs = re.findall(r"^helm (?:install|upgrade)[^\n]*", text, re.M)
    assert installs and all(re.search(r"--version v?\d+\.\d+\.\d+", i) for i in installs), installs
    urls = re.findall(r"https://(?:raw\.githubusercontent\.com/|github\.com/\S+/releases/)\S+",
                      text)
    assert urls and all(re.search(r"/v\d+\.\d+\.\d+/", u) for u in urls), urls
    assert any("/releases/download/" in u for u in urls), "Kueue's release manifests"


AMI_RELEASE = "1.35.2-20260714"  # what the guide's SSM query would return, for the heredoc


# The variables as a user would set them, for the guide's heredocs.
VALUES = {"CLUSTER": "resnet", "AWS_REGION": "us-west-2", "EKS_VERSION": "1.35", "AZ": "us-west-2b",
          "AZ2": "us-west-2c", "AMI_RELEASE": AMI_RELEASE, "RESERVATION_ID": "cr-0123456789abcdef0"}
HEREDOC = re.compile(r"cat > ([\w.-]+\.yaml) <<EOF\n(.*?)\nEOF", re.S)


def guide_configs():
    """Every eksctl ClusterConfig the guide writes, in order: (file, where it starts, config)."""
    yaml = pytest.importorskip("yaml")
    out = []
    for match in HEREDOC.finditer(GUIDE.read_text()):
        text = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: VALUES[m.group(1) or m.group(2)],
                      match.group(2))
        config = yaml.safe_load(text)
        if config.get("kind") == "ClusterConfig":
            out.append((match.group(1), match.start(), config))
    return out


def guide_cluster():
    """The eksctl ClusterConfig that makes the cluster (cluster.yaml)."""
    return next(config for name, _, config in guide_configs() if name == "cluster.yaml")


def eksctl_refuses(group):
    """What eksctl's validation (pkg/apis/eksctl.io/v1alpha5/validation.go, v0.230) refuses in a
    node group, among the rules the guide's groups come near."""
    problems = []
    if group.get("efaEnabled") and len(group.get("availabilityZones", [])) != 1:
        problems.append("efaEnabled nodegroups must have only one subnet or one availability zone")
    if "ami" in group and "releaseVersion" in group:
        problems.append("releaseVersion is not supported with a custom AMI")
    market = group.get("instanceMarketOptions")
    if market and market.get("marketType") != "capacity-block":
        problems.append('instanceMarketOptions.marketType: only accepted value is "capacity-block"')
    if market and "capacityReservation" not in group:
        problems.append("instanceMarketOptions cannot be set without capacityReservation")
    reservation = group.get("capacityReservation", {})
    if "capacityReservationPreference" in reservation and "capacityReservationTarget" in reservation:
        problems.append("capacityReservationPreference and capacityReservationTarget together")
    return problems


def test_every_node_group_of_the_guide_passes_eksctls_rules():
    groups = [(name, g) for name, _, config in guide_configs()
              for g in config.get("managedNodeGroups", []) + config.get("nodeGroups", [])]
    assert len(groups) >= 4
    assert [(name, g["name"], p) for name, g in groups for p in eksctl_refuses(g)] == []


def test_the_p4d_and_p5_node_group_takes_its_reservation_on_private_subnets_with_every_efa_card():
    # Several network cards: no public IPv4 address (private subnets), an EFA interface on each
    # (efaEnabled), in the reservation's one zone; the AMI release pinned as the cluster's GPU
    # nodes', and the group in the same cluster.
    (name, _, config), = [c for c in guide_configs() if c[0] != "cluster.yaml"]
    assert config["metadata"] == {"name": VALUES["CLUSTER"], "region": VALUES["AWS_REGION"]}
    (group,) = config["managedNodeGroups"]
    assert group["instanceType"] in ("p4d.24xlarge", "p5.48xlarge")
    assert group["privateNetworking"] and group["efaEnabled"]
    assert group["availabilityZones"] == [VALUES["AZ"]]
    assert group["releaseVersion"] == AMI_RELEASE
    target = group["capacityReservation"]["capacityReservationTarget"]
    assert target == {"capacityReservationID": VALUES["RESERVATION_ID"]}
    text = GUIDE.read_text()
    assert f"eksctl create nodegroup --config-file {name}" in text


def test_the_cluster_config_installs_the_pod_identity_agent():
    # The FSx CSI add-on (step 3) is degraded without it.
    assert {"name": "eks-pod-identity-agent"} in guide_cluster().get("addons", [])


def test_the_gpu_node_groups_run_one_pinned_nvidia_ami_release():
    # A node scaled out or replaced later gets the driver the cluster was made with (for V100 the
    # 580 branch at most): the release of the Amazon Linux 2023 NVIDIA AMI recommended for the
    # cluster's version when the guide ran, read before the config is written.
    text = GUIDE.read_text()
    export = re.search(r"export AMI_RELEASE=\$\(aws ssm get-parameter (.*?)\)\n", text, re.S)
    assert export and export.start() < text.index("cat > cluster.yaml"), "AMI_RELEASE set first"
    assert ("--name /aws/service/eks/optimized-ami/$EKS_VERSION/amazon-linux-2023/x86_64/nvidia/"
            "recommended/release_version" in export.group(1))
    assert "--query Parameter.Value --output text" in export.group(1)
    groups = guide_cluster()["managedNodeGroups"]
    gpu_groups = [g for g in groups if g["instanceType"].split(".")[0] in ("p3", "p3dn")]
    assert gpu_groups and all(g.get("releaseVersion") == AMI_RELEASE for g in gpu_groups)
    # eksctl refuses releaseVersion beside a custom AMI (its validation's "notSupportedWithCustomAMI").
    assert not any("ami" in g for g in groups)


def test_every_node_group_a_launch_needs_has_nodes_by_then(rendered):
    # No autoscaler is installed: a pod that selects an instance type runs only if that type's
    # node group was created with nodes, or scaled up by an earlier step of the guide.
    text = GUIDE.read_text()
    for match in re.finditer(r"scripts/k8s/apply\.sh ([\w.-]+)", text):
        target = match.group(1)
        groups = {g["instanceType"]: g for _, start, config in guide_configs()
                  if start < match.start() for g in config["managedNodeGroups"]}
        for doc in rendered(target):
            for _, _, pod in pod_templates(doc):
                wanted = pod.get("nodeSelector", {}).get("node.kubernetes.io/instance-type")
                if not wanted:
                    continue
                assert wanted in groups, f"{target} selects {wanted}: no node group has it"
                group = groups[wanted]
                scaled = re.search(rf"eksctl scale nodegroup [^\n]*--name {group['name']} "
                                   rf"[^\n]*--nodes [1-9]", text[:match.start()])
                assert group.get("desiredCapacity", 0) > 0 or scaled, (
                    f"{target} needs {wanted} nodes, but node group {group['name']} starts with "
                    f"{group.get('desiredCapacity', 0)} and no step before it scales it up")


def test_every_target_the_guide_applies_renders_with_the_guide_arguments(render):
    for line in re.findall(r"^scripts/k8s/apply\.sh ([^&#\n]*)", GUIDE.read_text(), re.M):
        target, *options = line.replace("$IMAGE", "r.example/resnet-trainer:t").split()
        assert render(target, *options), line
