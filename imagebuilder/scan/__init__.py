"""`imagebuilder scan`: an image's packages against the fixes its OS published, and an OSV file.

- debian.py (pure): dpkg's version order, deb822 (dpkg status, Packages indexes), changelogs and
  the CVE ids their entries name;
- release.py (pure): the image's OS from /etc/os-release, and its security suite on a mirror;
- debfile.py: a .deb's changelog.Debian.gz (ar, then data.tar.*);
- mirror.py: the mirror over HTTP: a Packages index, a .deb checked against the index;
- osv.py: OSV records (a zip or a folder) against Python packages;
- allowlist.py: the allowlist file (id, reason, expires), refused whole when malformed;
- report.py: ScanReport (format, to_json, raise_if_vulnerable);
- run.py: scan_image(), over the image's files and the mirror handed in;
- gate.py: ScanGate, publish's scan of each image after verify and before push.

The names below are what code outside the package uses (the CLI).
"""

from .allowlist import load_allowlist
from .gate import ScanGate
from .mirror import HttpMirror
from .run import ScanRequest, scan_image

__all__ = ["HttpMirror", "ScanGate", "ScanRequest", "load_allowlist", "scan_image"]
