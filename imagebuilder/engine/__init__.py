"""The only package that talks to a container engine (with registry auth, the only users of `docker`).

- api.py: the value objects (BuildRequest, BuildResult, RunResult, Progress) and the small
  protocols the rest of imagebuilder sees: Builder (with its `kind`), ImageStore, Runner, Pusher;
- docker.py: DockerEngine, the Docker SDK adapter behind ImageStore, Runner and Pusher;
- classic.py: the Engine API's classic builder and the parser of its stream;
- buildkit.py: BuildKit through the docker CLI, and the parser of its plain progress;
- background.py: the docker CLI as a process of its own: stopped as a Ctrl-C stops it, and a build
  run in the background (the registry cache's export) waited for against its deadline;
- select.py: which builder a command uses, decided once without building (dry runs too);
- errors.py: what can go wrong, and what to do about each.

The names below are the package's interface; importing it loads no `docker` module.
"""

from .api import (NO_ACCESS, Builder, BuilderKind, BuildRequest, BuildResult, Engine, HostAccess, ImageInspector,
                  ImageStore, OnProgress, Progress, Pushed, Pusher, Runner, RunResult, check_request)
from .docker import DockerEngine
from .errors import (BaseImageMissing, BuildFailed, BuildTimedOut, ContainerFailed, DaemonUnavailable, EngineError,
                     GpuUnavailable, ImageMissing, PullFailed, PushFailed, TagFailed)

__all__ = [
    "NO_ACCESS", "BaseImageMissing", "BuildFailed", "BuildRequest", "BuildResult", "BuildTimedOut", "Builder",
    "BuilderKind", "ContainerFailed", "DaemonUnavailable", "DockerEngine", "Engine", "EngineError", "GpuUnavailable",
    "HostAccess", "ImageInspector", "ImageMissing", "ImageStore", "OnProgress", "Progress", "PullFailed", "PushFailed",
    "Pushed", "Pusher",
    "RunResult", "Runner", "TagFailed", "check_request",
]
