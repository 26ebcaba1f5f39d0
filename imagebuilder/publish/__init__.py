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
"""

from __future__ import annotations

from .blobs import Before, Layer, Layers, check_before, published_layers, pushed_layers
from .indexes import (UNCHANGED, WRITE, WRITTEN, IndexChild, IndexOutcome, IndexRegistry, IndexStep, MergeIncomplete,
                      plan_indexes, write_indexes)
from .ledger import Ledger, report_document
from .lookup import lookup
from .plan import (BUILD, FAILED, INTERRUPTED, NOT_RUN, PUSHED, RETAG, RETAGGED, SKIP, SKIPPED, VERIFIED, Outcome,
                   Remote, RunOptions, Step, dated_ref, plan)
from .push import PushedOtherContent, PushNotConfirmed, export_for
from .command import report_indexes, run_and_report
from .report import EventPrinter, PublishFailed, format_indexes, format_plan, format_summary, raise_if_failed
from .run import Event, Verifier, publish, publish_all, smoke_test

__all__ = [
    "BUILD", "FAILED", "INTERRUPTED", "NOT_RUN", "PUSHED", "RETAG", "RETAGGED", "SKIP", "SKIPPED", "UNCHANGED",
    "VERIFIED", "WRITE", "WRITTEN", "Before", "Event", "EventPrinter", "IndexChild", "IndexOutcome", "IndexRegistry",
    "IndexStep", "Layer", "Layers", "Ledger", "MergeIncomplete", "Outcome", "PublishFailed", "PushNotConfirmed",
    "PushedOtherContent", "Remote", "RunOptions", "Step", "Verifier", "check_before", "dated_ref", "export_for",
    "format_indexes", "format_plan", "format_summary", "lookup", "plan", "plan_indexes", "publish", "publish_all",
    "published_layers", "pushed_layers", "raise_if_failed", "report_document", "report_indexes", "run_and_report",
    "smoke_test", "write_indexes",
]
