"""The only package that talks to a container engine (with registry auth, the only users of `docker`).

- api.py: the value objects (BuildRequest, BuildResult, RunResult, Progress) and the small
  protocols the rest of imagebuilder sees: Builder (with its `kind`), ImageStore, Runner, Pusher;
- docker.py: DockerEngine, the Docker SDK adapter behind ImageStore, Runner and Pusher;
- docker_client.py: the connection to the daemon as docker makes it, a silent daemon said and given up on;
- classic.py: the Engine API's classic builder; classic_stream.py (pure) the parser of its stream;
- buildkit.py: BuildKit through the docker CLI, and the parser of its plain progress;
- background.py: the docker CLI as a process of its own: stopped as a Ctrl-C stops it, and a build
  run in the background (the registry cache's export) waited for against its deadline;
- select.py: which builder a command uses, decided once without building (dry runs too);
- errors.py: what can go wrong, and what to do about each.

imagebuilder's own modules import from the module that defines a name (engine.api, engine.errors,
engine.docker, ...), and so do the tests. The names below are what code outside imagebuilder
uses (bench/); importing the package loads no `docker` module.
"""

from .api import Builder, BuildRequest, BuildResult
from .docker import DockerEngine

__all__ = ["BuildRequest", "BuildResult", "Builder", "DockerEngine"]
