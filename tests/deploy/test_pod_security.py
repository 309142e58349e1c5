"""Every pod that any target of scripts/k8s/render.sh makes (MPIJob launcher and workers, Jobs,
and whatever is added later) meets the Kubernetes "restricted" Pod Security Standard, so a
namespace labelled pod-security.kubernetes.io/enforce=restricted admits it, and mounts no
service-account token. A pod may instead carry the annotation EXCEPTION naming the one container
that needs more and why; that pod must still meet "baseline", and only that container may break
the restricted rules. The rules are those of kubernetes.io/docs/concepts/security/pod-security-standards
(v1.32): the checks below, and tests that each one catches what it should."""
import copy

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# kubectl, render and rendered are fixtures.
from deploy_support import TARGETS, kubectl, pod_templates, render, rendered  # noqa: E402,F401

EXCEPTION = "resnet-trainer/pod-security-exception"
# Capabilities "baseline" lets a container add (and "restricted" only the last).
BASELINE_CAPS = {"AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD",
                 "NET_BIND_SERVICE", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT"}
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}


def all_containers(pod):
    return [*pod.get("initContainers", []), *pod["containers"], *pod.get("ephemeralContainers", [])]


def baseline_violations(pod):
    """(container or None for the pod, rule) pairs that break "baseline"."""
    found = []
    context = pod.get("securityContext", {})
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            found.append((None, f"{field} is true"))
    for volume in pod.get("volumes", []):
        if "hostPath" in volume:
            found.append((None, f"volume {volume['name']} is a hostPath"))
    for sysctl in context.get("sysctls", []):
        if sysctl["name"] not in SAFE_SYSCTLS:
            found.append((None, f"sysctl {sysctl['name']} is not a safe one"))
    for c in all_containers(pod):
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            found.append((c["name"], "privileged"))
        added = set(sc.get("capabilities", {}).get("add", [])) - BASELINE_CAPS
        if added:
            found.append((c["name"], f"adds capabilities {sorted(added)}"))
        if any(p.get("hostPort") for p in c.get("ports", [])):
            found.append((c["name"], "uses a hostPort"))
        if sc.get("procMount", "Default") != "Default":
            found.append((c["name"], "procMount is not Default"))
        for level in (context, sc):
            if level.get("seccompProfile", {}).get("type") == "Unconfined":
                found.append((c["name"], "seccomp is Unconfined"))
            if level.get("appArmorProfile", {}).get("type") == "Unconfined":
                found.append((c["name"], "AppArmor is Unconfined"))
    return found


def restricted_violations(pod):
    """Baseline's, and the pairs that break "restricted" on top of it (and our own rule: no
    service-account token, since no pod here calls the Kubernetes API)."""
    found = baseline_violations(pod)
    context = pod.get("securityContext", {})
    if pod.get("automountServiceAccountToken") is not False:
        found.append((None, "automountServiceAccountToken is not false"))
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.append((None, f"volume {volume['name']} is of kind {sorted(kinds)}"))
    if context.get("runAsUser") == 0:
        found.append((None, "runAsUser is 0"))
    for c in all_containers(pod):
        sc = c.get("securityContext", {})
        # A container's own setting wins over the pod's.
        if not sc.get("runAsNonRoot", context.get("runAsNonRoot")):
            found.append((c["name"], "runAsNonRoot is not true"))
        if sc.get("runAsUser") == 0:
            found.append((c["name"], "runAsUser is 0"))
        seccomp = sc.get("seccompProfile", context.get("seccompProfile", {})).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            found.append((c["name"], f"seccompProfile is {seccomp}, not RuntimeDefault"))
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append((c["name"], "allowPrivilegeEscalation is not false"))
        capabilities = sc.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append((c["name"], "capabilities do not drop ALL"))
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append((c["name"], f"adds capabilities {capabilities['add']}"))
    return found


def pods(target, rendered):
    return [(path, meta, spec) for doc in rendered(target) for path, meta, spec in pod_templates(doc)]


def test_the_targets_come_from_the_renderer():
    # The MPIJobs and the Jobs at least; whatever else scripts/k8s/render.sh lists is checked as well.
    assert {"p3.16xlarge", "p3dn.24xlarge", "one-node", "smoke", "stage-data"} <= set(TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_every_pod_meets_the_restricted_standard(target, rendered):
    for path, meta, pod in pods(target, rendered):
        found = restricted_violations(pod)
        exception = meta.get("annotations", {}).get(EXCEPTION)
        if exception:
            # "<container> <why>": only that container may break restricted, and only so far
            # that the pod still meets baseline.
            container = exception.split()[0]
            assert container in {c["name"] for c in all_containers(pod)}, (
                f"{target} {path}: {EXCEPTION} names no container of the pod: {exception}")
            assert not baseline_violations(pod), f"{target} {path}: {baseline_violations(pod)}"
            found = [(c, rule) for c, rule in found if c != container]
        assert not found, f"{target} {path} breaks the restricted standard: {found}"


def test_only_the_data_staging_pod_is_an_exception(rendered):
    excepted = [(target, path) for target in TARGETS for path, meta, _ in pods(target, rendered)
                if EXCEPTION in meta.get("annotations", {})]
    assert excepted == [("stage-data", "spec.template")]


def test_the_training_pods_are_all_checked(rendered):
    counts = {target: len(pods(target, rendered)) for target in TARGETS}
    assert counts["p3.16xlarge"] == counts["p3dn.24xlarge"] == 2  # launcher and workers
    assert counts["one-node"] == counts["smoke"] == counts["stage-data"] == 1


def a_worker(rendered):
    _, _, pod = next(p for p in pods("p3.16xlarge", rendered) if "Worker" in p[0])
    assert not restricted_violations(pod)
    return copy.deepcopy(pod)


@pytest.mark.parametrize("rule,change", [
    ("allowPrivilegeEscalation", lambda p: p["containers"][0]["securityContext"].pop(
        "allowPrivilegeEscalation")),
    ("drop ALL", lambda p: p["containers"][0]["securityContext"]["capabilities"].update(drop=[])),
    ("adds capabilities", lambda p: p["containers"][0]["securityContext"]["capabilities"].update(
        add=["IPC_LOCK"])),
    ("runAsNonRoot", lambda p: p["securityContext"].pop("runAsNonRoot")),
    ("runAsUser is 0", lambda p: p["containers"][0]["securityContext"].update(runAsUser=0)),
    ("seccompProfile", lambda p: p["securityContext"].pop("seccompProfile")),
    ("hostPath", lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}})),
    ("hostNetwork", lambda p: p.update(hostNetwork=True)),
    ("privileged", lambda p: p["containers"][0]["securityContext"].update(privileged=True)),
    ("hostPort", lambda p: p["containers"][0].update(ports=[{"containerPort": 2222,
                                                             "hostPort": 2222}])),
    ("automountServiceAccountToken", lambda p: p.pop("automountServiceAccountToken")),
])
def test_each_rule_catches_its_violation(rendered, rule, change):
    pod = a_worker(rendered)
    change(pod)
    assert any(rule in message for _, message in restricted_violations(pod))


def test_baseline_catches_what_the_exception_may_not_do(rendered):
    pod = a_worker(rendered)
    pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["SYS_ADMIN"]
    assert baseline_violations(pod)
    pod = a_worker(rendered)
    pod["containers"][0]["securityContext"]["capabilities"]["add"] = ["CHOWN"]
    assert not baseline_violations(pod) and restricted_violations(pod)
