"""What the duplex engine's frame clock makes of a failed frame.

A frame that raises is survived: logged, counted, its sessions get no frame for that tick,
and the clock goes on. Two kinds of failure end the clock instead (`ClockDeath`):

* a sticky device error (`sticky`): after an illegal memory access, a device-side assert or
  an uncorrectable ECC error the CUDA context is unusable for the rest of the process, so
  every later frame would fail too. Nothing in-process brings it back: the process exits
  (`exit_for_supervisor`) and its supervisor starts a fresh one;
* `FAILED_IN_A_ROW` frames failing one after another (a fault that is not sticky but does
  not go away by itself): the clock is restarted in-process with its rows cleared.

The test for a sticky error is `pipeline/device_faults.sticky_reason` (the exception's
text, as PyTorch raises them as RuntimeErrors: "CUDA error: an illegal memory access was
encountered"); CI has no GPU, so the tests raise such a RuntimeError through a seam.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...device_faults import exit_now, sticky_reason

log = logging.getLogger("parley.moshi.clock")

FAILED_IN_A_ROW = 5
"""Frames failing one after another (400 ms of the conversation) that end the clock."""

EXIT_STICKY = 70
"""The process's exit status after a sticky device error (EX_SOFTWARE): not 0, so a
supervisor that restarts on failure (systemd's `Restart=on-failure`) restarts it."""


def is_sticky(error: BaseException) -> bool:
    """Whether `error` leaves the device unusable for the rest of the process (the same
    test as every other GPU stage's: `pipeline/device_faults.py`)."""
    return sticky_reason(error) is not None


@dataclass(frozen=True, slots=True)
class ClockDeath:
    """Why the clock stopped by itself."""

    reason: str
    sticky: bool
    """The process must exit (a restart in-process cannot help)."""


def exit_for_supervisor(reason: str) -> None:
    """End the process at once so its supervisor starts a fresh one: a process whose GPU
    context is gone serves nothing, and a clean shutdown could hang on the device. Its
    sessions have been ended (their clients told) before this is called."""
    log.critical(
        "moshi clock: %s; the device cannot be used again in this process: exiting with "
        "status %d so the supervisor restarts it",
        reason,
        EXIT_STICKY,
    )
    exit_now(EXIT_STICKY)
