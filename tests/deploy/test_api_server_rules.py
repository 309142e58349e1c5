"""What the API server refuses beyond plain JSON Schema: every object of every target of
scripts/k8s/render.sh, walked against its schema the way kube-apiserver validates a custom resource
(k8s.io/apiextensions-apiserver: defaulting, then schema/listtype.ValidateListSetsAndMaps, then the
CEL rules), with its error messages:

- `x-kubernetes-list-type: map`: no two items with the same x-kubernetes-list-map-keys ("Duplicate
  value", reported at the second item, as the server does), after the schema's defaults are applied
  (a container port without `protocol` is `protocol: TCP`); and every key present in every item
  (the schema must make each key required or defaulted, or two items without it collide).
- `x-kubernetes-list-type: set`: no two equal items.
- `required` and `enum`, in the server's words ("Required value", "Unsupported value").
- `x-kubernetes-validations` (CEL): a transition rule (one that reads `oldSelf`) runs on updates
  only, never on a create, and is passed over; any other rule is evaluated with cel-python on the
  object as defaulted, and a false one reported with its message ("Invalid value"). A rule that
  uses Kubernetes' own CEL libraries (quantity(), ...), which cel-python lacks, is reported as one
  only a cluster can judge; none of the pinned CRDs' rules on the fields the targets set does.

The schemas: the Training Operator's and the MPI Operator's CRDs (deploy_support.PYTORCHJOB_CRD,
CRD) for PyTorchJobs and MPIJobs, Kueue's (upstream/kueue-v0.19.2) for its queues and flavors,
Kubeflow Trainer v2's (upstream/trainer-v2.3.0) for TrainJobs and their runtime, and for built-in
kinds the OpenAPI that kubernetes-validate ships
for test_manifests.K8S_VERSION, which carries the same markers (Container.env: map keyed by name,
Container.ports: by containerPort and protocol, ...). For built-in kinds the server itself only
warns on a create ("hides previous definition of ...", "duplicate port definition"), but
`kubectl apply --server-side` refuses the object ("duplicate entries for key") and client-side
apply merges list items by the same key, so one of the two is dropped on the next apply: an error
here too.

Plain JSON Schema (types, unknown fields, patterns) is test_manifests.py's and test_pytorchjob.py's.
"""
import copy
import json
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="pyyaml is missing: run scripts/setup.sh")
# kubectl, render and rendered are fixtures.
from deploy_support import (CRD, KUEUE_CRDS, PYTORCHJOB_CRD, TARGETS,  # noqa: E402,F401
                            TRAINER_CRDS, kubectl, render, rendered)
from test_manifests import K8S_VERSION  # noqa: E402

# The CRDs whose custom resources the targets render, by the file they are pinned in.
CRD_FILES = {"MPI Operator": CRD, "Training Operator": PYTORCHJOB_CRD,
             **{f"Kueue {kind}": KUEUE_CRDS / f"kueue.x-k8s.io_{kind}.yaml"
                for kind in ("resourceflavors", "clusterqueues", "localqueues")},
             **{f"Trainer {kind}": TRAINER_CRDS / f"trainer.kubeflow.org_{kind}.yaml"
                for kind in ("trainjobs", "clustertrainingruntimes")}}
# Defaults the API server gives built-in kinds in Go (its OpenAPI only says so in a description),
# for the list-map keys that are not required: without them two ports, one with `protocol: TCP`
# and one without, would not collide here as they do there.
BUILTIN_DEFAULTS = {"io.k8s.api.core.v1.ContainerPort": {"protocol": "TCP"},
                    "io.k8s.api.core.v1.ServicePort": {"protocol": "TCP"}}


# Paths as k8s.io/apimachinery's field.Path prints them: spec.replicaSpecs[Worker].env[2].
def child(path, name):
    return f"{path}.{name}" if path else name


def index(path, i):
    return f"{path}[{i}]"


def show(value):
    """A key or value as the errors print it: {name: NCCL_DEBUG}, {containerPort: 29400, ...}.
    (The server prints Go's map[string]interface {}{"name":"NCCL_DEBUG"}.)"""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show(v)}" for k, v in value.items()) + "}"
    return json.dumps(value) if not isinstance(value, str) else value


class Schema:
    """One object's schema: its root and a resolver of the built-in OpenAPI's $refs."""

    def __init__(self, root, definitions=None):
        self.root = root
        self.definitions = definitions or {}

    def resolve(self, node):
        """`node` with a $ref replaced by what it names (its other keys kept, as in 2020-12), and
        the name of the definition, for BUILTIN_DEFAULTS."""
        if not isinstance(node, dict) or "$ref" not in node:
            return node, None
        name = node["$ref"].rsplit("/", 1)[-1]
        target, _ = self.resolve(self.definitions[name])
        return {**target, **{k: v for k, v in node.items() if k != "$ref"}}, name


