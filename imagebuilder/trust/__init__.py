"""Trust: what an image says about itself (its labels, provenance, the SBOM it writes) and the proofs of it
(cosign, publish's signing, verify's signature check); the CA files a user gives.

The face: what the commands (cli, options, pipeline) use; the rest of imagebuilder imports
from the module that defines a name."""

from .certificates import read_ca_bundle, read_certificates
from .cosign import Cosign
from .signing import key_reference

__all__ = ["Cosign", "key_reference", "read_ca_bundle", "read_certificates"]
