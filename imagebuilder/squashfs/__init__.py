"""An image's root as one squashfs, published beside it, for Slurm's pyxis/enroot (issue 43).

| module | what it holds |
|---|---|
| `layers.py` | the layers applied in order, whiteouts honoured (pure decisions, thin tar I/O) |
| `enroot.py` | pure: the files enroot's import writes from the image config (/etc/environment, /etc/rc, ...) |
| `make.py` | registry image -> squashfs file (fetch, check, unpack, configure, mksquashfs) |
| `artifact.py` | the OCI artifact referring to the image: push, find (referrers API or its fallback tag) |
| `fetch.py` | `imagebuilder squashfs`: the artifact found, checked and written atomically |
"""
