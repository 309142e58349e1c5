"""Gang admission with Kueue (k8s/kueue, docs/eks.md step 2): the queue's objects valid against
Kueue v0.19.2's CRDs, its quota equal to the guide's node groups, every MPIJob in its queue, and
each MPIJob target admitted whole, or not at all, by Kueue's rules of flavor assignment
(pkg/scheduler/flavorassigner/flavorassigner.go at v0.19.2), as emulated by `admit` below:

- a workload is the MPIJob's pod sets, Launcher then Worker (pkg/controller/jobs/mpijob), or the
  TrainJob's one, `node` (pkg/controller/jobs/trainjob: the runtime's replicated job), each its
  replicas times one pod's requests (a limit counts where its request is missing);
- a resource a pod requests that no resource group covers makes the workload inadmissible
  ("resource ... unavailable in ClusterQueue"; a zero request is passed over);
- a pod set takes the first flavor whose nodeLabels its nodeSelector does not contradict and whose
  nominal quota, less what is admitted already, holds all of the set's requests of the group;
- the workload is admitted only if every pod set finds one; otherwise nothing of it is.

Borrowing, preemption, node affinity and taints are not emulated: the queue has no cohort, and
the flavors have no taints. What only a cluster shows: Kueue suspending and resuming the MPIJob
(its webhook sets runPolicy.suspend), the nodeLabels it injects, WaitForPodsReady's eviction."""
import copy

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
from deploy_support import (EFA_INTERFACES, KUEUE_CRDS, MPIJOB_TARGETS,  # noqa: E402,F401
                            TRAINJOB_TARGETS, crd_validator, kubectl, render, rendered,
                            trainjob_pod)
from test_eks_guide import guide_configs  # noqa: E402

# Each node type's vCPUs and memory (GiB), from EC2's instance type pages; 8 GPUs each.
NODES = {"m5.xlarge": (4, 16), "p3.16xlarge": (64, 488), "p3dn.24xlarge": (96, 768),
         "p4d.24xlarge": (96, 1152), "p5.48xlarge": (192, 2048)}
UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3, "": 1}


def quantity(value):
    """A Kubernetes quantity ("64Gi", "16", 500m) as a number."""
    text = str(value)
    number = text.rstrip("KMGTim")
    return float(number) * UNITS[text[len(number):]]


def kueue_objects(rendered):
    return {(d["kind"], d["metadata"]["name"]): d for d in rendered("kueue")}


def cluster_queue(rendered):
    return next(d for (kind, _), d in kueue_objects(rendered).items() if kind == "ClusterQueue")


@pytest.mark.parametrize("kind", ["ResourceFlavor", "ClusterQueue", "LocalQueue"])
def test_queue_objects_validate_against_kueue_crds(kind, rendered):
    validator = crd_validator(KUEUE_CRDS / f"kueue.x-k8s.io_{kind.lower()}s.yaml", "v1beta2",
                              "Kueue")
    docs = [d for d in rendered("kueue") if d["kind"] == kind]
    assert docs
    for doc in docs:
        errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
        assert not errors, "\n".join(errors)


def test_every_job_names_the_local_queue_of_the_cluster_queue(rendered):
    objects = kueue_objects(rendered)
    (local_queue,) = [d for (kind, _), d in objects.items() if kind == "LocalQueue"]
    assert "namespace" not in local_queue["metadata"], "the queue must land in the jobs' namespace"
    assert ("ClusterQueue", local_queue["spec"]["clusterQueue"]) in objects
    for flavor in cluster_queue(rendered)["spec"]["resourceGroups"][0]["flavors"]:
        assert ("ResourceFlavor", flavor["name"]) in objects
    for target in MPIJOB_TARGETS + TRAINJOB_TARGETS:
        job = next(d for d in rendered(target) if d["kind"] in ("MPIJob", "TrainJob"))
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == \
            local_queue["metadata"]["name"], target


def node_groups():
    """{instance type: (maxSize, node labels)} of the guide's node groups; the P4d group is the
    P5 one's file with its instance type changed (the guide says so)."""
    groups = {}
    for _, _, config in guide_configs():
        for group in config.get("managedNodeGroups", []):
            size = group.get("maxSize", group.get("desiredCapacity"))
            groups[group["instanceType"]] = (size, group["name"])
    groups.setdefault("p4d.24xlarge", groups["p5.48xlarge"])
    return groups


def test_each_flavor_holds_its_node_group_at_max_size(rendered):
    flavors = {d["metadata"]["name"]: d for d in rendered("kueue") if d["kind"] == "ResourceFlavor"}
    quotas = cluster_queue(rendered)["spec"]["resourceGroups"][0]["flavors"]
    groups = node_groups()
    assert {f["name"] for f in quotas} == {"system", *MPIJOB_TARGETS}
    for flavor in quotas:
        labels = flavors[flavor["name"]]["spec"]["nodeLabels"]
        if flavor["name"] == "system":
            instance, (size, name) = "m5.xlarge", groups["m5.xlarge"]
            assert labels == {"eks.amazonaws.com/nodegroup": name}
        else:
            instance, (size, _) = flavor["name"], groups[flavor["name"]]
            assert labels == {"node.kubernetes.io/instance-type": instance}
        cpus, memory_gib = NODES[instance]
        gpus = 0 if instance == "m5.xlarge" else 8
        want = {"cpu": size * cpus, "memory": size * memory_gib * 2**30,
                "nvidia.com/gpu": size * gpus,
                "vpc.amazonaws.com/efa": size * EFA_INTERFACES.get(instance, 0)}
        got = {r["name"]: quantity(r["nominalQuota"]) for r in flavor["resources"]}
        assert got == want, flavor["name"]


