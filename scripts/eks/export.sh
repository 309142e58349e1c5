#!/usr/bin/env bash
# Exports the runs on the FSx for Lustre file system (/fsx/runs in the pods, runs/ on the file
# system: checkpoints, metrics, the final model) to S3, and waits until the export has ended. The
# file system behind k8s/fsx is scratch and dies with its claim, so run this after each run worth
# keeping, and before scripts/eks/teardown.sh, which refuses to delete a file system whose runs
# were not exported since the last training pod ended.
# Where they go depends on how the file system is linked to S3:
#   - an import path (k8s/fsx: SCRATCH_2, s3ImportPath): an export data repository task to its
#     export path (s3ExportPath: by default the bucket's root, so /fsx/runs/RUN becomes
#     s3://BUCKET/runs/RUN);
#   - a data repository association (DRA) that covers /runs: with automatic export (NEW and
#     CHANGED events) it exports every change by itself, so there is nothing to do; without it,
#     an export task to the association's S3 path;
#   - neither: exit 2, naming how to link one.
# Only files created or changed since the last export are copied, so running it again is cheap.
# Usage: AWS_REGION=... scripts/eks/export.sh [RUN...]
#   RUN   a folder under /fsx/runs (the last part of a config's output_dir, e.g. resnet50-p3);
#         default: all of /fsx/runs
#   FSX_FILE_SYSTEM_ID   the file system (default: the one behind the claim fsx-claim)
#   EXPORT_WAIT_S        how long to wait for the export (default 3600 s); it goes on past that
# Exit 0 once exported, 1 when the export failed or is still running at the deadline, 2 when
# there is nothing to export to. Prints the commands it runs. KUBECTL and AWS name the tools.
set -euo pipefail
: "${AWS_REGION:?set AWS_REGION}"
kubectl=${KUBECTL:-kubectl}
aws=${AWS:-aws}
wait_s=${EXPORT_WAIT_S:-3600}
export AWS_REGION
run() {
  echo "+ $*" >&2
  "$@"
}

