"""Pure: the files enroot's import writes into an image's root from its config, so that a
squashfs made here starts under pyxis/enroot as the one `enroot import` would have made.

As enroot's src/docker.sh (`docker::_configure`) writes them, on top of every layer:
- /etc/environment: the config's Env, one VAR=VALUE a line (enroot's start exports them; pyxis
  gives them to the task);
- /etc/rc: the labels as comments, then `cd` to WorkingDir, source /etc/rc.local, and exec the
  Entrypoint with the task's arguments, else with Cmd (/bin/sh where the image has neither);
- /etc/rc.local: a comment (the place a site edits the command);
- /etc/fstab: each of the config's Volumes as a tmpfs.
And the mount points enroot and pyxis bind the host's files over (/etc/hosts,
/etc/resolv.conf): empty files where the image has none, since a squashfuse root is read-only.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

MOUNT_POINTS = ("etc/hosts", "etc/resolv.conf")
"""Files the runtime binds the host's over; made empty where the image lacks them."""

RC_LOCAL = ("# This file is sourced by /etc/rc when the container starts.\n"
            "# It can be used to manipulate the entrypoint or the command of the container.\n")


def enroot_files(config: Mapping[str, Any]) -> dict[str, str]:
    """Root-relative path -> text, for the image config document `config` (its "config" part
    holds Env, Entrypoint, Cmd, WorkingDir, Labels, Volumes)."""
    settings: Mapping[str, Any] = config.get("config") or {}
    env = [str(item) for item in settings.get("Env") or []]
    volumes = sorted(str(path) for path in (settings.get("Volumes") or {}))
    return {
        "etc/environment": "".join(f"{item}\n" for item in env),
        "etc/fstab": "".join(f"tmpfs {path} tmpfs x-create=dir,rw,nosuid,nodev\n" for path in volumes),
        "etc/rc": rc_script(settings),
        "etc/rc.local": RC_LOCAL,
    }


def rc_script(settings: Mapping[str, Any]) -> str:
    """enroot's /etc/rc for the config's labels, WorkingDir, Entrypoint and Cmd."""
    labels = settings.get("Labels") or {}
    comments = "".join(f"# {key} {value}\n" for key, value in labels.items())
    entrypoint: Sequence[str] = [str(word) for word in settings.get("Entrypoint") or []]
    command: Sequence[str] = [str(word) for word in settings.get("Cmd") or []]
    if not entrypoint and not command:
        command = ["/bin/sh"]
    workdir = settings.get("WorkingDir") or "/"
    start = " ".join(shlex.quote(word) for word in entrypoint)
    default = " ".join(shlex.quote(word) for word in [*entrypoint, *command])
    return (comments + ("\n" if comments else "")
            + f'cd {shlex.quote(str(workdir))} && unset OLDPWD || exit 1\n\n'
            + "if [ -s /etc/rc.local ]; then\n    . /etc/rc.local\nfi\n\n"
            + f'if [ $# -gt 0 ]; then\n    exec {start + " " if start else ""}"$@"\n'
            + f"else\n    exec {default}\nfi\n")
