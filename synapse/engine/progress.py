"""Terminal progress: step, loss, throughput and time left, or nothing when disabled."""
from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, total_steps: int, start_step: int, enabled: bool = True):
        self._bar = (tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, file=sys.stderr,
                          leave=False) if enabled else None)
        self._shown = start_step

    def update(self, step: int, loss: float, images_per_s: float) -> None:
        if self._bar is None:
            return
        self._bar.update(step - self._shown)
        self._shown = step
        self._bar.set_postfix(loss=f"{loss:.4f}", img_s=f"{images_per_s:,.0f}", refresh=False)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
