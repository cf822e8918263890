#!/bin/bash
# xeon-cluster auto-stop: set the cluster's worker group to 0, then the master's group (cluster/node/autostop.py
# stop_group_script), installed as STOP_GROUP_PATH; the service runs it before it powers the nodes off, so that
# neither group launches them again. The groups' names and region are in ~/STATE_DIR/GROUP_FILE
# (written by fab on an AWS cluster: name=..., region=..., master=...), checked here again whole-value.
# The calls are made with the master role's credentials from the instance metadata (the role may set
# exactly these two groups' minimum and maximum size to 0, infra/node_role.py; the desired capacity follows
# them): the AWS CLI when the image has it, else boto3 from a node venv.
# Prints one line per group; exit 0 once AWS accepted every change, 3 without a group file (nothing to do).
# Header: STATE_DIR GROUP_FILE VENV_GLOB
set -uo pipefail
f="$HOME/$STATE_DIR/$GROUP_FILE"
[ -f "$f" ] || { echo "no worker group recorded"; exit 3; }
name=$(sed -n 's/^name=//p' "$f" | head -n 1)
region=$(sed -n 's/^region=//p' "$f" | head -n 1)
master=$(sed -n 's/^master=//p' "$f" | head -n 1)
[[ "$name" =~ ^[A-Za-z0-9._-]{1,255}$ ]] || { echo "worker group: bad name in $f"; exit 2; }
[[ "$region" =~ ^[a-z]{2}(-[a-z]+)+-[0-9]$ ]] || { echo "worker group: bad region in $f"; exit 2; }
[ -z "$master" ] || [[ "$master" =~ ^[A-Za-z0-9._-]{1,255}$ ]] || { echo "master group: bad name in $f"; exit 2; }

stop() {  # WHAT NAME: min, max and desired 0; prints one line, 0 once AWS accepted it
  if command -v aws > /dev/null 2>&1; then
    if aws autoscaling update-auto-scaling-group --region "$region" --auto-scaling-group-name "$2" \
         --min-size 0 --max-size 0 --desired-capacity 0; then
      echo "$1 $2: min, max and desired 0 (aws CLI)"; return 0
    fi
  fi
  for py in $VENV_GLOB; do
    if ! { [ -x "$py" ] && "$py" -c 'import boto3' 2> /dev/null; }; then continue; fi
    "$py" - "$1" "$2" "$region" << 'PY'
import sys

import boto3

what, name, region = sys.argv[1], sys.argv[2], sys.argv[3]
boto3.client("autoscaling", region_name=region).update_auto_scaling_group(
    AutoScalingGroupName=name, MinSize=0, MaxSize=0, DesiredCapacity=0)
print(f"{what} {name}: min, max and desired 0 (boto3)")
PY
    return $?
  done
  echo "$1 $2: no aws CLI and no node venv with boto3 to set it to 0"
  return 1
}

# The workers' group first: the master (which runs this) goes last.
stop "worker group" "$name" || exit 1
[ -z "$master" ] || stop "master group" "$master" || exit 1
exit 0
