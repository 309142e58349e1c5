"""scripts/eks/export.sh against recorded AWS answers (tests/deploy/eks_fakes.py): the runs
exported to S3 and waited for, or an automatic export left to itself, and every refusal with its
fix."""
import pytest
from deploy_support import kubectl  # noqa: F401 (a fixture)
from eks_fakes import tools  # noqa: F401 (a fixture)
from fsx_answers import (VPC, FILE_SYSTEM, ON_FILE_SYSTEM, TRAINER_PODS, TASK, AFTER_THE_LAST_POD,
                         data_repository_task, association)

jmespath = pytest.importorskip("jmespath", reason="jmespath is missing: run scripts/setup.sh")


def export_answers(link="path", lifecycles=("EXECUTING", "SUCCEEDED"), trainer="ended"):
    """link: how the file system reaches S3 ("path": the export path of k8s/fsx's import path,
    "dra": an association of /runs with automatic export, "dra-manual": one without it, None:
    no link). lifecycles: what DescribeDataRepositoryTasks says of the new task, poll by poll."""
    answers = [
        {"tool": "kubectl", "call": ["get", "pvc", "fsx-claim"], "text": "pvc-5e6f7a8b"},
        {"tool": "kubectl", "call": ["get", "pv", "pvc-5e6f7a8b"], "text": FILE_SYSTEM},
        {"tool": "kubectl", "call": ["get", "pods", "app.kubernetes.io/name=resnet-trainer"],
         "text": "\n".join(" ".join(line.split()[:2])
                           for line in TRAINER_PODS[trainer].splitlines())},
        {"tool": "aws", "call": ["fsx", "describe-data-repository-associations", ON_FILE_SYSTEM],
         "json": {"dra": association(), "dra-manual": association(auto_export=())}.get(
             link, {"Associations": []})},
        {"tool": "aws", "call": ["fsx", "describe-file-systems", FILE_SYSTEM], "json": {
            "FileSystems": [{
                "FileSystemId": FILE_SYSTEM, "FileSystemType": "LUSTRE", "Lifecycle": "AVAILABLE",
                "StorageCapacity": 2400, "VpcId": VPC,
                "DNSName": f"{FILE_SYSTEM}.fsx.us-west-2.amazonaws.com",
                "LustreConfiguration": {
                    "DeploymentType": "SCRATCH_2", "MountName": "2p3bxbmv",
                    **({"DataRepositoryConfiguration": {
                        "Lifecycle": "AVAILABLE", "ImportPath": "s3://my-imagenet-bucket",
                        "ExportPath": "s3://my-imagenet-bucket", "ImportedFileChunkSize": 1024,
                        "AutoImportPolicy": "NONE"}} if link == "path" else {})}}]}},
        {"tool": "aws", "call": ["fsx", "create-data-repository-task"], "json": {
            "DataRepositoryTask": data_repository_task(TASK, AFTER_THE_LAST_POD,
                                                       lifecycle="PENDING")}},
    ]
    for i, lifecycle in enumerate(lifecycles):
        answer = {"tool": "aws", "call": ["fsx", "describe-data-repository-tasks", TASK],
                  "json": {"DataRepositoryTasks": [data_repository_task(
                      TASK, AFTER_THE_LAST_POD, lifecycle=lifecycle,
                      failed=3 if lifecycle == "FAILED" else 0)]}}
        if i + 1 < len(lifecycles):
            # Until the script has asked this often: each poll sees the next state.
            answer["before"] = f"describe-data-repository-tasks --task-ids {TASK}"
        answers.append(answer)
    return answers


def export(tools, answers, *runs, **env):
    return tools("scripts/eks/export.sh", answers, *runs, POLL_S="0", **env)


def created_tasks(calls):
    return [c for c in calls if "create-data-repository-task" in c]


