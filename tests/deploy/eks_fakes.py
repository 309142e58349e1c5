"""The stand-ins the EKS scripts' tests run them against: an `aws` that returns the JSON the AWS
APIs return (shapes from the services' own documentation), applies the script's own --query with
the aws CLI's query language (JMESPath) and prints it as `--output text` does; `eksctl`, `kubectl`
(rendering with the real one, and deleting with it against a fake API server when a test gives
one), `helm` and `docker`. Every call is recorded in order, so the tests check what the scripts
would do to an account, and in which order, without one. The `tools` fixture runs a script
among them."""
import json
import os
import subprocess
import sys

import pytest
from deploy_support import ROOT

# The stand-in for every tool. ANSWERS is a list of {"tool", "call" (arguments that must all be
# there, each whole or as the part before "="), "after"/"before" (a substring of an earlier
# recorded call that must / must not have been made), "json" | "text", "rc", "stderr"}; the
# first that matches answers. JSON answers go through --query and --output text as the aws CLI
# does.
FAKE = r'''#!PYTHON
import json, os, sys
sys.path[:0] = json.loads(os.environ["FAKE_PATH"])
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
line = " ".join([tool, *args])
if tool == "kubectl" and args[:1] == ["kustomize"]:
    os.execv(os.environ["REAL_KUBECTL"], [os.environ["REAL_KUBECTL"], *args])
with open(os.environ["FAKE_CALLS"]) as f:
    earlier = f.read()
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(line + "\n")
# With a fake API server (tests/deploy/fake_api_server.py), kubectl's own delete and api-resources
# run against it: what they print and exit with is the real kubectl's.
api = os.environ.get("FAKE_API_KUBECONFIG")
if tool == "kubectl" and api and args[:1] in (["delete"], ["api-resources"]):
    os.environ.update(KUBECONFIG=api, KUBECACHEDIR=os.path.join(os.path.dirname(api), "cache"))
    os.execv(os.environ["REAL_KUBECTL"], [os.environ["REAL_KUBECTL"], *args])


def text(value):
    """--output text: scalars as they are, a list on one line, a list of lists a line each."""
    if value is None:
        return "None"
    if isinstance(value, list):
        if value and all(isinstance(v, list) for v in value):
            return "\n".join("\t".join(text(x) for x in v) for v in value)
        return "\t".join(text(v) for v in value)
    return str(value)


for answer in json.load(open(os.environ["FAKE_ANSWERS"])):
    given = set(args) | {a.split("=", 1)[0] for a in args}
    if answer["tool"] != tool or not set(answer.get("call", [])) <= given:
        continue
    if "after" in answer and answer["after"] not in earlier:
        continue
    if "before" in answer and answer["before"] in earlier:
        continue
    sys.stderr.write(answer.get("stderr", ""))
    out = answer.get("text", "")
    if "json" in answer:
        import jmespath
        value = answer["json"]
        if "--query" in args:
            value = jmespath.search(args[args.index("--query") + 1], value)
        out = text(value) if "text" in args else json.dumps(value, indent=4)
    if out:
        print(out)
    sys.exit(answer.get("rc", 0))
sys.stderr.write(f"fake {tool}: no recorded answer for: {line}\n")
sys.exit(255)
'''


@pytest.fixture
def tools(tmp_path, kubectl):
    """run(script, answers, *args, **env) -> (returncode, stdout + stderr, the calls in order)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("aws", "eksctl", "kubectl", "helm", "docker"):
        fake = bin_dir / name
        fake.write_text(FAKE.replace("PYTHON", sys.executable, 1))
        fake.chmod(0o755)
    calls, answers_file = tmp_path / "calls", tmp_path / "answers.json"

    def run(script, answers, *args, **env):
        calls.write_text("")
        answers_file.write_text(json.dumps(answers))
        full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                    "FAKE_CALLS": str(calls), "FAKE_ANSWERS": str(answers_file),
                    "FAKE_PATH": json.dumps(sys.path), "REAL_KUBECTL": kubectl,
                    "AWS_REGION": "us-west-2", **env}
        for name in ("KUBECTL", "AWS", "EKSCTL", "AZ", "EKS_VERSION", "FSX_FILE_SYSTEM_ID"):
            if name not in env:
                full_env.pop(name, None)
        proc = subprocess.run([str(ROOT / script), *args], capture_output=True,
                              text=True, env=full_env, timeout=300)
        return proc.returncode, proc.stdout + proc.stderr, calls.read_text().splitlines()

    return run