def is_transition_rule(rule):
    return re.search(r"\boldSelf\b", rule["rule"]) is not None


class Walk:
    """Defaults an object and checks it against a Schema; errors as the server words them."""

    def __init__(self, schema):
        self.schema = schema
        self.errors = []
        self.transition_rules = []  # (path, rule): skipped, as on a create

    def run(self, obj):
        obj = self.default(copy.deepcopy(obj), self.schema.root)
        self.check(obj, self.schema.root, "")
        return self.errors

    def default(self, value, node):
        node, name = self.schema.resolve(node)
        if isinstance(value, dict):
            for key, fallback in BUILTIN_DEFAULTS.get(name, {}).items():
                value.setdefault(key, fallback)
            properties = node.get("properties", {})
            for key, sub in properties.items():
                sub, _ = self.schema.resolve(sub)
                if key not in value and "default" in sub:
                    value[key] = copy.deepcopy(sub["default"])
            extra = node.get("additionalProperties")
            for key in value:
                if key in properties:
                    value[key] = self.default(value[key], properties[key])
                elif isinstance(extra, dict):
                    value[key] = self.default(value[key], extra)
        elif isinstance(value, list) and isinstance(node.get("items"), dict):
            value[:] = [self.default(item, node["items"]) for item in value]
        return value

    def check(self, value, node, path):
        node, _ = self.schema.resolve(node)
        if value is None:
            return
        if "enum" in node and value not in node["enum"]:
            supported = ", ".join(json.dumps(v) for v in node["enum"])
            self.errors.append(f"{path}: Unsupported value: {json.dumps(value)}: "
                               f"supported values: {supported}")
        for rule in node.get("x-kubernetes-validations", []):
            self.cel_rule(value, rule, path, node)
        if isinstance(value, dict):
            for key in node.get("required", []):
                if key not in value:
                    self.errors.append(f"{child(path, key)}: Required value")
            properties = node.get("properties", {})
            extra = node.get("additionalProperties")
            for key, item in value.items():
                if key in properties:
                    self.check(item, properties[key], child(path, key))
                elif isinstance(extra, dict):
                    self.check(item, extra, f"{path}[{key}]")
                # Else pruned by the server (an unknown field: test_manifests' strict schemas).
        elif isinstance(value, list):
            kind = node.get("x-kubernetes-list-type")
            if kind == "map":
                self.list_map(value, node, path)
            elif kind == "set":
                self.duplicates(value, path, lambda item: item)
            if isinstance(node.get("items"), dict):
                for i, item in enumerate(value):
                    self.check(item, node["items"], index(path, i))

    def list_map(self, items, node, path):
        keys = node.get("x-kubernetes-list-map-keys", [])
        item_schema, _ = self.schema.resolve(node.get("items", {}))
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                self.errors.append(f"{index(path, i)}: Invalid value: {show(item)}: "
                                   "must be an object for an array of list-type map")
                return
            for key in keys:  # a key neither given nor defaulted (one `required` lists: above)
                if key not in item and key not in item_schema.get("required", []):
                    self.errors.append(f"{child(index(path, i), key)}: Required value: "
                                       f"a key of the list-type map {path}")
        self.duplicates(items, path, lambda item: {k: item[k] for k in keys if k in item})

    def duplicates(self, items, path, key_of):
        """As listtype.validateListSet: each value seen again is reported once, at its second
        item; compounds compare by their JSON (sorted keys), true and 1 differ."""
        seen = {}
        for i, item in enumerate(items):
            key = key_of(item)
            identity = (json.dumps(key, sort_keys=True) if isinstance(key, (dict, list))
                        else (type(key) is bool, key))
            seen[identity] = seen.get(identity, 0) + 1
            if seen[identity] == 2:
                self.errors.append(f"{index(path, i)}: Duplicate value: {show(key)}")

    def cel_rule(self, value, rule, path, node=None):
        if is_transition_rule(rule):
            self.transition_rules.append((path, rule["rule"]))
            return
        where = child(path, rule["fieldPath"].lstrip(".")) if rule.get("fieldPath") else path
        holds = cel_holds(rule["rule"], value)
        if holds is None:
            self.errors.append(f"{where}: the CEL rule {rule['rule']!r} runs on a create; no "
                               "evaluator here for it: check the object on a cluster")
        elif not holds:
            message = rule.get("message") or f"failed rule: {rule['rule']}"
            self.errors.append(f"{where}: Invalid value: \"object\": {message}")


def cel_holds(rule, value):
    """Whether the CEL `rule` holds for `value` as `self`; None where cel-python cannot compile
    it (a function of Kubernetes' CEL libraries)."""
    celpy = pytest.importorskip("celpy", reason="cel-python is missing: run scripts/setup.sh")
    environment = celpy.Environment()
    try:
        program = environment.program(environment.compile(rule))
    except celpy.CELParseError:
        return None
    try:
        result = program.evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELEvalError:
        return None
    if isinstance(result, celpy.CELEvalError):
        return None
    return bool(result)


