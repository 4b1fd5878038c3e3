"""A launch whose manifest a run could not read back is refused before anything exists.

Every file of a run is read with a limit of 16 MiB (:data:`pisub.store.runs.MAX_FILE`): a
tasks file just under its own 16 MiB limit makes a workflow's manifest over it (each task
stands there with its key and indented), and the runner then failed reading its own launch
request. :func:`check_manifest_size` measures the manifest as it will be written.
"""

from __future__ import annotations

from pisub.errors import InvalidInput
from pisub.protocol.codec import encode_pretty
from pisub.protocol.manifest import Manifest
from pisub.store.runs import MAX_FILE

LATE_FIELDS = 16 * 1024
"""Room for what a workflow's launch adds to the manifest after the check (its mission's id,
project folder and warning)."""


def check_manifest_size(manifest: Manifest) -> None:
    """Refuse ``manifest`` when its file would be larger than a run's files may be.

    Raises:
        InvalidInput: naming its size and the limit (one line).
    """
    try:
        size = len(encode_pretty(manifest)) + LATE_FIELDS
    except (UnicodeEncodeError, ValueError):
        return  # text a file cannot hold: the run's creation refuses it, saying so
    if size > MAX_FILE:
        mib = MAX_FILE // (1024 * 1024)
        raise InvalidInput(
            f"the launch is too large: its run's manifest would be {size} bytes, over the {mib} MiB "
            f"({MAX_FILE} bytes) a run's files may hold; give fewer or shorter tasks"
        )
