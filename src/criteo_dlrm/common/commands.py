"""The ``kedro run`` commands that messages suggest: the user's own command line with the fix merged in.

A suggestion that drops the user's arguments runs something else: ``kedro run
--params=ingestion.rows_per_day=1429`` after ``kedro run --params=ingestion.raw_dir=/data/kaggle`` trains on
the bundled sample, not the user's data. An error carries its fix as data (``common.errors.Fix``) and its
message shows the fix alone; ``cli.run`` records the invocation (``invoked``) and shows the message with each
fix merged into it (``Invocation.render``): the same pipelines (unless the fix names others), every ``--params``
(the fix's values replacing the user's for the same keys), every ``--load-versions`` and the ``--env``. Only the
adapters (the command line, the console's log lines) read the invocation; outside a ``kedro run`` (a notebook, a
test calling a node) a message keeps the fix alone.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from criteo_dlrm.common.errors import Fix, command


@dataclass(frozen=True)
class Invocation:
    """What the user typed: ``kedro run`` with these pipelines, parameters (dotted names), versions and env."""

    pipelines: tuple[str, ...] = ()
    params: dict[str, object] = field(default_factory=dict)
    load_versions: dict[str, str] = field(default_factory=dict)
    env: str | None = None

    def command(self, fix: Fix) -> str:
        """This command with ``fix`` merged in, as the user types it."""
        return command(fix, self.pipelines, self.params, self.load_versions, self.env)

    def render(self, message: str, fixes: Sequence[Fix]) -> str:
        """``message`` with each fix it shows alone (```kedro run ...```, in order) shown merged into this command."""
        parts, start = [], 0
        for fix in fixes:
            alone = f"`{fix}`"
            at = message.find(alone, start)
            if at >= 0:
                parts += [message[start:at], f"`{self.command(fix)}`"]
                start = at + len(alone)
        return "".join(parts) + message[start:]


_INVOCATION: contextvars.ContextVar[Invocation | None] = contextvars.ContextVar("kedro_run_invocation", default=None)


def current_invocation() -> Invocation:
    """The ``kedro run`` this process is serving; empty outside one."""
    return _INVOCATION.get() or Invocation()


def dotted(params: Mapping, prefix: str = "") -> dict[str, object]:
    """``{"training": {"seed": 3}}`` -> ``{"training.seed": 3}`` (lists stay values)."""
    flat: dict[str, object] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(dotted(value, f"{name}."))
        else:
            flat[name] = value
    return flat


@contextlib.contextmanager
def invoked(invocation: Invocation) -> Iterator[None]:
    """Within the block, messages are shown with their fixes merged into ``invocation``."""
    token = _INVOCATION.set(invocation)
    try:
        yield
    finally:
        _INVOCATION.reset(token)
