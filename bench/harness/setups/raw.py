"""A bare direct-io loop device over an image file, no filesystem: the
physical floor of fio's write + flush, through the same loop driver every
filesystem setup uses."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from harness import host
from harness.setups.base import fresh_sparse_file

if TYPE_CHECKING:
    from harness.context import RunContext


class RawLoop:
    """Context manager: the loop device exists inside `with` (as `dev`)."""

    def __init__(self, ctx: RunContext, size: int) -> None:
        self.ctx, self.size = ctx, size
        self.name = "raw-loop"
        self.image = ctx.image_path("raw-floor.img")
        self.dev = ""        # /dev/loopN while attached

    def __enter__(self) -> "RawLoop":
        self.ctx.track(self)
        try:
            fresh_sparse_file(self.image, self.size)
            self.dev = host.attach_loop(self.ctx.procs, self.image)
            self.ctx.note_dio(self.name, host.loop_dio(self.dev))
        except BaseException:
            self.teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.teardown()

    def teardown(self) -> None:
        if self.dev and not host.detach_loop(self.ctx.procs, self.dev):
            self.ctx.cleanup_failures.append(self.dev)
        else:
            self.dev = ""
            if os.path.exists(self.image):
                os.unlink(self.image)
        self.ctx.untrack(self)
