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
- gate.py: ScanGate, publish's scan of each image after verify and before push; Scanning, its options;
- fixes.py (pure): the security suite's fixes an image on a base will hold (rendered into its apt step);
- updates.py: OsStates, each base image's OS read once (its dpkg status, the suite's indexes).

The names below are what code outside the package uses (the CLI, publish).
"""

from .allowlist import load_allowlist
from .gate import Scanning
from .mirror import HttpMirror
from .run import ScanRequest, scan_image
from .updates import OsStates, cached

__all__ = ["HttpMirror", "OsStates", "ScanRequest", "Scanning", "cached", "load_allowlist", "scan_image"]
