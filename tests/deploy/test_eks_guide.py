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


AMI_RELEASE = "1.35.2-20260714"  # what the guide's SSM query would return, for the heredoc


def guide_cluster():
    """The eksctl ClusterConfig the guide writes (its heredoc, variables as a user would set)."""
    yaml = pytest.importorskip("yaml")
    heredoc = re.search(r"cat > cluster\.yaml <<EOF\n(.*?)\nEOF", GUIDE.read_text(), re.S).group(1)
    values = {"CLUSTER": "resnet", "AWS_REGION": "us-west-2", "EKS_VERSION": "1.35",
              "AZ": "us-west-2b", "AZ2": "us-west-2c", "AMI_RELEASE": AMI_RELEASE}
    return yaml.safe_load(re.sub(r"\$\{?(\w+)\}?", lambda m: values[m.group(1)], heredoc))


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
    groups = {g["instanceType"]: g for g in guide_cluster()["managedNodeGroups"]}
    text = GUIDE.read_text()
    for match in re.finditer(r"scripts/k8s-apply\.sh ([\w.-]+)", text):
        target = match.group(1)
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
    for line in re.findall(r"^scripts/k8s-apply\.sh ([^&#\n]*)", GUIDE.read_text(), re.M):
        target, *options = line.replace("$IMAGE", "r.example/resnet-trainer:t").split()
        assert render(target, *options), line
