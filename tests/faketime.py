"""A real process's wall clock, stepped while it runs: Debian's libfaketime behind one file.

The process starts with libfaketime preloaded and reading its offset from a file of its own
(`FAKETIME_TIMESTAMP_FILE`, re-read every second); `step` writes a new offset, which the
process sees within a second, exactly as a machine whose clock NTP or an operator stepped.
Only the wall clock moves (`FAKETIME_DONT_FAKE_MONOTONIC`): a step leaves `CLOCK_MONOTONIC`
alone on a real machine too. The engines an agent starts inherit the preload, like processes
of one host share its clock.

One caveat of libfaketime 0.9.10 with a real monotonic clock: `time.sleep` (an absolute
`clock_nanosleep`) fails with EINVAL in a faked process. No Motor process calls it (every
wait is an asyncio one); a process that did would show the traceback in its log.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

# Where Debian's `libfaketime` package puts the library (`apt-get install -y faketime libfaketime`).
LIBS = (
    Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"),
    Path("/usr/lib/faketime/libfaketime.so.1"),
)
SEEN_WITHIN = 1.0  # FAKETIME_CACHE_DURATION: a step is seen this soon
HOUR = 3600.0


def library() -> Path:
    """The preloadable libfaketime; fails saying how to install it."""
    for lib in LIBS:
        if lib.exists():
            return lib
    raise AssertionError(
        "Debian's libfaketime is needed to step a process's clock: apt-get install -y faketime libfaketime"
        " (`just test` installs it)"
    )


class SteppedClock:
    """The wall clock of the processes started with `env()`: `offset` seconds off the real one."""

    def __init__(self, path: Path, offset: float = 0.0) -> None:
        self.path = path
        self.lib = library()
        self.offset = offset
        self._write()

    def env(self) -> dict[str, str]:
        """What a process's environment needs for its clock to follow this one."""
        return {
            "LD_PRELOAD": str(self.lib),
            "FAKETIME_TIMESTAMP_FILE": str(self.path),
            "FAKETIME_CACHE_DURATION": str(int(SEEN_WITHIN)),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }

    async def step(self, offset: float) -> None:
        """Set the clock `offset` seconds off the real one; returns once the process sees it."""
        self.offset = offset
        self._write()
        await asyncio.sleep(SEEN_WITHIN + 0.2)

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{self.offset:+.0f}\n")
        tmp.replace(self.path)  # never a half-written offset read
