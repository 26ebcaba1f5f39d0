"""A team's project on a verified torch image (`imagebuilder project`, docs/projects.md).

- source.py: the project folder -> `Project` (pyproject.toml, uv.lock, pylock.toml, requirements.txt);
- base.py: the base found in the engine (pulled if need be), refused unless imagebuilder made it, pinned;
- probe.py: what an image's venv holds, read inside it, and the torch family compared byte for byte;
- lock.py: the project's requirements resolved under the base's packages (conflicts before any build);
- render.py (pure): the Dockerfile, at most three layers over the base's;
- command.py: read, resolve, build, prove, tag, push, sign: `project_command(ProjectRequest)`.
- report.py: the --report, kept as the run goes and written however it ends.

The names below are what the CLI uses; everything else imports from the defining module.
"""

from __future__ import annotations

from .command import ProjectRequest, project_command

__all__ = ["ProjectRequest", "project_command"]
