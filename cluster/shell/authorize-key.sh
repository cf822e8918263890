#!/bin/sh
# On every node (node_setup/ssh/distribute.py): make LINE the only authorized_keys line that ends
# with the cluster key's comment MARK, then print "unchanged" or "written". A line of an older
# distribution (another key, another `from=` list) is replaced; every other line is kept.
# Header: FILE (relative to the home directory), LINE, MARK.
cd || exit 1
umask 077
mkdir -p "$(dirname "$FILE")" && touch "$FILE" && chmod 600 "$FILE" || exit 1
if grep -qxF -- "$LINE" "$FILE"; then
  echo unchanged
  exit 0
fi
awk -v mark=" $MARK" 'length($0) < length(mark) || substr($0, length($0) - length(mark) + 1) != mark' \
  "$FILE" > "$FILE.xc-new" || exit 1
printf '%s\n' "$LINE" >> "$FILE.xc-new" && chmod 600 "$FILE.xc-new" && mv -f "$FILE.xc-new" "$FILE" || exit 1
echo written
