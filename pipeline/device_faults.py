"""Device errors after which a process's CUDA context is unusable, and the test hook that fakes one.

Most errors of a model call are the call's own (a bad input, a shape the code did not
expect, memory short for one batch): the next call may well succeed. A few are not. After an
illegal memory access, a device-side assert, an uncorrectable ECC error or an unspecified
launch failure, CUDA marks the context as failed ("sticky"): every later call of that
process, whatever it is, fails with the same error until the process exits. An engine that
caught such an error per batch would go on answering every request with it while its
heartbeat vouched for it. `sticky_reason` tells these apart from the rest, by the message
CUDA gives (torch raises them as `torch.AcceleratorError`, a RuntimeError, or as a plain
RuntimeError in older versions, sometimes wrapped in another error); the model thread that
sees one marks its engine broken (`model_thread.ModelThread.fatal`) and the process serving
the engine exits so its supervisor starts a fresh one (`worker_main`, `stage_host`, the
server for a stage in its own process: docs/engines/faults.md).

Real sticky errors need a GPU. Tests (and an operator's drill) fake one through
`INJECT_ENV`: set to a file path, every model thread of the processes that inherit it checks,
before each call, whether that file exists; the first thread whose name the file names (or
any, if the file is empty) removes it and raises `InjectedDeviceFault`, whose message is a
real sticky one. A file whose text starts with `real ` (`real parley-qwen3_omni.talker`)
makes a real one instead where a CUDA device is in use: an index out of bounds on the
device, which trips a device-side assert and leaves the context failed, as a bug in a
kernel would (for the fault drill on a GPU host). Unset (the default), nothing is checked.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

STICKY_MARKERS = (
    "illegal memory access",
    "an illegal instruction was encountered",
    "device-side assert triggered",
    "unspecified launch failure",
    "uncorrectable ecc error",
    "misaligned address",
    "hardware stack error",
    "invalid program counter",
    "the launch timed out and was terminated",
    "operation not supported on global/shared address space",
    "mps client failed to connect",
    "mps server is not ready",
    "mps server has exited",
    "cuda error: unknown error",
)
"""Lower-case fragments of the CUDA runtime's messages for errors that leave the context
failed (cudaErrorIllegalAddress, -Assert, -LaunchFailure, -ECCUncorrectable, -Misaligned
Address, -HardwareStackError, -InvalidPc, -LaunchTimeout, -InvalidAddressSpace, the MPS
client's connection errors, and the driver's unknown error, which follows a lost device)."""

INJECT_ENV = "PARLEY_INJECT_DEVICE_FAULT"


class InjectedDeviceFault(RuntimeError):
    """A fake sticky error (`INJECT_ENV`): what a device-side assert says, for tests."""


class DeviceLost(RuntimeError):
    """A call on a model thread whose device already failed stickily: it was not run."""


def sticky_reason(error: BaseException) -> str | None:
    """Why `error` leaves this process's CUDA context unusable (its first line), or None for
    an error that fails only the call it came from. The error's causes are looked at too
    (torch and the engines wrap errors)."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        if isinstance(found, RuntimeError) and not isinstance(found, DeviceLost):
            message = str(found)
            lowered = message.lower()
            if any(marker in lowered for marker in STICKY_MARKERS):
                first = message.strip().splitlines()[0] if message.strip() else message
                return f"{type(found).__name__}: {first}"
        found = found.__cause__ or found.__context__
    return None


def injected_fault(thread: str) -> InjectedDeviceFault | None:
    """The fake sticky error for the model thread named `thread`, once (`INJECT_ENV`)."""
    path = os.environ.get(INJECT_ENV)
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as file:
            wanted = file.read().strip()
        real = wanted == "real" or wanted.startswith("real ")
        wanted = wanted.removeprefix("real").strip()
        if wanted and wanted not in thread:
            return None
        os.unlink(path)  # one fault per file: a race with another thread loses here
    except OSError:
        return None
    if real:
        real_device_assert()  # raises the device's own error where it has one
    return InjectedDeviceFault(
        f"CUDA error: device-side assert triggered (injected into {thread} by {INJECT_ENV})"
    )


def real_device_assert() -> None:
    """Trip a real device-side assert on this thread's CUDA device (an index past a tensor's
    end, read back so that the error surfaces here); nothing without CUDA."""
    import torch  # only a drill on a GPU host gets here

    if not torch.cuda.is_available():
        return
    table = torch.zeros(4, device="cuda")
    past_the_end = torch.tensor([1 << 20], device="cuda")
    table[past_the_end].sum().item()
    torch.cuda.synchronize()


def exit_now(status: int) -> NoReturn:
    """End this process at once with `status`, its log lines flushed first. No clean-up
    runs: after a sticky error, freeing device memory or torch's exit hooks could hang on
    the failed context, and the supervisor starts a fresh process."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stderr.flush()
    os._exit(status)
