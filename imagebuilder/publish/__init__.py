"""Plan -> build -> verify -> push for many images.

- plan.py (pure): the vocabulary (Step, Remote, RunOptions, Outcome) and plan(): rendered
  images + what the registry holds -> one Step per image, in build order;
- lookup.py: what the registry holds under each image's tags (digests, the inputs-hash label);
- run.py: publish() runs the steps over an Engine and a Registry, per image build -> verify ->
  push -> sign, yielding one Outcome per image; publish_all() runs every platform's plan;
- push.py: one image's push, mount, confirmation and signing, through the declared protocols;
- blobs.py: each published image's layers for the report, and which the registry had before;
- indexes.py: the image indexes over each tag's platform images, planned (reads) then written;
- report.py: the lines, the summary and the failure that ends a run;
- ledger.py: the --report document, kept as the run goes and written however it ends;
- request.py: PublishRequest, what the command was asked, as one value;
- planner.py: the images per platform compared with the registry (PublishPlan), and the checks
  made before a daemon or registry is asked;
- command.py: the command (publish_command): the checks, the plan, the run or its dry run over them.

The modules' own docstrings say the rules (when an image is skipped or re-pointed, the dated
tags, what counts as pushed, signing).

The names below are what imagebuilder outside this package uses (the CLI's PublishRequest and
publish_command); everything else, tests included, imports from the module that defines it.
"""

from __future__ import annotations

from .command import publish_command
from .request import PublishRequest

__all__ = ["PublishRequest", "publish_command"]
