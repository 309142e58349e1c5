"""A Kubernetes API server's discovery and nothing else, on 127.0.0.1, for running the real kubectl
against a cluster with or without each operator's kinds: /api and /apis list what is served (the
legacy discovery documents, which kubectl falls back to when the aggregated ones are not
offered), and every object is absent (GET and DELETE answer 404 NotFound, as for an object that
was never made). What kubectl then prints and exits with is its own. Each request is recorded."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# What a cluster serves before any operator: the built-in kinds the project's targets hold.
BUILT_IN = {
    "v1": ["ConfigMap", "PersistentVolume", "PersistentVolumeClaim", "Pod", "Service"],
    "apps/v1": ["Deployment"],
    "batch/v1": ["Job"],
    "storage.k8s.io/v1": ["StorageClass"],
}
# The kinds each operator adds, at the versions the project's manifests use.
OPERATORS = {
    "mpi-operator": {"kubeflow.org/v2beta1": ["MPIJob"]},
    "training-operator": {"kubeflow.org/v1": ["PyTorchJob"]},
    "trainer": {"trainer.kubeflow.org/v1alpha1": ["TrainJob", "ClusterTrainingRuntime"]},
    "kueue": {"kueue.x-k8s.io/v1beta2": ["ResourceFlavor", "ClusterQueue", "LocalQueue"]},
}
CLUSTER_SCOPED = {"PersistentVolume", "StorageClass", "ClusterTrainingRuntime", "ResourceFlavor",
                  "ClusterQueue"}


class _Server(ThreadingHTTPServer):
    # kubectl asks for every group's document at once: with the default backlog of 5, the
    # connections past it wait for a SYN retransmit, a second each.
    request_queue_size = 64


def plural(kind):
    """The resource name of a kind, as the API server's REST mapper would guess it."""
    lower = kind.lower()
    return lower + "es" if lower.endswith("s") else lower + "s"


class FakeApiServer:
    """with FakeApiServer(["trainer", ...]) as api: api.kubeconfig(folder) -> a kubeconfig path;
    api.requests: ["GET /api/v1", "DELETE /api/v1/namespaces/default/configmaps/x", ...]."""

    def __init__(self, operators=OPERATORS):
        self.served = {version: list(kinds) for version, kinds in BUILT_IN.items()}
        for name in operators:
            for version, kinds in OPERATORS[name].items():
                self.served.setdefault(version, []).extend(kinds)
        self.requests = []
        self._server = _Server(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def kubeconfig(self, folder):
        path = folder / "kubeconfig"
        server = f"http://127.0.0.1:{self._server.server_address[1]}"
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": server}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                      "namespace": "default"}}]}))
        return path

    def document(self, path):
        """The discovery document at `path`, or None for anything else."""
        if path == "/api":
            return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path == "/apis":
            groups = {}
            for version in self.served:
                if "/" in version:
                    group, _, v = version.partition("/")
                    groups.setdefault(group, []).append({"groupVersion": version, "version": v})
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": vs, "preferredVersion": vs[0]} for g, vs in groups.items()]}
        version = path.removeprefix("/api/").removeprefix("/apis/")
        if path.startswith(("/api/", "/apis/")) and version in self.served:
            return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": version,
                    "resources": [{"name": plural(k), "singularName": k.lower(), "kind": k,
                                   "namespaced": k not in CLUSTER_SCOPED,
                                   "verbs": ["create", "delete", "get", "list", "patch"]}
                                  for k in self.served[version]]}
        return None

    def _handler(self):
        api = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                path = self.path.split("?", 1)[0]
                api.requests.append(f"{self.command} {path}")
                body = api.document(path) if self.command == "GET" else None
                code = 200 if body else 404
                if body is None:
                    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "NotFound", "code": 404, "message": f"{path} not found"}
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_DELETE = answer

            def log_message(self, *args):
                pass

        return Handler
