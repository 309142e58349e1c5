"""Recorded answers about the FSx for Lustre file system and the trainer's pods, which
scripts/eks/teardown.sh and scripts/eks/export.sh both ask for."""

VPC, GROUP, FILE_SYSTEM = "vpc-0a1b2c3d4e5f60718", "sg-0fedcba9876543210", "fs-0123456789abcdef0"
FSX_DELETED = "delete --ignore-not-found -f"  # + .../fsx.yaml: matched with "fsx.yaml"
ON_FILE_SYSTEM = f"Name=file-system-id,Values={FILE_SYSTEM}"  # the describe calls' --filters
# The trainer's pods as `kubectl get pods -l app.kubernetes.io/name=resnet-trainer -o
# custom-columns=NAME,PHASE,ENDED` prints them: finished (the last ended 09:58:01 UTC), or a job
# still running.
TRAINER_PODS = {
    "ended": "resnet50-launcher-x8k2p   Succeeded   2026-11-20T09:58:01Z\n"
             "resnet50-smoke-q7w4d      Succeeded   2026-11-19T18:31:09Z\n"
             "fsx-stage-data-4kq9z      Succeeded   2026-11-19T17:02:44Z,2026-11-19T16:40:02Z",
    "running": "resnet50-launcher-x8k2p   Running     <none>\n"
               "resnet50-smoke-q7w4d      Succeeded   2026-11-19T18:31:09Z",
}
# What names the runs: the trainer configs here, and the smoke Job's --output_dir.
CONFIG_MAPS = ('seed = 1\noutput_dir = "/fsx/runs/resnet50-p3"\nresume = "auto"\n'
               'output_dir = "/tmp/resnet-smoke"\n')
POD_ARGS = "train\n--config\n/etc/resnet-trainer/trainer.toml\n--output_dir\n/fsx/runs/smoke"
TASK = "task-0fedcba9876543210"
AFTER_THE_LAST_POD = "2026-11-20T10:04:12.517000+00:00"
BEFORE_THE_LAST_POD = "2026-11-20T09:12:40.101000+00:00"


def data_repository_task(task_id, created, kind="EXPORT_TO_REPOSITORY", lifecycle="SUCCEEDED",
                         paths=("runs",), failed=0):
    """One entry of DescribeDataRepositoryTasks (the FSx API reference's shape), as the aws CLI
    prints it: timestamps in ISO 8601 (in UTC under TZ=UTC)."""
    task = {"TaskId": task_id, "Lifecycle": lifecycle, "Type": kind, "CreationTime": created,
            "StartTime": created, "Tags": [],
            "ResourceARN": f"arn:aws:fsx:us-west-2:123456789012:task/{task_id}",
            "FileSystemId": FILE_SYSTEM, "Paths": list(paths),
            "Status": {"TotalCount": 412, "SucceededCount": 412 - failed, "FailedCount": failed,
                       "LastUpdatedTime": created, "ReleasedCount": 0},
            "Report": {"Enabled": False}}
    if lifecycle in ("SUCCEEDED", "FAILED"):
        task["EndTime"] = created
    if lifecycle == "FAILED":
        task["FailureDetails"] = {"Message": "Access denied writing to s3://my-imagenet-bucket"}
    return task


def export_tasks(created):
    """The file system's tasks: an import, a failed export, an export of one run only, and the
    newest full export of runs/ at `created` (None: no such export)."""
    tasks = [data_repository_task("task-0aaaaaaaaaaaaaaa1", "2026-11-19T16:20:00.000000+00:00",
                                  kind="IMPORT_METADATA_FROM_REPOSITORY", paths=("imagenet",)),
             data_repository_task("task-0aaaaaaaaaaaaaaa2", "2026-11-21T08:00:00.000000+00:00",
                                  lifecycle="FAILED", failed=3),
             data_repository_task("task-0aaaaaaaaaaaaaaa3", "2026-11-21T09:00:00.000000+00:00",
                                  paths=("runs/smoke",))]
    if created:
        tasks.append(data_repository_task(TASK, created))
    return {"DataRepositoryTasks": tasks}


def association(auto_export=("NEW", "CHANGED", "DELETED"), path="/runs"):
    """A data repository association as DescribeDataRepositoryAssociations returns it."""
    s3 = {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    if auto_export:
        s3["AutoExportPolicy"] = {"Events": list(auto_export)}
    return {"Associations": [{
        "AssociationId": "dra-0123456789abcdef0",
        "ResourceARN": "arn:aws:fsx:us-west-2:123456789012:association/fs-0123456789abcdef0/"
                       "dra-0123456789abcdef0",
        "FileSystemId": FILE_SYSTEM, "Lifecycle": "AVAILABLE", "FileSystemPath": path,
        "DataRepositoryPath": "s3://my-imagenet-bucket/runs", "BatchImportMetaDataOnCreate": True,
        "ImportedFileChunkSize": 1024, "S3": s3, "Tags": [],
        "CreationTime": "2026-11-18T12:00:00.000000+00:00"}]}
