"""User-facing errors.

Anything the user can fix (a bad id, a bad file, a missing chat template) is raised as a `ProbeError`
whose message is one actionable line; the command-line entry points print it and exit with status 2,
without a traceback. Programming errors stay ordinary exceptions.
"""

from __future__ import annotations


class ProbeError(Exception):
    """An error the user can act on; its message is shown as is, on one line."""


class TemplateError(ProbeError):
    """The chat template does not split cleanly around the response, or there is none."""


class ModelLoadError(ProbeError):
    """The model or tokenizer could not be loaded from the given id or path."""


class ResumeError(ProbeError):
    """A run directory cannot be resumed with the current settings."""


class DataFormatError(ProbeError):
    """An input file (prompts, dataset) is in the wrong format; the message names the file and line."""