# The schemas.
_crds = {}


def crd_schema(doc):
    """The schema of a custom resource's version, from the pinned CRD of its group and kind; None
    when `doc` is of a built-in group. Skips where the CRD file is absent (outside the project)."""
    group, _, version = doc["apiVersion"].rpartition("/")
    if "." not in group or group.endswith(".k8s.io"):
        return None
    for operator, path in CRD_FILES.items():
        if not path.exists():
            continue
        if path not in _crds:
            _crds[path] = yaml.safe_load(path.read_text())
        spec = _crds[path]["spec"]
        if (spec["group"], spec["names"]["kind"]) == (group, doc["kind"]):
            versions = {v["name"]: v for v in spec["versions"]}
            assert version in versions, f"{doc['kind']} {version}: not a version of {path.name}"
            return Schema(versions[version]["schema"]["openAPIV3Schema"])
    missing = [f"{p} ({o})" for o, p in CRD_FILES.items() if not p.exists()]
    if missing:
        pytest.skip(f"no CRD for {doc['apiVersion']} {doc['kind']}: {', '.join(missing)} absent")
    pytest.fail(f"no pinned CRD for {doc['apiVersion']} {doc['kind']}: add it to CRD_FILES")


def builtin_schema(doc):
    """The OpenAPI kubernetes-validate ships for a built-in kind at K8S_VERSION, found the way its
    validate() finds it; its $refs point into _definitions.json."""
    kv = pytest.importorskip("kubernetes_validate", reason="run scripts/setup.sh")
    from kubernetes_validate import utils

    def minor(v):
        return tuple(int(p) for p in utils.major_minor(v).split("."))
    version = [v for v in utils.all_versions() if minor(v) <= minor(K8S_VERSION)][-1]
    folder = Path(kv.__file__).parent / "kubernetes-json-schema" / f"v{version}-local"
    api_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", doc["apiVersion"])
    path = folder / f"{doc['kind'].lower()}-{api_version}.json"
    assert path.exists(), f"no schema for {doc['apiVersion']} {doc['kind']} in {folder}"
    definitions = json.loads((folder / "_definitions.json").read_text())["$defs"]
    return Schema(json.loads(path.read_text()), definitions)


def schema_of(doc):
    return crd_schema(doc) or builtin_schema(doc)


def api_server_errors(doc, schema=None, label=""):
    """The errors the API server would give `doc`, each `<label> <kind>/<name> <path>: ...`."""
    walk = Walk(schema or schema_of(doc))
    name = f"{label} {doc['kind']}/{doc.get('metadata', {}).get('name', '?')}".strip()
    return [f"{name} {e}" for e in walk.run(doc)]


# The targets as rendered.
@pytest.mark.parametrize("target", TARGETS)
def test_the_api_server_accepts_every_object(target, rendered):
    errors = [e for doc in rendered(target) for e in api_server_errors(doc, label=target)]
    assert not errors, "the API server would refuse:\n" + "\n".join(errors)


# The checks themselves, on the rendered objects changed the ways the server refuses.
def pytorchjob(rendered, target="pytorchjob-p3.16xlarge"):
    return copy.deepcopy(next(d for d in rendered(target) if d["kind"] == "PyTorchJob"))


WORKER = "spec.pytorchReplicaSpecs[Worker].template.spec.containers[0]"


def test_a_repeated_env_name_is_a_duplicate_value(rendered):
    # As pytorchjob-p3dn.24xlarge's overlay appends NCCL_DEBUG to the base's env, which has it.
    job = pytorchjob(rendered)
    env = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]
    assert "NCCL_DEBUG" in [e["name"] for e in env]
    env.append({"name": "NCCL_DEBUG", "value": "INFO"})
    assert api_server_errors(job, label="t") == [
        f"t PyTorchJob/resnet50-elastic {WORKER}.env[{len(env) - 1}]: "
        "Duplicate value: {name: NCCL_DEBUG}"]


def test_ports_collide_once_their_protocol_is_defaulted(rendered):
    job = pytorchjob(rendered)
    (container,) = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    ports = container["ports"]
    (port,) = ports
    assert "protocol" not in port  # TCP by the CRD's default
    ports.append({"name": "again", "containerPort": port["containerPort"], "protocol": "TCP"})
    assert api_server_errors(job) == [
        f"PyTorchJob/resnet50-elastic {WORKER}.ports[1]: Duplicate value: "
        f"{{containerPort: {port['containerPort']}, protocol: TCP}}"]
    ports[1]["protocol"] = "UDP"
    assert api_server_errors(job) == []


