#!/bin/bash
# xeon-cluster auto-stop install (cluster/node/autostop.py install_section): a section of the install
# script, which defines xc, SUDO and CHANGED. Writes the service and the power-off command into
# BIN_DIR and, where systemd runs the machine (never on a local cluster's node, whose systemd
# would be the host's), enables UNIT so the service runs again after a reboot.
# Reports as `progress` (the install's steps stay apt, venv, project), or a failed `step`.
# Header: BIN_DIR SERVICE_PATH POWEROFF_PATH STOP_GROUP_PATH SERVICE_TEXT POWEROFF_TEXT STOP_GROUP_TEXT
# UNIT (empty: no unit).
put_executable() {  # PATH TEXT: write it when it differs (returns 0), else 1
  if [ -f "$1" ] && [ "$(cat "$1")" = "$(printf '%s' "$2")" ]; then return 1; fi
  printf '%s' "$2" > "$1.tmp.$$" && chmod 755 "$1.tmp.$$" && mv -f "$1.tmp.$$" "$1"
}
if [ ! -d "$BIN_DIR" ] || [ ! -w "$BIN_DIR" ]; then
  if ! { $SUDO mkdir -p "$BIN_DIR" && $SUDO chown "$(id -u):$(id -g)" "$BIN_DIR"; }; then
    xc step autostop failed "cannot create $BIN_DIR"; exit 50
  fi
fi
as_changed=""
put_executable "$SERVICE_PATH" "$SERVICE_TEXT" && as_changed="$SERVICE_PATH"
put_executable "$POWEROFF_PATH" "$POWEROFF_TEXT" && as_changed="$as_changed $POWEROFF_PATH"
put_executable "$STOP_GROUP_PATH" "$STOP_GROUP_TEXT" && as_changed="$as_changed $STOP_GROUP_PATH"
if [ -n "$UNIT" ] && [ "$("$POWEROFF_PATH" mode)" = system ] && [ -d /run/systemd/system ] && command -v systemctl > /dev/null 2>&1; then
  unit_text="[Unit]
Description=xeon-cluster idle auto-stop (acts only on the master it was armed on)
After=network-online.target cloud-final.service

[Service]
User=$(id -un)
ExecStart=/bin/bash $SERVICE_PATH run
Restart=always
RestartSec=30

[Install]
WantedBy=multi-user.target"
  if [ "$($SUDO cat "/etc/systemd/system/$UNIT" 2>/dev/null)" != "$unit_text" ]; then
    if printf '%s\n' "$unit_text" | $SUDO tee "/etc/systemd/system/$UNIT" > /dev/null && $SUDO systemctl daemon-reload \
       && $SUDO systemctl enable --now "$UNIT" > /dev/null 2>&1; then
      as_changed="$as_changed $UNIT"
    else
      xc step autostop failed "cannot enable $UNIT"; exit 51
    fi
  fi
fi
if [ -n "$as_changed" ]; then
  xc progress autostop "installed ${as_changed# }"
  # shellcheck disable=SC2034  # read by the install script this section is part of
  CHANGED=1
else
  xc progress autostop "unchanged: $SERVICE_PATH already installed"
fi
