"""eStargz layers ordered by what an image's start reads (issue 44).

| module | what it holds |
|---|---|
| `writer.py` | an uncompressed layer tar -> one eStargz blob: the prioritized files first, the prefetch landmark, the rest, the TOC and footer; gzip members compressed on every core |
| `order.py` | the order entries are written in: the start profile's files with their parents, the landmark, the rest |
| `zstdchunked.py` | zstd:chunked's bytes: the same layout in zstd frames (libzstd through ctypes), its TOC frame, footer and annotations |
| `toc.py` | the format's bytes, pure: TOC entries and JSON, gzip members, the footer, the annotations' names |
| `profile.py` | the start profile: the files a command opens when the image starts, recorded with strace from the host |
| `trace.py` | pure: strace's flags, and its output -> the profile's files, in first-open order |
| `saved.py` | a local image's layers as uncompressed tars, from the engine's `docker save`, each checked against its diff_id |

publish/estargz.py puts them together at the push: `publish --compression estargz|zstd:chunked`.
"""