def test_builtin_pod_templates_are_checked_too(rendered):
    job = copy.deepcopy(next(d for d in rendered("smoke") if d["kind"] == "Job"))
    container = job["spec"]["template"]["spec"]["containers"][0]
    container.setdefault("env", []).extend([{"name": "X", "value": "1"},
                                            {"name": "X", "value": "2"}])
    errors = api_server_errors(job)
    assert [e.split(" ", 1)[1] for e in errors] == [
        f"spec.template.spec.containers[0].env[{len(container['env']) - 1}]: "
        "Duplicate value: {name: X}"]


def test_sets_required_keys_and_enums():
    schema = Schema({"type": "object", "required": ["kind"], "properties": {
        "codes": {"type": "array", "items": {"type": "integer"}, "x-kubernetes-list-type": "set"},
        "policy": {"type": "string", "enum": ["A", "B"]},
        "items": {"type": "array", "x-kubernetes-list-type": "map",
                  "x-kubernetes-list-map-keys": ["id"],
                  "items": {"type": "object", "properties": {"id": {"type": "string"}}}}}})
    doc = {"kind": "K", "metadata": {"name": "n"}, "codes": [1, 2, 1, 1, True],
           "policy": "C", "items": [{}, {}]}
    assert api_server_errors(doc, schema) == [
        "K/n codes[2]: Duplicate value: 1",
        'K/n policy: Unsupported value: "C": supported values: "A", "B"',
        "K/n items[0].id: Required value: a key of the list-type map items",
        "K/n items[1].id: Required value: a key of the list-type map items",
        "K/n items[1]: Duplicate value: {}"]
    assert api_server_errors({"kind": "K", "metadata": {"name": "n"}}, schema) == []
    assert Walk(schema).run({"metadata": {"name": "n"}}) == ["kind: Required value"]


def test_cel_rules_of_the_pinned_crds_are_transition_rules_or_evaluated(rendered):
    """Every rule on a field a target sets is evaluated here (Kueue's ClusterQueue and
    ResourceFlavor have such rules); the one rule in the Training Operator's CRD
    (spec.runPolicy.schedulingPolicy.queue: `self == oldSelf`, "is immutable") runs on updates
    only."""
    errors = [e for target in TARGETS for doc in rendered(target)
              for e in Walk(schema_of(doc)).run(doc)]
    # A rule of the schema is reached only where the object has the field.
    assert not [e for e in errors if "CEL rule" in e], errors
    schema = crd_schema(pytorchjob(rendered))
    queue = (schema.root["properties"]["spec"]["properties"]["runPolicy"]["properties"]
             ["schedulingPolicy"]["properties"]["queue"])
    assert [r["rule"] for r in queue["x-kubernetes-validations"]] == ["self == oldSelf"]
    job = pytorchjob(rendered)
    job["spec"]["runPolicy"]["schedulingPolicy"] = {"queue": "q"}
    walk = Walk(schema)
    assert walk.run(job) == []
    assert walk.transition_rules == [("spec.runPolicy.schedulingPolicy.queue", "self == oldSelf")]


CEL_SCHEMA = Schema({"type": "object", "properties": {"spec": {
    "type": "object", "properties": {"min": {"type": "integer"}, "max": {"type": "integer"}},
    "x-kubernetes-validations": [{"rule": "self.min <= self.max", "message": "min above max"}]}}})


def test_a_cel_rule_that_runs_on_a_create_is_evaluated():
    doc = {"kind": "K", "metadata": {"name": "n"}, "spec": {"min": 5, "max": 4}}
    assert Walk(CEL_SCHEMA).run(doc) == ['spec: Invalid value: "object": min above max']
    doc["spec"]["max"] = 5
    assert Walk(CEL_SCHEMA).run(doc) == []


def test_a_rule_of_kubernetes_own_cel_library_is_left_to_a_cluster():
    schema = Schema({"type": "object", "properties": {"q": {
        "type": "string", "x-kubernetes-validations": [
            {"rule": "quantity(self).isGreaterThan(quantity('1'))"}]}}})
    assert Walk(schema).run({"q": "2"}) == [
        "q: the CEL rule \"quantity(self).isGreaterThan(quantity('1'))\" runs on a create; no "
        "evaluator here for it: check the object on a cluster"]


def test_a_clusterqueue_flavor_short_of_a_covered_resource_is_refused(rendered):
    queue = copy.deepcopy(next(d for d in rendered("kueue") if d["kind"] == "ClusterQueue"))
    del queue["spec"]["resourceGroups"][0]["flavors"][1]["resources"][3]
    assert api_server_errors(queue) == [
        'ClusterQueue/gpu-nodes spec.resourceGroups[0]: Invalid value: "object": flavors must '
        'have the same number of resources as the coveredResources']