# Kueue's admission, emulated (the module's docstring says how far).
def pod_requests(template):
    spec = template["spec"]
    total = {}
    for container in spec["containers"]:
        resources = container.get("resources", {})
        wanted = {**resources.get("limits", {}), **resources.get("requests", {})}
        for name, value in wanted.items():
            total[name] = total.get(name, 0) + quantity(value)
    return total


def pod_sets(job):
    if job["kind"] == "TrainJob":
        _, pod = trainjob_pod(job)
        return [("node", job["spec"]["trainer"]["numNodes"], {"spec": pod})]
    specs = job["spec"]["mpiReplicaSpecs"]
    return [(role, specs[role].get("replicas", 1), specs[role]["template"])
            for role in ("Launcher", "Worker")]


def admit(job, queue, flavors, used):
    """{pod set: flavor} when Kueue admits `job`, adding its usage to `used`; else the reason."""
    group = queue["spec"]["resourceGroups"][0]
    covered = set(group["coveredResources"])
    taken = {}
    assigned = {}
    for role, count, template in pod_sets(job):
        requests = {k: v * count for k, v in pod_requests(template).items() if v}
        missing = set(requests) - covered
        if missing:
            return f"resource {sorted(missing)[0]} unavailable in ClusterQueue"
        selector = template["spec"].get("nodeSelector", {})
        for flavor in group["flavors"]:
            labels = flavors[flavor["name"]]["spec"].get("nodeLabels", {})
            if any(key in selector and selector[key] != value for key, value in labels.items()):
                continue
            quota = {r["name"]: quantity(r["nominalQuota"]) for r in flavor["resources"]}

            def free(name, flavor=flavor["name"]):
                return quota[name] - used.get((flavor, name), 0) - taken.get((flavor, name), 0)
            if all(amount <= free(name) for name, amount in requests.items()):
                for name, amount in requests.items():
                    taken[(flavor["name"], name)] = taken.get((flavor["name"], name), 0) + amount
                assigned[role] = flavor["name"]
                break
        else:
            return f"{role}: no flavor fits it"
    for key, amount in taken.items():
        used[key] = used.get(key, 0) + amount
    return assigned


def with_workers(job, workers):
    job = copy.deepcopy(job)
    if job["kind"] == "TrainJob":
        job["spec"]["trainer"]["numNodes"] = workers
    else:
        job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] = workers
    return job


@pytest.mark.parametrize("target", MPIJOB_TARGETS)
def test_a_job_is_admitted_whole_up_to_its_node_group_and_not_at_all_past_it(target, rendered):
    queue = cluster_queue(rendered)
    flavors = {d["metadata"]["name"]: d for d in rendered("kueue") if d["kind"] == "ResourceFlavor"}
    job = next(d for d in rendered(target) if d["kind"] == "MPIJob")
    assert admit(job, queue, flavors, {}) == {"Launcher": "system", "Worker": target}
    max_nodes = node_groups()[target][0]
    assert admit(with_workers(job, max_nodes), queue, flavors, {}) == \
        {"Launcher": "system", "Worker": target}
    used = {}
    too_many = with_workers(job, max_nodes + 1)
    assert admit(too_many, queue, flavors, used) == "Worker: no flavor fits it"
    assert used == {}, "a job that does not fit holds nothing"


@pytest.mark.parametrize("target", TRAINJOB_TARGETS)
def test_a_trainjob_is_admitted_whole_up_to_its_node_group_and_not_at_all_past_it(target,
                                                                                  rendered):
    queue = cluster_queue(rendered)
    flavors = {d["metadata"]["name"]: d for d in rendered("kueue") if d["kind"] == "ResourceFlavor"}
    job = next(d for d in rendered(target) if d["kind"] == "TrainJob")
    node_type = target.split("-", 1)[1]
    assert admit(job, queue, flavors, {}) == {"node": node_type}
    max_nodes = node_groups()[node_type][0]
    assert admit(with_workers(job, max_nodes), queue, flavors, {}) == {"node": node_type}
    used = {}
    too_many = with_workers(job, max_nodes + 1)
    assert admit(too_many, queue, flavors, used) == "node: no flavor fits it"
    assert used == {}


def test_a_second_job_waits_whole_while_the_first_holds_the_nodes(rendered):
    queue = cluster_queue(rendered)
    flavors = {d["metadata"]["name"]: d for d in rendered("kueue") if d["kind"] == "ResourceFlavor"}
    job = next(d for d in rendered("p5.48xlarge") if d["kind"] == "MPIJob")
    used = {}
    assert admit(job, queue, flavors, used) == {"Launcher": "system", "Worker": "p5.48xlarge"}
    held = dict(used)
    assert admit(with_workers(job, 1), queue, flavors, used) == "Worker: no flavor fits it"
    assert used == held


def test_a_request_outside_the_covered_resources_makes_a_job_inadmissible(rendered):
    queue = cluster_queue(rendered)
    flavors = {d["metadata"]["name"]: d for d in rendered("kueue") if d["kind"] == "ResourceFlavor"}
    job = copy.deepcopy(next(d for d in rendered("p3dn.24xlarge") if d["kind"] == "MPIJob"))
    worker = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    worker["resources"]["limits"]["hugepages-2Mi"] = "2Gi"
    assert admit(job, queue, flavors, {}) == "resource hugepages-2Mi unavailable in ClusterQueue"