def test_export_exports_the_runs_to_the_export_path_and_waits(tools):
    code, out, calls = export(tools, export_answers())
    assert code == 0, out
    task, = created_tasks(calls)
    assert task == (f"aws fsx create-data-repository-task --type EXPORT_TO_REPOSITORY "
                    f"--file-system-id {FILE_SYSTEM} --paths runs --report Enabled=false "
                    "--query DataRepositoryTask.TaskId --output text")
    # It polls the task until it has ended, then says where the runs are.
    polls = [c for c in calls if f"describe-data-repository-tasks --task-ids {TASK}" in c]
    assert len(polls) == 2, calls
    assert f"exported runs of {FILE_SYSTEM} to s3://my-imagenet-bucket/runs" in out


def test_export_of_named_runs_exports_those_folders(tools):
    code, out, calls = export(tools, export_answers(), "resnet50-p3", "/fsx/runs/smoke/")
    assert code == 0, out
    task, = created_tasks(calls)
    assert " --paths runs/resnet50-p3 runs/smoke --report " in task


@pytest.mark.parametrize("run", ["../imagenet", "/etc", "--all"])
def test_export_refuses_a_path_outside_the_runs(tools, run):
    code, out, calls = export(tools, export_answers(), run)
    assert code == 2 and "is not a folder under /fsx/runs" in out and calls == []


def test_export_warns_of_a_job_still_running(tools):
    code, out, calls = export(tools, export_answers(trainer="running"))
    assert code == 0, out
    assert "WARNING: still running, writing to /fsx/runs after this export: " \
           "resnet50-launcher-x8k2p" in out
    assert created_tasks(calls)


def test_export_leaves_an_automatic_export_to_itself(tools):
    # FSx runs no export task beside automatic export: the association does the work.
    code, out, calls = export(tools, export_answers(link="dra"))
    assert code == 0, out
    assert "exports /runs to s3://my-imagenet-bucket/runs by itself" in out
    assert "dra-0123456789abcdef0" in out and created_tasks(calls) == []


def test_export_through_an_association_without_automatic_export(tools):
    code, out, calls = export(tools, export_answers(link="dra-manual"))
    assert code == 0, out
    assert len(created_tasks(calls)) == 1
    assert "to s3://my-imagenet-bucket/runs" in out


def test_export_without_a_link_to_s3_says_how_to_make_one(tools):
    code, out, calls = export(tools, export_answers(link=None))
    assert code == 2, out
    assert f"{FILE_SYSTEM} has no S3 path to export /runs to" in out
    assert (f"aws fsx create-data-repository-association --file-system-id {FILE_SYSTEM} "
            "--file-system-path /runs --data-repository-path s3://BUCKET/runs") in out
    assert created_tasks(calls) == []


def test_export_that_fails_says_why(tools):
    code, out, _ = export(tools, export_answers(lifecycles=("EXECUTING", "FAILED")))
    assert code == 1, out
    assert f"{TASK} ended FAILED: 3 of 412 files not exported" in out
    assert "Access denied writing to s3://my-imagenet-bucket" in out


def test_export_stops_waiting_at_its_deadline(tools):
    code, out, _ = export(tools, export_answers(lifecycles=("EXECUTING",)), EXPORT_WAIT_S="0")
    assert code == 1, out
    assert f"{TASK} is still EXECUTING after 0 s" in out and "it goes on" in out


def test_export_finds_the_file_system_without_a_cluster(tools):
    answers = [a for a in export_answers() if a["tool"] != "kubectl"]
    code, out, calls = export(tools, answers, FSX_FILE_SYSTEM_ID=FILE_SYSTEM)
    assert code == 0, out
    assert not any(c.startswith("kubectl get pv") for c in calls)


def test_export_without_a_file_system_says_how_to_name_one(tools):
    answers = [{"tool": "kubectl", "call": ["get", "pvc"], "rc": 1,
                "stderr": 'Error from server (NotFound): persistentvolumeclaims "fsx-claim" '
                          "not found\n"}]
    code, out, calls = export(tools, answers)
    assert code == 2 and "HINT: set FSX_FILE_SYSTEM_ID=fs-..." in out
    assert created_tasks(calls) == []