paths=()
for name in "$@"; do
  name=${name#/fsx/runs/}
  name=${name%/}
  if [ -z "$name" ] || [[ "$name" == /* || "$name" == *..* || "$name" == -* ]]; then
    echo "eks-export: '$name' is not a folder under /fsx/runs. HINT: give the last part of a" \
      "config's output_dir (output_dir = \"/fsx/runs/resnet50-p3\": resnet50-p3), or nothing" \
      "for all of /fsx/runs" >&2
    exit 2
  fi
  paths+=("runs/$name")
done
[ ${#paths[@]} -gt 0 ] || paths=(runs)

# The file system: the volume handle of the volume behind fsx-claim (its ID, dynamic or static).
file_system=${FSX_FILE_SYSTEM_ID:-}
if [ -z "$file_system" ]; then
  volume=$("$kubectl" get pvc fsx-claim -o 'jsonpath={.spec.volumeName}' 2>/dev/null) || volume=""
  if [ -n "$volume" ]; then
    file_system=$("$kubectl" get pv "$volume" -o 'jsonpath={.spec.csi.volumeHandle}')
  fi
fi
if [[ "$file_system" != fs-* ]]; then
  echo "eks-export: no FSx file system: the claim fsx-claim in kubectl's current context is not" \
    "bound to an FSx volume (volume handle: '$file_system'). HINT: set FSX_FILE_SYSTEM_ID=fs-..." \
    "(aws fsx describe-file-systems)" >&2
  exit 2
fi

# Pods of the trainer that still run write after this export; the export is still made.
running=$("$kubectl" get pods -l app.kubernetes.io/name=resnet-trainer --no-headers \
  -o 'custom-columns=NAME:.metadata.name,PHASE:.status.phase' 2>/dev/null |
  awk '$2 != "Succeeded" && $2 != "Failed" {print $1}' | xargs) || running=""
if [ -n "$running" ]; then
  echo "eks-export: WARNING: still running, writing to /fsx/runs after this export: $running." \
    "Export again once they have ended (scripts/eks/teardown.sh checks that you did)." >&2
fi

# Where runs/ goes: a data repository association that covers /runs, else the import path's
# export path. (A file system has one or the other: FSx refuses an export path beside a DRA.)
covers_runs="Lifecycle=='AVAILABLE' && contains(['/', '/runs', '/runs/'], FileSystemPath)"
fields="AssociationId, FileSystemPath, DataRepositoryPath"
events="join(',', S3.AutoExportPolicy.Events || \`[]\`)"
association=$("$aws" fsx describe-data-repository-associations \
  --filters "Name=file-system-id,Values=$file_system" --output text \
  --query "Associations[?$covers_runs] | [0].[$fields, $events]" 2>/dev/null) || association=""
target=""
if [[ "$association" == dra-* ]]; then
  read -r association_id fs_path s3_path events <<<"$association"
  # The association maps its file system path to its S3 path: / to the bucket path, /runs to it.
  target=${s3_path%/}
  if [ "${fs_path%/}" != /runs ]; then target=$target/runs; fi
  if [[ ",$events," == *,NEW,* && ",$events," == *,CHANGED,* ]]; then
    echo "eks-export: $file_system exports /runs to $target by itself, as files change" \
      "(data repository association $association_id, automatic export: $events): nothing to do."
    exit 0
  fi
else
  export_path=$("$aws" fsx describe-file-systems --file-system-ids "$file_system" \
    --query 'FileSystems[0].LustreConfiguration.DataRepositoryConfiguration.ExportPath' \
    --output text)
  if [[ "$export_path" == s3://* ]]; then target=${export_path%/}/runs; fi
fi
if [ -z "$target" ]; then
  echo "eks-export: $file_system has no S3 path to export /runs to: no export path and no data" \
    "repository association that covers /runs. HINT: link one (PERSISTENT_2, or SCRATCH_2 and" \
    "PERSISTENT_1 made without an import path): aws fsx create-data-repository-association" \
    "--file-system-id $file_system --file-system-path /runs --data-repository-path" \
    "s3://BUCKET/runs --s3 'AutoExportPolicy={Events=[NEW,CHANGED,DELETED]}'" >&2
  exit 2
fi

# FSx runs one data repository task at a time on a file system: while another runs, this one is
# refused (the aws CLI prints why).
if ! task=$(run "$aws" fsx create-data-repository-task --type EXPORT_TO_REPOSITORY \
  --file-system-id "$file_system" --paths "${paths[@]}" --report Enabled=false \
  --query DataRepositoryTask.TaskId --output text); then
  echo "eks-export: could not start the export (above). HINT: if a task is running, wait for" \
    "it (aws fsx describe-data-repository-tasks --filters" \
    "Name=file-system-id,Values=$file_system) and run this again" >&2
  exit 1
fi
echo "eks-export: $task exports ${paths[*]} of $file_system to $target" >&2

deadline=$((SECONDS + wait_s))
while :; do
  state=$("$aws" fsx describe-data-repository-tasks --task-ids "$task" --output text --query \
    'DataRepositoryTasks[0].[Lifecycle, Status.[TotalCount, SucceededCount, FailedCount]][]')
  read -r lifecycle total succeeded failed <<<"$state"
  case "$lifecycle" in
    SUCCEEDED)
      if [ "${failed:-0}" = 0 ] || [ "$failed" = None ]; then
        echo "eks-export: exported ${paths[*]} of $file_system to $target (task $task:" \
          "${succeeded:-0} of ${total:-0} files)."
        exit 0
      fi
      break ;;
    FAILED | CANCELED | CANCELING) break ;;
  esac
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "eks-export: $task is still $lifecycle after $wait_s s (${succeeded:-0} of ${total:-?}" \
      "files); it goes on. HINT: aws fsx describe-data-repository-tasks --task-ids $task shows" \
      "when it has SUCCEEDED (EXPORT_WAIT_S waits longer)" >&2
    exit 1
  fi
  sleep "${POLL_S:-15}"
done
why=$("$aws" fsx describe-data-repository-tasks --task-ids "$task" \
  --query 'DataRepositoryTasks[0].FailureDetails.Message' --output text)
echo "eks-export: $task ended $lifecycle: ${failed:-?} of ${total:-?} files not exported" \
  "(${why:-no reason given}). HINT: run it again (it copies only what is missing); the failed" \
  "files' names: the same aws fsx create-data-repository-task with --report" \
  "Enabled=true,Path=s3://BUCKET/PREFIX,Format=REPORT_CSV_20191124,Scope=FAILED_FILES_ONLY" >&2
exit 1
