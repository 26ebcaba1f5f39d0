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
- command.py: the command's run and its dry run over them (run_and_report, report_indexes).

The modules' own docstrings say the rules (when an image is skipped or re-pointed, the dated
tags, what counts as pushed, signing).

The names below are what imagebuilder outside this package uses (the CLI and the planner in
pipeline.py); everything else, tests included, imports from the module that defines it.
"""

from __future__ import annotations

from .command import report_indexes, run_and_report
from .indexes import IndexOutcome, IndexRegistry, IndexStep, plan_indexes, write_indexes
from .ledger import Ledger
from .lookup import lookup
from .plan import RunOptions, Step, plan
from .report import EventPrinter, format_plan

__all__ = [
    "EventPrinter", "IndexOutcome", "IndexRegistry", "IndexStep", "Ledger", "RunOptions", "Step", "format_plan",
    "lookup", "plan", "plan_indexes", "report_indexes", "run_and_report", "write_indexes",
]
