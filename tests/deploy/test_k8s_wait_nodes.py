"""scripts/k8s/wait_nodes.sh, the guide's wait after `eksctl scale nodegroup --wait`, against a
recorded kubectl (tests/deploy/eks_fakes.py)."""
from deploy_support import kubectl  # noqa: F401 (a fixture)
from eks_fakes import tools  # noqa: F401 (a fixture)


def nodes(*statuses):
    """`kubectl get nodes --no-headers` as it prints them: NAME STATUS ROLES AGE VERSION."""
    return "\n".join(f"ip-10-0-1-{i}.us-west-2.compute.internal   {s}   <none>   {40 + i}s   "
                     "v1.35.2-eks-a1b2c3d" for i, s in enumerate(statuses))


GET_NODES = ["get", "nodes", "node.kubernetes.io/instance-type=p3dn.24xlarge", "--no-headers"]


def test_wait_nodes_waits_for_nodes_not_yet_registered(tools):
    # The first look finds none (kubectl says so on stderr, exit 0); later ones find both Ready.
    answers = [{"tool": "kubectl", "call": GET_NODES, "before": "kubectl get nodes",
                "stderr": "No resources found\n"},
               {"tool": "kubectl", "call": GET_NODES, "text": nodes("Ready", "Ready")}]
    code, out, calls = tools("scripts/k8s/wait_nodes.sh", answers, "p3dn.24xlarge", "2", POLL_S="0.1")
    assert code == 0 and "2 p3dn.24xlarge node(s) Ready" in out, out
    assert len(calls) == 2


def test_wait_nodes_counts_neither_not_ready_nor_cordoned_nodes(tools):
    # A deadline of 3 s: bash's SECONDS counts whole seconds from the shell's start, so a 1 s one
    # can pass before the second look on any machine.
    answers = [{"tool": "kubectl", "call": GET_NODES,
                "text": nodes("Ready", "NotReady", "Ready,SchedulingDisabled")}]
    code, out, calls = tools("scripts/k8s/wait_nodes.sh", answers, "p3dn.24xlarge", "2", "3",
                             POLL_S="0.2")
    assert code == 1, out
    assert "1 of 2 p3dn.24xlarge node(s) Ready after 3 s" in out and "Fix:" in out
    assert len(calls) >= 2  # it looked again before giving up


def test_wait_nodes_refuses_a_bad_count(tools):
    code, out, calls = tools("scripts/k8s/wait_nodes.sh", [], "p3dn.24xlarge", "two")
    assert code == 2 and "COUNT must be a positive whole number" in out and calls == []
