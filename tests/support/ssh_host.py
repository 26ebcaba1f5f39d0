"""A Docker daemon reached over SSH (DOCKER_HOST=ssh://...): this machine's, behind our own sshd."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


SSHD = Path("/usr/sbin/sshd")


class SshDockerHost:
    """This machine's Docker daemon behind our own sshd on 127.0.0.1:PORT: what `DOCKER_HOST=
    ssh://user@host` reaches on a remote GPU box. The ssh client side (a key, the host key in
    known_hosts) lives in `home`, so a client given HOME=home logs in without prompts."""

    def __init__(self, root: Path, port: int) -> None:
        import getpass

        self.root, self.port = root, port
        self.user = getpass.getuser()
        self.url = f"ssh://{self.user}@127.0.0.1:{port}"
        self.home = root / "home"
        self.log = root / "sshd.log"
        self.process: subprocess.Popen[bytes] | None = None

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a client that reaches the daemon only through this sshd."""
        env = {key: value for key, value in os.environ.items() if key not in ("SSH_AUTH_SOCK", "DOCKER_CONTEXT")}
        return {**env, "HOME": str(self.home), "DOCKER_HOST": self.url, **extra}

    def logins(self) -> int:
        return self.log.read_text().count(f"Accepted publickey for {self.user} from 127.0.0.1")
