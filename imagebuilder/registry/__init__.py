"""The registry: the protocol publish uses (api), the HTTP client over its transport, auth and retries;
image references and manifests.

The face: what the commands (cli, options, pipeline) use; the rest of imagebuilder imports
from the module that defines a name."""

from .reference import RegistryTarget, check_repository, parse_reference
from .retry import REGISTRY_POLICY, RetryPolicy

__all__ = ["REGISTRY_POLICY", "RegistryTarget", "RetryPolicy", "check_repository", "parse_reference"]
