#!/bin/sh
# A worker's first boot (cluster/node/boot_script.py): the workers' launch template carries this script as
# its user data, which cloud-init runs once per instance, as root; the local group keeper runs it the
# same way on a new machine. It makes LINE the only authorized_keys line of SSH_USER that ends with the
# cluster key's comment MARK, so the master (which holds the cluster key) reaches a worker the group
# launched after `fab distribute` ran. A line of an older key is replaced; every other line is kept.
# Header: SSH_USER, LINE, MARK. Argument: the home directory to write into (default: SSH_USER's).
set -u
umask 077
home=${1:-$(getent passwd "$SSH_USER" | cut -d: -f6)}
if [ -z "$home" ] || [ ! -d "$home" ]; then
  echo "xeon-cluster boot: no home directory for user $SSH_USER" >&2
  exit 1
fi
dir="$home/.ssh"
file="$dir/authorized_keys"
mkdir -p "$dir" && chmod 700 "$dir" && touch "$file" && chmod 600 "$file" || exit 1
if grep -qxF -- "$LINE" "$file"; then
  result=unchanged
else
  awk -v mark=" $MARK" 'length($0) < length(mark) || substr($0, length($0) - length(mark) + 1) != mark' \
    "$file" > "$file.xc-new" || exit 1
  printf '%s\n' "$LINE" >> "$file.xc-new" && chmod 600 "$file.xc-new" && mv -f "$file.xc-new" "$file" || exit 1
  result=written
fi
if [ "$(id -u)" = 0 ]; then
  chown "$SSH_USER:" "$dir" "$file" || exit 1
fi
echo "xeon-cluster boot: cluster key $result in $file"
