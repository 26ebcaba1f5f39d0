"""The build side: one image planned once (image_plan) and rendered once (render), its build context, the one
loop over the platforms, the build and the labels it adds, the matrix's listing.

The face: what the commands (cli, options, pipeline) use; the rest of imagebuilder imports
from the module that defines a name."""

from .context_folder import PSEUDO_FILE_SYSTEMS, check_output, file_system_type
from .per_platform import (Exists, Reading, ReadOsState, base_os_reader, check_each_platform, check_for_any_os,
                           each_platform)
from .platforms import host_platform, parse_base_images, parse_platforms
from .render import RenderedImage
from .render_options import RenderOptions, RenderRequest, for_command
from .run import build_all, report_plan

__all__ = ["Exists", "PSEUDO_FILE_SYSTEMS", "ReadOsState", "Reading", "RenderOptions", "RenderRequest", "RenderedImage",
           "base_os_reader", "build_all", "check_each_platform", "check_for_any_os", "check_output", "each_platform",
           "file_system_type", "for_command", "host_platform", "parse_base_images", "parse_platforms", "report_plan"]
